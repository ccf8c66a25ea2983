"""``cdc verify``'s folds inside the real stores equal the folds of the rows written, and
tell every kind of drift (:mod:`pgcdc.verify.cache_fold`, the search follower's kept digests).

Rows are written by the followers' own writers (:class:`sinks.cache.CacheSink`,
:class:`sinks.search.SearchSink`); the expected folds are those of the documents, by
:mod:`pgcdc.core.row_digest`, as PostgreSQL's side folds its rendered rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pytest
import redis

from pgcdc.core import native
from pgcdc.core.row_digest import (
    FIELD,
    bucket,
    digest,
    fold_docs,
    folded_text,
    key_hash,
    stored,
)
from pgcdc.verify import cache_fold
from pgcdc.verify.followers import CacheFollower, SearchFollower
from sinks.base import Change
from sinks.cache import CacheSink
from sinks.search import SearchSink
from tests.conftest import Endpoints

pytestmark = pytest.mark.integration

T = "public.items"
Doc = Mapping[str, Any]


def _docs(n: int) -> dict[str, dict[str, Any]]:
    """Rows with the value kinds a document holds: text, exact decimal text, a list, an
    object (its own key order), null, a brace in a string, a non-ASCII column."""
    return {
        str(i): {
            "id": i,
            "name": f"item {i} {{x}}",
            "price": f"{i}.50",
            "tags": ["a", str(i)],
            "attrs": {"z": i, "a": None},
            "note": None,
            "größe": i * 1.5,
        }
        for i in range(n)
    }


def _differing(a: Mapping[int, list[int]], b: Mapping[int, list[int]]) -> frozenset[int]:
    return frozenset(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


@pytest.fixture
def cache(endpoints: Endpoints, key_prefix: str) -> Iterator[CacheFollower]:
    sink = CacheSink(endpoints.redis_url, key_prefix, value_mode="hash")
    yield CacheFollower(sink)
    sink.close()


@pytest.mark.parametrize("native_module", ["on", "off"])
def test_redis_folds_what_the_sink_wrote_and_tells_each_drift(
    cache: CacheFollower,
    endpoints: Endpoints,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    native_module: str,
) -> None:
    """The same, whether the native module's pipelined ``HGETALL`` folds (``on``) or the
    Lua script does (``off``)."""
    monkeypatch.setenv("PGCDC_NATIVE", native_module)
    if native_module == "on" and native.module() is None:
        pytest.skip("pgcdc_native is not installed (make install builds it where cargo is)")
    passes: list[bool] = []
    pass_of = cache_fold._native_pass
    monkeypatch.setattr(cache_fold, "_native_pass", lambda *a: passes.append(True) or pass_of(*a))
    docs = _docs(3_000)
    cache.sink.apply([Change(T, k, 100, 0, d) for k, d in docs.items()])
    names = sorted(docs["0"])
    assert cache.can_fold(T)
    assert cache.fold(T, names) == fold_docs(docs)
    assert bool(passes) == (native_module == "on")  # the path asked for was taken
    if native_module == "on":  # a client that speaks RESP3 (HGETALL answers maps)
        resp3 = redis.Redis.from_url(endpoints.redis_url, protocol=3)
        try:
            assert cache_fold.fold(resp3, f"{key_prefix}:{T}:", names) == fold_docs(docs)
        finally:
            resp3.close()
    # Drift of each kind, by another client.
    raw = redis.Redis.from_url(endpoints.redis_url)
    row = f"{key_prefix}:{T}:"
    raw.hset(row + "1", "name", orjson.dumps("by hand"))  # a field changed
    raw.hset(row + "2", "extra", b"1")  # a field too many
    raw.hdel(row + "3", "note")  # a field missing
    raw.delete(row + "4")  # a row missing
    raw.set(row + "5", b"not a hash")  # a row of another type
    raw.hset(row + "stray", mapping={"id": b"-1"})  # a row too many
    raw.hset(row.encode() + b"\xff\xfe", mapping={"id": b"-2"})  # and one whose id is no UTF-8
    raw.close()
    held = cache.fold(T, names)
    wrong = ["1", "2", "3", "4", "5", "stray"]
    expected = fold_docs(docs)
    differ = _differing(expected, held)
    odd = b"\xff\xfe".decode(errors="surrogateescape")
    assert differ == {bucket(key_hash(k)) for k in wrong} | {folded_text(b"\xff\xfe", b"")[0]}
    wrong.append(odd)
    got = cache.bucket_digests(T, names, differ)
    want = {k: digest(k, d) for k, d in docs.items() if bucket(key_hash(k)) in differ}
    assert {k for k in got.keys() | want.keys() if got.get(k) != want.get(k)} == set(wrong)
    # What a row-by-row read of the same keys says (the re-checks' way) agrees.
    read = cache.read(T, wrong)
    assert all(read[k][0] != want.get(k) for k in wrong)
    same = cache.read(T, ["0", "6"])
    assert all(same[k][0] == digest(k, docs[k]) for k in same)


@pytest.fixture
def search(endpoints: Endpoints, index_prefix: str) -> Iterator[SearchFollower]:
    sink = SearchSink(endpoints.search_url, index_prefix)
    yield SearchFollower(sink)
    sink.close()


def test_opensearch_folds_what_the_sink_wrote_and_tells_each_drift(
    search: SearchFollower,
) -> None:
    docs = _docs(3_000)
    search.sink.apply([Change(T, k, 100, 0, d) for k, d in docs.items()])
    names = sorted(docs["0"])
    assert search.can_fold(T)
    assert search.fold(T, names) == fold_docs(docs)
    index = search.sink.index_for(T)
    client = search.sink.client
    # Drift of each kind, by another writer (none of which keeps a digest).
    client.update(index=index, id="1", body={"doc": {"name": "by hand"}})  # changed
    client.update(index=index, id="2", body={"doc": {"note": None}})  # rewritten, equal
    client.index(index=index, id="stray", body={"id": -1})  # a document too many
    client.delete(index=index, id="4")  # a document missing
    # A document restored from an older state: its own kept digest, of its older row.
    older = {**docs["5"], "price": "0.01"}
    search.sink.apply([Change(T, "5", 50, 0, older)])  # stale: refused by the version
    client.index(
        index=index,
        id="5",
        body={**older, FIELD: stored("5", older)},
        params={"version": "100", "version_type": "external_gte"},
    )
    held = search.fold(T, names)
    expected = fold_docs(docs)
    differ = _differing(expected, held)
    wrong = ["1", "stray", "4", "5"]
    assert differ == {bucket(key_hash(k)) for k in wrong}
    got = search.bucket_digests(T, names, differ)
    want = {k: digest(k, d) for k, d in docs.items() if bucket(key_hash(k)) in differ}
    assert {k for k in got.keys() | want.keys() if got.get(k) != want.get(k)} == set(wrong)
    # A dropped index folds to nothing: every row is missing.
    client.indices.delete(index=index)
    assert search.can_fold(T) and search.fold(T, names) == {}
