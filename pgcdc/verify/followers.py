"""The followers as ``cdc verify`` reads them, and PostgreSQL's rows in their stored forms.

A row is compared in the form its follower holds it, made by the same code that writes it:

- the document: the jobs' :class:`spark_jobs.convert.RowConverter` of the Debezium ``after``
  image (:func:`document_converter`), as :mod:`spark_jobs.changes` makes a change's ``doc``;
- Redis (hash mode): each column's value as ``orjson.dumps`` text, as
  :class:`sinks.cache.CacheSink` writes its fields; JSON mode: the row as one JSON object;
- OpenSearch: ``orjson.dumps`` of the document, as :class:`sinks.search.SearchSink` sends
  ``_source``, compared as parsed JSON (the index keeps ``_source`` as sent).

The follower's rows are read back with the tools the demo and the tests use
(:func:`pgcdc.core.cache_hashes.every_hash`, :func:`pgcdc.core.search_documents.every_hit`,
through the search follower's own client: its TLS and credentials),
and a candidate key's row and version through the sinks' own key names.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import orjson
import redis
from opensearchpy.exceptions import NotFoundError

from pgcdc.core.cache_hashes import every_hash
from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB
from pgcdc.core.row_digest import (
    BUCKET_BITS,
    FIELD,
    Folds,
    bucket,
    canonical,
    digest,
    digest_of_canonical,
    fold_into,
    key_hash,
    split60,
)
from pgcdc.core.search_documents import every_hit
from pgcdc.verify import cache_fold
from pgcdc.verify.pacing import RowPacer, paced
from sinks.cache import CacheSink
from sinks.cache_script import parse_version
from sinks.search import SearchSink
from spark_jobs.convert import RowConverter, after_schema

Document = dict[str, Any]
# The digest of a follower's row key that holds no row of its kind (a string where a hash
# belongs): never a row's digest (60 bits), so it always differs.
NOT_A_ROW = -1


class DocumentConverter:
    """Debezium ``after`` JSON → the document the sinks are given, by the jobs' converter for
    the table's envelope schema."""

    __slots__ = ("_convert",)

    def __init__(self, envelope_schema_json: bytes) -> None:
        self._convert = RowConverter(after_schema(orjson.loads(envelope_schema_json)))

    def __call__(self, after_json: bytes) -> Document:
        doc, _ = self._convert(orjson.loads(after_json))
        return doc

    def from_after(self, after: Mapping[str, Any]) -> Document:
        """The document of an ``after`` already parsed (or one whose values are JSON's own:
        text, integers, booleans and nulls, which JSON gives back as they were)."""
        doc, _ = self._convert(after)
        return doc


def document_converter(envelope_schema_json: bytes) -> DocumentConverter:
    """The :class:`DocumentConverter` of a table's envelope schema."""
    return DocumentConverter(envelope_schema_json)


def _hash_form(fields: Mapping[str, bytes]) -> bytes:
    """A Redis hash (column → JSON text) as :func:`pgcdc.core.row_digest.canonical` gives
    the document it holds: fields sorted, each value as it is."""
    return b"{" + b",".join(orjson.dumps(c) + b":" + fields[c] for c in sorted(fields)) + b"}"


