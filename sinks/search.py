"""The OpenSearch follower's writer.

Every write carries ``Change.version`` as an external version, so the index itself rejects
stale writes: a replayed or reordered change can never overwrite a newer one. Deletes carry
the version too and leave a tombstone that OpenSearch remembers for ``index.gc_deletes``
(see :mod:`sinks.search_index`).

Unchanged TOAST columns: OpenSearch's partial ``update`` does not take an external version,
so a change that leaves columns untouched is written as a whole document: the sink reads the
held document (a realtime get, with its version), copies the held values of those columns
into the new one and indexes it with the new external version. If the held document is
already at this version or newer the change is stale and skipped. If there is no held
document the columns are left out (never the placeholder) and the result says so.

Race: a concurrent write to the same key between the read and the write is caught by the
version check only if it is newer than ours. An older-than-ours, newer-than-held write
slipping in between would have its values for the unchanged columns replaced by the held
ones. The pipeline rules that out by design: a key lives in one Kafka partition, which one
task at a time applies, in order.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import orjson
from opensearchpy import OpenSearch
from opensearchpy.exceptions import TransportError

from pgcdc.core.contract import search_watermark_index
from pgcdc.core.errors import RetryableSinkError, SinkError
from pgcdc.core.settings import SearchSettings
from sinks.base import (
    APPLIED,
    FAILED,
    SKIPPED,
    ApplyResult,
    Change,
    reduce_batch,
    split_unchanged,
)
from sinks.search_index import (
    DEFAULT_GC_DELETES,
    check_index_prefix,
    dynamic_mapping,
    index_name,
    index_settings,
    mapping_from_connect_schema,
)

__all__ = ["SearchSink", "mapping_from_connect_schema"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_MAX_ID_BYTES: Final = 512
_MAX_LONG: Final = (1 << 63) - 1
_WATERMARK_MAPPING: Final[dict[str, Any]] = {
    "dynamic": False,
    "properties": {
        "job": {"type": "keyword"},
        "lsn": {"type": "long"},
        "updated_at_ms": {"type": "date", "format": "epoch_millis"},
    },
}


def _retryable_status(status: object) -> bool:
    # Connection errors carry the status "N/A": worth retrying like 429 and 5xx.
    return not isinstance(status, int) or status == 429 or status >= 500


_RETRY: Final = "retry"
_MGET_CHUNK: Final = 500


@dataclass(slots=True)
class _Op:
    """One bulk action waiting to be sent, and the input index it answers for."""

    slot: int  # index into the input batch
    action: bytes  # the bulk action line and, for index, the source line
    note: str | None = None  # reported with an applied outcome
    last_error: str | None = None  # why the last attempt was refused, if it was


class SearchSink:
    """Applies changes to one OpenSearch index per table, with external versions.

    ``refresh=True`` makes each bulk request wait until its writes are searchable (slow;
    tests poll search with a deadline instead). Retries use exponential backoff with jitter:
    ``max_attempts`` tries per request, starting at ``backoff_s`` and capped at
    ``max_backoff_s``.
    """

    def __init__(
        self,
        url: str,
        index_prefix: str,
        *,
        refresh: bool = False,
        gc_deletes: str = DEFAULT_GC_DELETES,
        timeout_s: float = 30.0,
        max_attempts: int = 6,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        schemas: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        client: OpenSearch | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        check_index_prefix(index_prefix)
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.index_prefix = index_prefix
        self.refresh = refresh
        self.gc_deletes = gc_deletes
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self._sleep = sleep
        # Our own backoff replaces the client's fixed-interval retries.
        self.client = client or OpenSearch(hosts=[url], timeout=timeout_s, max_retries=0)
        self._schemas: dict[str, list[Mapping[str, Any]]] = {
            t: list(f) for t, f in (schemas or {}).items()
        }
        self._ready: set[str] = set()

    @classmethod
    def from_settings(cls, settings: SearchSettings, **kwargs: Any) -> SearchSink:
        """A sink for the ``search`` section of the settings."""
        return cls(settings.url.get_secret_value(), settings.index_prefix, **kwargs)

    # -- indices -------------------------------------------------------------------------

    def index_for(self, table: str) -> str:
        """The index name of ``table`` (``schema.table``)."""
        return index_name(self.index_prefix, table)

    @property
    def watermark_index(self) -> str:
        return search_watermark_index(self.index_prefix)

    def register_schema(self, table: str, fields: Sequence[Mapping[str, Any]]) -> None:
        """Use these Connect fields (the row struct's) to map ``table``'s index when this
        sink creates it. An index that already exists keeps its mapping."""
        self._schemas[table] = list(fields)

    def ensure_index(self, table: str) -> str:
        """Create ``table``'s index unless it exists; return its name.

        The mapping comes from the registered Connect schema, or is dynamic if none is known.
        """
        name = self.index_for(table)
        if name not in self._ready:
            fields = self._schemas.get(table)
            mapping = mapping_from_connect_schema(fields) if fields else dynamic_mapping()
            self._create_index(name, mapping)
        return name

    def _create_index(self, name: str, mapping: Mapping[str, Any]) -> None:
        body = {"settings": index_settings(self.gc_deletes), "mappings": mapping}

        def create() -> None:
            if not self.client.indices.exists(index=name):
                try:
                    self.client.indices.create(index=name, body=body)
                    log.info("created index", extra={"index": name})
                except TransportError as e:
                    # Another writer created it first.
                    if _error_type(e) != "resource_already_exists_exception":
                        raise
            # A new index (maybe created by a writer that was killed a moment ago) answers
            # reads only once its shard is started: wait for that instead of failing reads.
            deadline = time.monotonic() + self.timeout_s
            while self.client.cluster.health(index=name).get("status") not in ("yellow", "green"):
                if time.monotonic() >= deadline:
                    raise TransportError(503, "index_not_ready", f"{name} has no started shard")
                self._sleep(0.2)

        self._with_retries(f"create index {name}", create)
        self._ready.add(name)

    def refresh_indices(self, *tables: str) -> None:
        """Make everything written so far searchable (all of this sink's indices if none)."""
        names = [self.index_for(t) for t in tables] or [f"{self.index_prefix}-*".lower()]
        self._with_retries("refresh", lambda: self.client.indices.refresh(index=",".join(names)))

    # -- apply ---------------------------------------------------------------------------

    def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
        """Apply a batch; one result per change, in the order given.

        Stale writes are ``skipped``. Documents OpenSearch refuses (mapping conflicts and
        other 4xx), and changes that cannot be written at all (an id over 512 bytes, a
        table name that is no valid index name, values that are not JSON), are ``failed``
        with the reason and ``retryable=False``: they belong on the dead-letter topic.
        Documents still refused with 429/5xx after every retry are ``failed`` with
        ``retryable=True``.

        Raises :class:`RetryableSinkError` if OpenSearch stays unreachable (or answers 429/5xx
        to whole requests) through every retry, and :class:`SinkError` if it refuses a whole
        request for a reason that is not about a document (e.g. authentication): the caller
        fails the batch rather than dead-lettering it. Applying a batch again is safe.
        """
        results: list[ApplyResult | None] = [None] * len(changes)
        reduced = reduce_batch(changes)
        for i in reduced.superseded:
            results[i] = _result(changes[i], SKIPPED, "superseded by a newer change in the batch")

        ops: list[_Op] = []
        partial: list[tuple[int, Change, str]] = []
        for slot, change in zip(reduced.index_of, reduced.winners, strict=True):
            try:
                index = self._check(change)
            except (SinkError, ValueError) as e:
                results[slot] = _result(change, FAILED, str(e))
                continue
            self.ensure_index(change.table)
            if change.doc is None:
                ops.append(_Op(slot, _action("delete", index, change)))
                continue
            _, held = split_unchanged(change)
            if held:
                partial.append((slot, change, index))
            else:
                self._add_index_op(ops, results, slot, change, index, change.doc, None)

        if partial:
            self._merge_held(partial, ops, results)
        if ops:
            self._bulk(ops, changes, results)
        out: list[ApplyResult] = []
        for change, r in zip(changes, results, strict=True):
            out.append(r if r is not None else _result(change, FAILED, "no outcome (bug)"))
        return out

    def _check(self, change: Change) -> str:
        """The change's index name; SinkError or ValueError if it cannot be written."""
        if not change.key:
            raise SinkError("empty document id")
        if len(change.key.encode()) > _MAX_ID_BYTES:
            raise SinkError(f"document id is longer than {_MAX_ID_BYTES} bytes")
        change.version  # noqa: B018 - raises ValueError for an LSN that does not fit
        return self.index_for(change.table)

    def _add_index_op(
        self,
        ops: list[_Op],
        results: list[ApplyResult | None],
        slot: int,
        change: Change,
        index: str,
        values: Mapping[str, Any],
        note: str | None,
    ) -> None:
        try:
            source = orjson.dumps(values)
        except (TypeError, orjson.JSONEncodeError) as e:
            results[slot] = _result(change, FAILED, f"document is not JSON: {e}")
            return
        ops.append(_Op(slot, _action("index", index, change) + source + b"\n", note))

    def _merge_held(
        self,
        partial: list[tuple[int, Change, str]],
        ops: list[_Op],
        results: list[ApplyResult | None],
    ) -> None:
        """Fill unchanged-TOAST columns from the held documents (see the module doc)."""
        splits = [split_unchanged(c) for _, c, _ in partial]
        docs = [
            {"_index": index, "_id": c.key, "_source": {"includes": sorted(held)}}
            for (_, c, index), (_, held) in zip(partial, splits, strict=True)
        ]
        found = self._read_held(docs)
        for (slot, change, index), (values, held), doc in zip(partial, splits, found, strict=True):
            if "error" in doc:
                reason = doc["error"].get("reason", str(doc["error"]))
                results[slot] = _result(
                    change, FAILED, f"cannot read held document: {reason}", retryable=True
                )
                continue
            note: str | None
            if not doc.get("found"):
                note = f"unchanged columns {sorted(held)} not held by the follower: left out"
                log.warning(
                    "partial change for a document the follower does not hold",
                    extra={"table": change.table, "index": index},
                )
                self._add_index_op(ops, results, slot, change, index, values, note)
                continue
            if doc["_version"] >= change.version:
                results[slot] = _result(change, SKIPPED, "a newer version is held")
                continue
            source = doc.get("_source", {})
            merged = dict(values)
            missing = []
            for column in sorted(held):
                if column in source:
                    merged[column] = source[column]
                else:
                    missing.append(column)
            note = None
            if missing:
                note = f"unchanged columns {missing} not held by the follower: left out"
            self._add_index_op(ops, results, slot, change, index, merged, note)

    def _read_held(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Multi-get in modest chunks; items that fail (e.g. a shard-level request the busy
        node rejected) are read again with backoff before their error is reported."""
        found: list[dict[str, Any]] = [{} for _ in docs]
        todo = list(range(len(docs)))
        for attempt in range(self.max_attempts):
            failed: list[int] = []
            for start in range(0, len(todo), _MGET_CHUNK):
                part = todo[start : start + _MGET_CHUNK]
                body = {"docs": [docs[i] for i in part]}

                def read(body: dict[str, Any] = body) -> Any:
                    return self.client.mget(body=body, params={"realtime": "true"})

                got = self._with_retries("read held documents", read)["docs"]
                for i, doc in zip(part, got, strict=True):
                    found[i] = doc
                    if "error" in doc:
                        failed.append(i)
            if not failed or attempt == self.max_attempts - 1:
                break
            log.warning("re-reading %d held documents (attempt %d)", len(failed), attempt + 2)
            self._backoff(attempt)
            todo = failed
        return found

    def _bulk(
        self, ops: list[_Op], changes: Sequence[Change], results: list[ApplyResult | None]
    ) -> None:
        params = {"refresh": "true" if self.refresh else "false"}
        pending = ops
        for attempt in range(self.max_attempts):
            last = attempt == self.max_attempts - 1
            body = b"".join(op.action for op in pending)
            try:
                response = self.client.bulk(body=body, params=params)
            except TransportError as e:
                if not _retryable_status(e.status_code):
                    raise SinkError(f"OpenSearch refused the bulk request: {e}") from e
                if last:
                    raise RetryableSinkError(f"OpenSearch bulk request failed: {e}") from e
                log.warning("bulk request failed (attempt %d): %s", attempt + 1, e)
                self._backoff(attempt)
                continue
            again: list[_Op] = []
            for op, item in zip(pending, response["items"], strict=True):
                change = changes[op.slot]
                outcome = item_outcome(next(iter(item.values())))
                if outcome[0] == _RETRY:
                    op.last_error = outcome[1]
                    again.append(op)
                elif outcome[0] == APPLIED:
                    results[op.slot] = _result(change, APPLIED, op.note)
                else:
                    results[op.slot] = _result(change, outcome[0], outcome[1])
                    if outcome[0] == FAILED:
                        log.warning(
                            "document refused: %s",
                            outcome[1],
                            extra={"table": change.table},
                        )
            if not again:
                return
            if last:
                for op in again:
                    reason = f"refused after {self.max_attempts} attempts: {op.last_error}"
                    results[op.slot] = _result(changes[op.slot], FAILED, reason, True)
                return
            pending = again
            self._backoff(attempt)

    # -- watermarks ----------------------------------------------------------------------

    def record_watermark(self, job: str, lsn: int) -> None:
        """Record ``lsn`` for ``job``; an older ``lsn`` than the recorded one is ignored."""
        if not 0 <= lsn <= _MAX_LONG:
            raise ValueError(f"watermark LSN {lsn} does not fit a signed 64-bit long")
        index = self.watermark_index
        if index not in self._ready:
            self._create_index(index, _WATERMARK_MAPPING)
        body = {"job": job, "lsn": lsn, "updated_at_ms": int(time.time() * 1000)}

        def write() -> None:
            try:
                self.client.index(
                    index=index,
                    id=job,
                    body=body,
                    params={"version": str(lsn), "version_type": "external"},
                )
            except TransportError as e:
                # A conflict means an equal or higher watermark is already recorded.
                if e.status_code != 409:
                    raise

        self._with_retries(f"record watermark of {job}", write)

    def read_watermark(self, job: str) -> int | None:
        """The recorded watermark of ``job``, or None."""

        def read() -> int | None:
            try:
                doc = self.client.get(index=self.watermark_index, id=job)
            except TransportError as e:
                if e.status_code == 404:
                    return None
                raise
            return int(doc["_source"]["lsn"])

        return self._with_retries(f"read watermark of {job}", read)

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    # -- retries -------------------------------------------------------------------------

    def _with_retries(self, what: str, call: Callable[[], T]) -> T:
        for attempt in range(self.max_attempts):
            try:
                return call()
            except TransportError as e:
                if not _retryable_status(e.status_code):
                    raise SinkError(f"OpenSearch: {what} failed: {e}") from e
                if attempt == self.max_attempts - 1:
                    raise RetryableSinkError(f"OpenSearch: {what} failed: {e}") from e
                log.warning("%s failed (attempt %d): %s", what, attempt + 1, e)
                self._backoff(attempt)
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int) -> None:
        delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        self._sleep(delay * random.uniform(0.5, 1.0))


def _action(kind: str, index: str, change: Change) -> bytes:
    meta = {
        kind: {
            "_index": index,
            "_id": change.key,
            "version": change.version,
            "version_type": "external",
        }
    }
    return orjson.dumps(meta) + b"\n"


def item_outcome(item: Mapping[str, Any]) -> tuple[str, str | None]:
    """``(outcome, reason)`` of one bulk response item; outcome ``"retry"`` for 429/5xx."""
    status = int(item.get("status", 500))
    if 200 <= status < 300:
        return (APPLIED, None)
    if status == 404 and item.get("result") == "not_found":
        # Deleting a document we never held: the tombstone is written all the same.
        return (APPLIED, None)
    if status == 409:
        return (SKIPPED, "a newer version is held")
    error = item.get("error") or {}
    if isinstance(error, Mapping):
        reason = f"{error.get('type', 'error')}: {error.get('reason', '')}"
        cause = error.get("caused_by")
        if isinstance(cause, Mapping):
            reason += f" ({cause.get('type', '')}: {cause.get('reason', '')})"
    else:
        reason = str(error)
    return (_RETRY if _retryable_status(status) else FAILED, reason)


def _error_type(e: TransportError) -> str | None:
    info = e.info
    if isinstance(info, Mapping):
        error = info.get("error")
        if isinstance(error, Mapping):
            kind = error.get("type")
            return kind if isinstance(kind, str) else None
    return None


def _result(
    change: Change, outcome: str, reason: str | None = None, retryable: bool = False
) -> ApplyResult:
    return ApplyResult(change.key, change.table, outcome, reason, retryable)
