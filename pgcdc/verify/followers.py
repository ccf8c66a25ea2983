"""The followers as ``cdc verify`` reads them, and PostgreSQL's rows in their stored forms.

A row is compared in the form its follower holds it, made by the same code that writes it:

- the document: the jobs' :class:`spark_jobs.convert.RowConverter` of the Debezium ``after``
  image (:func:`document_converter`), as :mod:`spark_jobs.changes` makes a change's ``doc``;
- Redis (hash mode): each column's value as ``orjson.dumps`` text, as
  :class:`sinks.cache.CacheSink` writes its fields; JSON mode: the row as one JSON object;
- OpenSearch: ``orjson.dumps`` of the document, as :class:`sinks.search.SearchSink` sends
  ``_source``, compared as parsed JSON (the index keeps ``_source`` as sent).

The follower's rows are read back with the tools the demo and the tests use
(:func:`pgcdc.core.cache_hashes.every_hash`, :func:`pgcdc.core.search_documents.every_document`),
and a candidate key's row and version through the sinks' own key names.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import orjson
from opensearchpy.exceptions import NotFoundError

from pgcdc.core.cache_hashes import every_hash
from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB
from pgcdc.core.search_documents import every_document
from pgcdc.verify.fold import row_digest
from pgcdc.verify.pacing import RowPacer, paced
from sinks.cache import CacheSink
from sinks.cache_script import parse_version
from sinks.search import SearchSink
from spark_jobs.convert import RowConverter, after_schema

Document = dict[str, Any]


def document_converter(envelope_schema_json: bytes) -> Callable[[bytes], Document]:
    """Debezium ``after`` JSON → the document the sinks are given, by the jobs' converter for
    the table's envelope schema."""
    convert = RowConverter(after_schema(orjson.loads(envelope_schema_json)))

    def to_doc(after_json: bytes) -> Document:
        doc, _ = convert(orjson.loads(after_json))
        return doc

    return to_doc


def _glob(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _hash_form(fields: Mapping[str, bytes]) -> bytes:
    """A Redis hash (column → JSON text) as one byte string, column order aside."""
    return orjson.dumps(sorted((c, v.decode()) for c, v in fields.items()))


def _json_form(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


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
        if self.sink.value_mode == "hash":
            return row_digest(key, _hash_form({c: orjson.dumps(v) for c, v in doc.items()}))
        return row_digest(key, _json_form(orjson.loads(orjson.dumps(doc))))

    def stored_digest(self, key: str, raw: Any) -> int | None:
        """The digest of what Redis answered for a row key (None: no row)."""
        if not raw:
            return None
        if self.sink.value_mode == "hash":
            return row_digest(key, _hash_form({_text(c): v for c, v in raw.items()}))
        return row_digest(key, _json_form(orjson.loads(raw)))

    def _rows(self, table: str) -> Iterator[tuple[str, Any]]:
        prefix = f"{self.sink.key_prefix}:{table}:"
        client = self.sink.client
        if self.sink.value_mode == "hash":
            for k, fields in every_hash(client, _glob(prefix) + "*"):
                yield _text(k)[len(prefix) :], fields
            return
        keys = [_text(k) for k in client.scan_iter(match=_glob(prefix) + "*", count=5000)]
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

    def read(self, table: str, keys: Collection[str]) -> dict[str, tuple[int | None, int | None]]:
        pipe = self.sink.client.pipeline(transaction=False)
        ordered = sorted(keys)
        if self.pacer is not None:
            self.pacer.take(len(ordered))
        for key in ordered:
            row_key = self.sink.row_key(table, key)
            pipe.hgetall(row_key) if self.sink.value_mode == "hash" else pipe.get(row_key)
            pipe.get(self.sink.version_key(table, key))
        answers = pipe.execute()
        out: dict[str, tuple[int | None, int | None]] = {}
        for i, key in enumerate(ordered):
            raw, version = answers[2 * i], answers[2 * i + 1]
            held = parse_version(version).commit_lsn if version is not None else None
            out[key] = (self.stored_digest(key, raw), held)
        return out


class SearchFollower:
    """The OpenSearch follower (:class:`sinks.search.SearchSink`'s indices)."""

    name = "search"

    def __init__(
        self,
        sink: SearchSink,
        search_url: str,
        job: str = SEARCH_JOB,
        pacer: RowPacer | None = None,
    ) -> None:
        self.sink = sink
        self.search_url = search_url
        self.job = job
        self.pacer = pacer  # verify.max_rows_per_second, over every read of a pass

    def watermark(self) -> int | None:
        return self.sink.read_watermark(self.job)

    def digest(self, key: str, doc: Mapping[str, Any]) -> int:
        # What the sink sends (orjson.dumps) read back as the index returns it.
        return row_digest(key, _json_form(orjson.loads(orjson.dumps(doc))))

    def digests(self, table: str) -> dict[str, int]:
        index = self.sink.index_for(table)
        return {
            h["_id"]: row_digest(h["_id"], _json_form(h["_source"]))
            for h in paced(every_document(self.search_url, index, page=5000), self.pacer)
        }

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
                out[key] = (row_digest(key, _json_form(doc["_source"])), int(doc["_version"]))
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
            pipe.exists(self.sink.row_key(table, key))
            pipe.get(self.sink.version_key(table, key))
        answers = pipe.execute()
        out: dict[str, tuple[int | None, Any]] = {}
        for i, key in enumerate(ordered):
            exists, raw = answers[2 * i], answers[2 * i + 1]
            if exists:
                held = parse_version(raw).commit_lsn if raw is not None else None
                out[key] = (held, raw or b"")
        return out

    def remove_if(self, table: str, key: str, token: Any) -> bool:
        row_key, version_key = self.sink.row_key(table, key), self.sink.version_key(table, key)
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


def _text(b: bytes | str) -> str:
    return b.decode() if isinstance(b, bytes) else b