class CacheFollower:
    """The Redis follower (:class:`sinks.cache.CacheSink`'s layout)."""

    name = "cache"

    def __init__(
        self, sink: CacheSink, job: str = CACHE_JOB, pacer: RowPacer | None = None
    ) -> None:
        self.sink = sink
        self.job = job
        self.pacer = pacer  # verify.max_rows_per_second, over every read of a pass

    def watermark(self) -> int | None:
        return self.sink.read_watermark(self.job)

    def digest(self, key: str, doc: Mapping[str, Any]) -> int:
        return digest(key, doc)

    def stored_digest(self, key: str, raw: Any) -> int | None:
        """The digest of what Redis answered for a row key (None: no row)."""
        if not raw:
            return None
        if self.sink.value_mode == "hash":
            return digest_of_canonical(key, _hash_form({_text(c): v for c, v in raw.items()}))
        return digest_of_canonical(key, canonical(orjson.loads(raw)))

    def _rows(self, table: str) -> Iterator[tuple[str, Any]]:
        prefix = f"{self.sink.key_prefix}:{table}:"
        client = self.sink.client
        if self.sink.value_mode == "hash":
            for k, fields in every_hash(client, cache_fold.glob(prefix) + "*"):
                yield _text(k)[len(prefix) :], fields
            return
        keys = [_text(k) for k in client.scan_iter(match=cache_fold.glob(prefix) + "*", count=5000)]
        for start in range(0, len(keys), 1000):
            part = keys[start : start + 1000]
            yield from ((k[len(prefix) :], v) for k, v in zip(part, client.mget(part), strict=True))

    def digests(self, table: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, raw in paced(self._rows(table), self.pacer):
            digest = self.stored_digest(key, raw)
            if digest is not None:
                out[key] = digest
        return out

    def can_fold(self, table: str) -> bool:
        """Whether Redis folds ``table`` itself (:mod:`.cache_fold`): hash mode, one
        standalone server (a cluster's script sees only the keys it is given)."""
        return self.sink.value_mode == "hash" and isinstance(self.sink.client, redis.Redis)

    def fold(self, table: str, names: Sequence[str]) -> Folds:
        prefix = f"{self.sink.key_prefix}:{table}:"
        took = self.pacer.take if self.pacer is not None else None
        return cache_fold.fold(self.sink.client, prefix, names, took)

    def bucket_digests(
        self, table: str, names: Sequence[str], buckets: frozenset[int]
    ) -> dict[str, int]:
        prefix = f"{self.sink.key_prefix}:{table}:"
        took = self.pacer.take if self.pacer is not None else None
        return cache_fold.rows(self.sink.client, prefix, names, buckets, took)

    def read(self, table: str, keys: Collection[str]) -> dict[str, tuple[int | None, int | None]]:
        pipe = self.sink.client.pipeline(transaction=False)
        ordered = sorted(keys)
        if self.pacer is not None:
            self.pacer.take(len(ordered))
        for key in ordered:
            row_key = _raw(self.sink.row_key(table, key))
            pipe.hgetall(row_key) if self.sink.value_mode == "hash" else pipe.get(row_key)
            pipe.get(_raw(self.sink.version_key(table, key)))
        # A row key of another type (someone's SET) answers WRONGTYPE: a row that differs.
        answers = pipe.execute(raise_on_error=False)
        out: dict[str, tuple[int | None, int | None]] = {}
        for i, key in enumerate(ordered):
            raw, version = answers[2 * i], answers[2 * i + 1]
            held = parse_version(version).commit_lsn if isinstance(version, bytes) else None
            if isinstance(raw, redis.ResponseError):
                out[key] = (NOT_A_ROW, held)
                continue
            out[key] = (self.stored_digest(key, raw), held)
        return out


class SearchFollower:
    """The OpenSearch follower (:class:`sinks.search.SearchSink`'s indices)."""

    name = "search"

    def __init__(
        self,
        sink: SearchSink,
        job: str = SEARCH_JOB,
        pacer: RowPacer | None = None,
    ) -> None:
        self.sink = sink
        self.job = job
        self.pacer = pacer  # verify.max_rows_per_second, over every read of a pass

    def watermark(self) -> int | None:
        return self.sink.read_watermark(self.job)

    def digest(self, key: str, doc: Mapping[str, Any]) -> int:
        return digest(key, doc)

    def digests(self, table: str) -> dict[str, int]:
        index = self.sink.index_for(table)
        return {
            h["_id"]: digest_of_canonical(h["_id"], canonical(h["_source"]))
            for h in paced(every_hit(self.sink.client, index, page=5000), self.pacer)
        }

    def can_fold(self, table: str) -> bool:
        """Whether ``table``'s index keeps each document's digest beside it, out of
        ``_source`` (the follower makes its indices so: :mod:`pgcdc.core.row_digest`)."""
        try:
            got = self.sink.client.indices.get_mapping(index=self.sink.index_for(table))
        except NotFoundError:
            return True  # no index: it folds to nothing, and every row is missing
        return all(
            FIELD in (body.get("mappings", {}).get("_source") or {}).get("excludes", ())
            for body in got.values()
        )

    def _search(self, index: str, body: dict[str, Any]) -> Any:
        return self.sink.client.search(index=index, body=body, params={"request_cache": "false"})

    def fold(self, table: str, names: Sequence[str]) -> Folds:
        """Every document folded by bucket: a ``sum`` aggregation of the kept digests'
        parts per key-hash bucket inside OpenSearch, and the documents that keep none
        (written by someone else, or by an older follower) read back and folded here."""
        index = self.sink.index_for(table)
        try:
            self.sink.client.indices.refresh(index=index)
        except NotFoundError:
            return {}
        parts = {p: {"sum": {"field": f"{FIELD}.{p}"}} for p in ("h1", "h2", "h3")}
        body = {
            "size": 0,
            "query": {"exists": {"field": f"{FIELD}.b"}},
            "aggs": {
                "b": {
                    "histogram": {
                        "field": f"{FIELD}.b",
                        "interval": 1 << (32 - BUCKET_BITS),
                        "min_doc_count": 1,
                    },
                    "aggs": parts,
                }
            },
        }
        got = self._search(index, body)
        out: Folds = {}
        shift = 32 - BUCKET_BITS
        for b in got["aggregations"]["b"]["buckets"]:
            out[int(b["key"]) >> shift] = [
                int(b["doc_count"]),
                *(int(b[p]["value"]) for p in ("h1", "h2", "h3")),
            ]
        if self.pacer is not None:
            self.pacer.take(sum(f[0] for f in out.values()))
        for key, d in self._unkept(index).items():
            fold_into(out, bucket(key_hash(key)), *split60(d))
        return out

    def _unkept(self, index: str, buckets: frozenset[int] | None = None) -> dict[str, int]:
        """The documents that keep no digest (in ``buckets`` if given), read back: id →
        digest of their ``_source``."""
        query = {"bool": {"must_not": {"exists": {"field": f"{FIELD}.b"}}}}
        out: dict[str, int] = {}
        hits = every_hit(self.sink.client, index, page=5000, query=query)
        for h in paced(hits, self.pacer):
            key = h["_id"]
            if buckets is None or bucket(key_hash(key)) in buckets:
                out[key] = digest_of_canonical(key, canonical(h["_source"]))
        return out

    def bucket_digests(
        self, table: str, names: Sequence[str], buckets: frozenset[int]
    ) -> dict[str, int]:
        """Each document in ``buckets`` and its digest: the kept parts (doc values, no
        ``_source``), and the documents that keep none read back."""
        index = self.sink.index_for(table)
        shift = 32 - BUCKET_BITS
        ranges: list[list[int]] = []
        for b in sorted(buckets):
            if ranges and ranges[-1][1] == b << shift:
                ranges[-1][1] = (b + 1) << shift
            else:
                ranges.append([b << shift, (b + 1) << shift])
        out: dict[str, int] = {}
        fields = [f"{FIELD}.{p}" for p in ("h1", "h2", "h3")]
        for start in range(0, len(ranges), 500):  # under indices.query.bool.max_clause_count
            part = ranges[start : start + 500]
            query = {
                "bool": {
                    "filter": {
                        "bool": {
                            "should": [
                                {"range": {f"{FIELD}.b": {"gte": lo, "lt": hi}}} for lo, hi in part
                            ],
                            "minimum_should_match": 1,
                        }
                    }
                }
            }
            extra = {"_source": False, "docvalue_fields": fields}
            for h in paced(
                every_hit(self.sink.client, index, page=5000, query=query, extra=extra),
                self.pacer,
            ):
                v = h.get("fields", {})
                h1, h2, h3 = (int(v[f][0]) for f in fields)
                out[h["_id"]] = (h1 << 40) | (h2 << 20) | h3
        out.update(self._unkept(index, buckets))
        return out

    def read(self, table: str, keys: Collection[str]) -> dict[str, tuple[int | None, int | None]]:
        index = self.sink.index_for(table)
        ordered = sorted(keys)
        if self.pacer is not None:
            self.pacer.take(len(ordered))
        try:
            got = self.sink.client.mget(
                index=index, body={"ids": ordered}, params={"realtime": "true"}
            )["docs"]
        except NotFoundError:  # the index itself is gone
            return dict.fromkeys(ordered, (None, None))
        out: dict[str, tuple[int | None, int | None]] = {}
        for doc in got:
            key = doc["_id"]
            if doc.get("found"):
                out[key] = (
                    digest_of_canonical(key, canonical(doc["_source"])),
                    int(doc["_version"]),
                )
            else:
                out[key] = (None, None)
        return out


# Removes a row only if its version key still holds what was read (nothing written since);
# the version key stays, so an older change still cannot bring the row back.
_REMOVE_IF_UNCHANGED = """
local held = redis.call('GET', KEYS[2])
if held == false then held = '' end
if held ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""


class CacheRemoval:
    """``--remove-extra`` on the Redis follower: compare-and-delete of row keys."""

    def __init__(self, follower: CacheFollower) -> None:
        self.sink = follower.sink

    def held(self, table: str, keys: Collection[str]) -> dict[str, tuple[int | None, Any]]:
        """Each key's held version (its commit LSN, None: none) and the token that
        :meth:`remove_if` compares (the version key's bytes; empty: none); keys whose row is
        gone are left out."""
        ordered = sorted(keys)
        pipe = self.sink.client.pipeline(transaction=False)
        for key in ordered:
            pipe.exists(_raw(self.sink.row_key(table, key)))
            pipe.get(_raw(self.sink.version_key(table, key)))
        answers = pipe.execute()
        out: dict[str, tuple[int | None, Any]] = {}
        for i, key in enumerate(ordered):
            exists, raw = answers[2 * i], answers[2 * i + 1]
            if exists:
                held = parse_version(raw).commit_lsn if raw is not None else None
                out[key] = (held, raw or b"")
        return out

    def remove_if(self, table: str, key: str, token: Any) -> bool:
        row_key = _raw(self.sink.row_key(table, key))
        version_key = _raw(self.sink.version_key(table, key))
        return bool(self.sink.client.eval(_REMOVE_IF_UNCHANGED, 2, row_key, version_key, token))


class SearchRemoval:
    """``--remove-extra`` on the OpenSearch follower: deletes conditional on the document's
    sequence number and primary term (``if_seq_no``), so a write since wins."""

    def __init__(self, follower: SearchFollower) -> None:
        self.sink = follower.sink

    def held(self, table: str, keys: Collection[str]) -> dict[str, tuple[int | None, Any]]:
        index = self.sink.index_for(table)
        try:
            got = self.sink.client.mget(
                index=index,
                body={"ids": sorted(keys)},
                params={"realtime": "true", "_source": "false"},
            )["docs"]
        except NotFoundError:
            return {}
        return {
            d["_id"]: (int(d["_version"]), (d["_index"], d["_seq_no"], d["_primary_term"]))
            for d in got
            if d.get("found")
        }

    def remove_if(self, table: str, key: str, token: Any) -> bool:
        index, seq_no, term = token
        try:
            answer = self.sink.client.delete(
                index=index,
                id=key,
                params={"if_seq_no": str(seq_no), "if_primary_term": str(term), "ignore": 409},
            )
        except NotFoundError:  # gone since: nothing to remove
            return False
        return bool(answer.get("result") == "deleted")


def _raw(key: str) -> bytes:
    """A Redis key as bytes; an id read from Redis that is no UTF-8 keeps its bytes."""
    return key.encode(errors="surrogateescape")


def _text(b: bytes | str) -> str:
    return b.decode() if isinstance(b, bytes) else b
