"""Bulk requests are sized by bytes, and a 413 is split, not fatal (the request building
of the search sink, with a client standing in for the transport: no server here; the real
server's 413 is OpenSearch's http.max_content_length check, which this client imitates)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from opensearchpy.exceptions import TransportError

from sinks.base import Change, Outcome, chunks_by_bytes
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
