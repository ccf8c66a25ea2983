"""Bulk requests are sized by bytes, and a 413 is split, not fatal (the request building
of the search sink, with a client standing in for the transport: no server here; the real
server's 413 is OpenSearch's http.max_content_length check, which this client imitates)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opensearchpy.exceptions import TransportError

from pgcdc.core import native, row_digest
from sinks.base import Change, OnePerKey, Outcome, chunks_by_bytes
from sinks.cache import hash_fields
from sinks.search import SearchSink

pytestmark = pytest.mark.unit


class LimitedServer:
    """Answers bulk bodies up to ``limit`` bytes as applied, larger ones with 413."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bodies: list[int] = []
        self.refused: list[int] = []

    def bulk(self, body: bytes, params: dict[str, str]) -> dict[str, Any]:
        if len(body) > self.limit:
            self.refused.append(len(body))
            raise TransportError(413, "request_entity_too_large", "")
        self.bodies.append(len(body))
        lines = body.splitlines()
        items = []
        i = 0
        while i < len(lines):
            kind = next(iter(orjson.loads(lines[i])))
            items.append({kind: {"status": 201 if kind == "index" else 200}})
            i += 2 if kind == "index" else 1
        return {"items": items}


def _sink(server: LimitedServer, bulk_max_bytes: int) -> SearchSink:
    sink = SearchSink(
        "http://127.0.0.1:1",
        "t",
        client=server,
        bulk_max_bytes=bulk_max_bytes,  # type: ignore[arg-type]
        sleep=lambda _s: None,
    )
    sink._ready.add(sink.index_for("public.items"))
    sink._digests[sink.index_for("public.items")] = True  # as an index the sink made
    return sink


def _changes(n: int, size: int) -> list[Change]:
    return [
        Change("public.items", str(i), 100 + i, 0, {"id": i, "body": "x" * size}) for i in range(n)
    ]


def test_chunks_by_bytes_keeps_order_and_the_cap() -> None:
    runs = list(chunks_by_bytes([3, 3, 3, 9, 1, 1], lambda n: n, 6))
    assert runs == [[3, 3], [3], [9], [1, 1]]
    assert [x for r in runs for x in r] == [3, 3, 3, 9, 1, 1]


def test_requests_stay_under_the_byte_cap() -> None:
    server = LimitedServer(limit=10**9)
    results = _sink(server, bulk_max_bytes=50_000).apply(_changes(40, 5_000))
    assert all(r.outcome is Outcome.APPLIED for r in results)
    assert len(server.bodies) > 1 and max(server.bodies) <= 50_000
    assert not server.refused


def test_a_413_is_split_until_the_server_takes_it() -> None:
    # The cap is above what the server takes: it answers 413, the sink halves and resends.
    server = LimitedServer(limit=30_000)
    results = _sink(server, bulk_max_bytes=200_000).apply(_changes(30, 5_000))
    assert server.refused, "the 413 path was not taken"
    assert all(r.outcome is Outcome.APPLIED for r in results)
    assert max(server.bodies) <= 30_000


def test_a_document_too_large_alone_is_refused_for_good_and_the_rest_applied() -> None:
    server = LimitedServer(limit=30_000)
    changes = [*_changes(4, 1_000), Change("public.items", "big", 900, 0, {"body": "y" * 60_000})]
    results = _sink(server, bulk_max_bytes=200_000).apply(changes)
    assert [r.outcome for r in results[:4]] == [Outcome.APPLIED] * 4
    big = results[4]
    assert big.outcome is Outcome.FAILED and not big.retryable
    assert big.reason is not None and "413" in big.reason


def _rendered(key: str, lsn: int, doc: dict[str, Any] | None) -> Change:
    """A change as the native path makes it: its document rendered with it."""
    if doc is None:
        return Change("public.items", key, lsn, 0, None)
    digest = orjson.dumps(row_digest.stored(key, doc))
    rendered = (orjson.dumps(doc), hash_fields(doc), digest)
    return Change("public.items", key, lsn, 0, doc, split=True, rendered=rendered)


# Ids with every byte JSON escapes, quotes, backslashes, non-ASCII and format characters.
KEYS = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12)


@given(
    st.lists(
        st.tuples(KEYS, st.integers(0, 2**63 - 1), st.booleans(), st.integers(0, 300)),
        min_size=1,
        max_size=30,
        unique_by=lambda t: t[0],
    ),
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_rendered_bodies_are_the_python_twins(
    rows: list[tuple[str, int, bool, int]], keeps: bool, aliased: bool
) -> None:
    """The native module's bulk bodies of a rendered batch are its Python twin's, byte for
    byte (the same lines the general way writes: tests/integration/test_sinks_search.py):
    ids of any text, deletes, empty documents, the digest kept or not, write aliases, and
    bodies cut by their bytes."""
    sink = _sink(LimitedServer(10**9), 2_000)
    index = "t-a%s" if aliased else "t%d"
    if aliased:
        sink._aliased.add(index)
    sink._digests[index] = keeps
    changes = OnePerKey(
        _rendered(k, lsn, None if gone else ({"b": "x" * n} if n % 7 else {}))
        for k, lsn, gone, n in rows
    )
    twin = sink._python_bodies(changes, "public.items", index, keeps)
    assert twin is not None
    assert b"".join(twin).count(b"\n") == sum(1 if gone else 2 for _, _, gone, _ in rows)
    if native.module() is None:
        pytest.skip("the native module is not built")
    assert sink._rendered_bodies(changes, "public.items", index) == twin


@pytest.mark.parametrize(
    "change",
    [
        Change("public.items", "1", 10, 0, {"id": 1}),  # not rendered
        Change("public.other", "1", 10, 0, None),  # another table
        Change("public.items", "", 10, 0, None),  # no id
        Change("public.items", "é" * 257, 10, 0, None),  # an id over 512 bytes
        Change("public.items", "\ud800", 10, 0, None),  # no UTF-8 form
        Change("public.items", "1", 2**63, 0, None),  # past OpenSearch's versions
        Change("public.items", "1", 10, 0, {"id": 1}, frozenset({"b"}), rendered=(b"{}", b"", b"")),
    ],
)
def test_any_other_batch_gets_no_rendered_body(change: Change) -> None:
    sink = _sink(LimitedServer(10**9), 2_000)
    index = sink.index_for("public.items")
    batch = OnePerKey([_rendered("0", 10, {"id": 0}), change])
    assert sink._python_bodies(batch, "public.items", index, True) is None
    assert sink._rendered_bodies(batch, "public.items", index) is None
