"""The OpenSearch follower's writer.

Versions. Every write carries its transaction's commit LSN as an external version with
``version_type=external_gte``: OpenSearch refuses a write whose LSN is below the held one,
so a replayed or reordered change of an older transaction never overwrites a newer one.
Deletes carry the LSN too and leave a tombstone that OpenSearch remembers for
``index.gc_deletes`` (see :mod:`sinks.search_index`). External versions are signed 64-bit,
so the pair (commit LSN, order) does not fit; the order inside one transaction is decided
before writing instead:

- a batch keeps only the newest change per key by (commit LSN, order, Kafka offset)
  (``spark_jobs.reduce.latest_per_key``, or :func:`sinks.base.one_per_key` here);
- one key's events live in one Kafka partition and are applied in offset order, batch after
  batch, so a write with the held LSN (same transaction) is never older than what it
  replaces, and ``external_gte`` lets it through: a transaction that deletes and re-inserts
  the same keys ends with the re-insert, however many changes it holds and however many
  micro-batches it spans. Only an in-order replay of older batches rewrites older states of
  a transaction for a moment, and it converges as it goes on.

The rule holds below LSN 2**63 (8 EiB of WAL); a change beyond it stops the sink with one
line (:func:`sinks.search_requests.check_versionable`).

Unchanged TOAST columns: OpenSearch's partial ``update`` does not take an external version,
so a change that leaves columns untouched is written as a whole document: the sink reads the
held document (a realtime get, with its version), copies the held values of those columns
into the new one and indexes it with the new external version. The same rule decides: a held
version above the change's LSN means the change is stale (skipped); an equal one is an
earlier change of the same transaction (offset order), so it is merged over. No order is
stored in the document: ``_source`` stays exactly the row. If there is no held document the
columns are left out (never the placeholder) and the result says so.

Race: a concurrent write to the same key between the read and the write is caught by the
version check only if it is newer than ours. An older-than-ours, newer-than-held write
slipping in between would have its values for the unchanged columns replaced by the held
ones. The pipeline rules that out by design: a key lives in one Kafka partition, which one
task at a time applies, in order.

Row digests. Each index action into an index whose mapping leaves
:data:`~pgcdc.core.row_digest.FIELD` out of ``_source`` (:func:`sinks.search_index.keeps_digest`:
every index this sink makes) carries the document's :func:`~pgcdc.core.row_digest.stored`
digest in that field, computed from the very values its ``_source`` holds, so ``cdc verify``
folds the index's rows inside OpenSearch (issue 32). An index made before that keeps
``_source`` as it is shown: its documents carry no digest, and verify reads them back. Whether a
write target (a write alias or an index) takes the digest is read from its mapping once and
kept; an index this sink makes is known without a read, an alias pointed again is read again.
A write moved to another target (an echo into the serving version during a build, a write
sent again after its index was lost) drops the digest if the new target does not take it.
Deletes carry none.

Lost indices. Writes go through a write alias per index (:func:`sinks.search_versions.write_alias`,
upper case, so no index can be made under that name): once the index (or the alias) is gone
OpenSearch refuses the write instead of making a new index with a mapping guessed from the
values, as it does for a write, or an externally versioned delete, into a missing index
name. The refused writes make the sink lay the table's index out again as it first does
(mapping, settings, version, aliases; one WARNING: the documents it held are gone until
``cdc verify --repair``) and are sent again, never dead-lettered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, cast, overload

import orjson
from opensearchpy import OpenSearch
from opensearchpy.exceptions import SerializationError, TransportError
from opensearchpy.serializer import JSONSerializer

from pgcdc.core import native, row_digest
from pgcdc.core.contract import search_watermark_index
from pgcdc.core.errors import RetryableSinkError, SinkError
from pgcdc.core.follower_clients import opensearch_options
from pgcdc.core.settings import SearchSettings
from sinks import search_versions as versions
from sinks.base import (
    ApplyResult,
    BatchOutcomes,
    Change,
    OnePerKey,
    Outcome,
    chunks_by_bytes,
    split_unchanged,
)
from sinks.search_index import (
    DEFAULT_GC_DELETES,
    RECOVERY_SOURCE_FLAG,
    RFC3339_FORMAT,
    WATERMARK_MAPPING,
    check_index_prefix,
    drops_recovery_source,
    dynamic_mapping,
    index_name,
    index_settings,
    keeps_digest,
    mapping_from_connect_schema,
    new_columns,
    newer_columns,
    reads_rfc3339,
    refused_columns,
    row_fields,
    strict_dates,
    strict_properties,
    takes,
    with_recovery_source,
    without_recovery_source,
)
from sinks.search_requests import (
    MAX_EXTERNAL_VERSION,
    RETRY,
    Retrying,
    action_format,
    action_parts,
    check_versionable,
    error_type,
    item_outcome,
    retryable_status,
    wait_started,
)

__all__ = ["SearchSink"]

log = logging.getLogger(__name__)

_MAX_ID_BYTES: Final = 512
_OLDER_SHAPE: Final = (
    "of an older shape than the index version being built, which the table's snapshot after "
    "the change of shape fills"
)
_OLDER_COLUMNS: Final = (
    "of an older shape than the index maps a column from, which the table's snapshot after "
    "the change of shape brings again"
)
_REFUSED: Final = "refused:"  # the watermark index's record of a table its index refuses
_MAX_LONG: Final = (1 << 63) - 1
_MGET_CHUNK: Final = 500
# What a bulk answer's items need to say (:func:`sinks.search_requests.item_outcome`): the
# rest of each item (index, id, version, shards, sequence numbers) is most of the answer, for
# OpenSearch to write and for the client to parse (stdlib json, in the task's time).
_BULK_ITEMS: Final = "errors,items.*.status,items.*.result,items.*.error"
# How a bulk answer in which no item failed starts (``errors`` comes before ``items``).
_NO_ERRORS: Final = '{"errors":false,'
_new_result: Final = tuple.__new__
_APPLIED: Final = Outcome.APPLIED
# What a source line takes after its other fields: the row digest's field and object.
_DIGEST_FIELD: Final = orjson.dumps(row_digest.FIELD) + b":"
_DIGEST_AFTER: Final = b"," + _DIGEST_FIELD


def _digest_bytes(source: bytes, kept: bytes) -> bytes:
    """What puts the row digest ``kept`` (its object's JSON) at the end of ``source`` (a JSON
    object): spliced in before its closing brace."""
    return (_DIGEST_FIELD if len(source) == 2 else _DIGEST_AFTER) + kept


def _with_digest(rendered: tuple[bytes, bytes, bytes]) -> bytes:
    """A rendered document's source line with its row digest, as
    :meth:`SearchSink._add_index_op` writes it."""
    source = rendered[0]
    return source[:-1] + _digest_bytes(source, rendered[2]) + b"}"


def _id_too_long(key: str) -> bool:
    """Whether a document id is over :data:`_MAX_ID_BYTES` in UTF-8 (a character is at most
    4 bytes: a short id needs no encoding to tell)."""
    return len(key) > _MAX_ID_BYTES // 4 and len(key.encode()) > _MAX_ID_BYTES


@dataclass(slots=True)
class _Op:
    """One bulk action waiting to be sent, and the input slot it answers for."""

    slot: int  # index into the input batch
    table: str
    index: str  # what the action writes into (a write alias: sinks.search_versions)
    action: bytes  # the bulk action line and, for index, the source line
    note: str | None = None  # reported with an applied outcome
    last_error: str | None = None  # why the last attempt was refused, if it was
    # A write to the version searches read while the next one is built: sent, retried, and
    # its outcome left out (the next version's write is the change's outcome).
    echo: bool = False
    # A write to the next version of a change of an older shape than the one that version
    # was made for: refused there, it is superseded, not dead-lettered (_older_shape).
    older_shape: bool = False
    # The bytes that put the row digest at the end of the source line (_add_index_op), or
    # none: what _moved cuts for a target that does not take it.
    digest: bytes = b""


class AnswerReader(JSONSerializer):
    """The client's JSON serializer, reading answers with orjson: a bulk request's answer
    holds an item per document, and the standard library's parse of it cost the sink about
    3 µs a change (``python -m benchmarks.task_cost``). Requests are written as before."""

    def loads(self, s: str) -> Any:
        if s.startswith(_NO_ERRORS):
            # A bulk answer in which every item went through: its items are read only if
            # asked for (SearchSink._bulk_request needs none of them then).
            return {"errors": False, "items": _Items(s)}
        try:
            return orjson.loads(s)
        except orjson.JSONDecodeError as e:
            raise SerializationError(s, e) from e


class _Items(Sequence[Any]):
    """A bulk answer's items, parsed the first time they are looked at."""

    __slots__ = ("_answer", "_items")

    def __init__(self, answer: str) -> None:
        self._answer: str | None = answer
        self._items: list[Any] = []

    def _parsed(self) -> list[Any]:
        if self._answer is not None:
            answer, self._answer = self._answer, None
            self._items = list(orjson.loads(answer).get("items") or ())
        return self._items

    def __len__(self) -> int:
        return len(self._parsed())

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        return self._parsed()[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._parsed())


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
        client_options: Mapping[str, Any] | None = None,
        bulk_max_bytes: int = 10 * 1024 * 1024,
        shards: int = 1,
        replicas: int = 0,
        refresh_interval: str = "1s",
        evolve_indices: bool = True,
        build_check_interval_s: float = 10.0,
        row_digests: bool = True,
    ) -> None:
        check_index_prefix(index_prefix)
        self.evolve_indices = evolve_indices
        # Whether the indices this sink makes keep the row digest (search.row_digests);
        # what an index keeps is read from its mapping (_keeps_digest), whoever made it.
        self.row_digests = row_digests
        self._stored_digest = row_digest.stored_function()  # hashed natively where it can be
        self.build_check_interval_s = build_check_interval_s
        # Tables whose next index version is being built: what searches read, and the next.
        self._builds: dict[str, tuple[versions.Serving, str]] = {}
        self._build_checked: dict[str, float] = {}
        self._switch_refused: set[str] = set()  # versions whose switch was refused (logged)
        self.bulk_max_bytes = bulk_max_bytes
        self.shards, self.replicas, self.refresh_interval = shards, replicas, refresh_interval
        self.index_prefix = index_prefix
        self.refresh = refresh
        self.gc_deletes = gc_deletes
        self.timeout_s = timeout_s
        self._retrying = Retrying(max_attempts, backoff_s, max_backoff_s, sleep)
        # Our own backoff replaces the client's fixed-interval retries.
        # ``client_options``: basic auth and TLS (pgcdc.core.follower_clients.opensearch_options).
        self.client = client or OpenSearch(
            hosts=[url],
            timeout=timeout_s,
            max_retries=0,
            serializer=AnswerReader(),
            **(client_options or {}),
        )
        # Row struct fields per table, from the Connect schema: they type a new index.
        self._schemas: dict[str, list[Mapping[str, Any]]] = {
            t: list(f) for t, f in (schemas or {}).items()
        }
        self._ready: set[str] = set()  # indices laid out (a table's: its write alias made)
        # Per table index name: the alias writes go through, and what the name read then.
        self._writes: dict[str, str] = {}
        self._serving: dict[str, versions.Serving] = {}
        self._aliased: set[str] = set()  # write aliases made: writes into them require one
        self._build_writes: dict[str, str] = {}  # per table: its next version's write alias
        # Per (table, next version): the commit LSN of a change in the shape it was made for.
        self._shape_lsns: dict[tuple[str, str], int | None] = {}
        self._watermarks_to = search_watermark_index(index_prefix)  # its write alias, once made
        self._checked: set[str] = set()  # tables whose schema was checked against the index
        # Index name per table: the encoding is pure, and every change would redo it.
        self._index_names: dict[str, str] = {}
        # Bulk action line formats per (kind, index) (sinks.search_requests.action_format);
        # an index action's takes its source line too.
        self._action_formats: dict[tuple[str, str], bytes] = {}
        # The native module's bulk writers of rendered batches, by table, write target,
        # whether it keeps the digest and whether it is an alias (_rendered_bodies).
        self._bulk_writers: dict[tuple[str, str, bool, bool], Any] = {}
        # Per write target (an alias or an index): whether its index leaves the row
        # digest's field out of _source, so that index actions into it carry the digest.
        self._digests: dict[str, bool] = {}
        self._digest_unreadable = False  # a mapping the follower may not read (logged once)
        self._rfc3339: bool | None = None  # whether the server has that date format (asked once)
        # Whether the server takes an index that keeps no _recovery_source (asked with it).
        self._drops_recovery_source = False
        self.rendered_batches = 0  # batches written by _apply_rendered (the native path's)

    @classmethod
    def from_settings(cls, settings: SearchSettings, **kwargs: Any) -> SearchSink:
        """A sink for the ``search`` section of the settings."""
        return cls(
            settings.url.get_secret_value(),
            settings.index_prefix,
            **{
                "client_options": opensearch_options(settings),
                "bulk_max_bytes": settings.bulk_max_bytes,
                "shards": settings.number_of_shards,
                "replicas": settings.number_of_replicas,
                "refresh_interval": settings.refresh_interval,
                "evolve_indices": settings.evolve_indices,
                "row_digests": settings.row_digests,
                **kwargs,
            },
        )

    # -- indices -------------------------------------------------------------------------

    def _mapping(self, fields: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
        """The mapping of an index this sink makes for a table of ``fields`` (its Connect
        schema's; none known: typed by the first values), with the row digest's field when
        :attr:`row_digests`."""
        if fields:
            return mapping_from_connect_schema(fields, digest=self.row_digests)
        return dynamic_mapping(digest=self.row_digests)

    def index_for(self, table: str) -> str:
        """The index name of ``table`` (``schema.table``)."""
        name = self._index_names.get(table)
        if name is None:
            name = self._index_names[table] = index_name(self.index_prefix, table)
        return name

    @property
    def watermark_index(self) -> str:
        return search_watermark_index(self.index_prefix)

    def register_schema(
        self, table: str, value_schema: Mapping[str, Any], since_lsn: int | None = None
    ) -> None:
        """Map ``table``'s index from the row struct of this Debezium value schema when this
        sink creates the index. An index that already exists keeps its mapping: a schema
        with other columns than the last one is checked against it (:meth:`_check_mapping`).
        ``since_lsn``, the commit LSN of a change in this shape, is what a next version made
        for it records (:meth:`_evolve`)."""
        fields = row_fields(value_schema)
        if self._schemas.get(table) != fields or table not in self._checked:
            self._schemas[table] = fields
            self._check_mapping(table, fields, since_lsn)

    def _check_mapping(
        self, table: str, fields: Sequence[Mapping[str, Any]], since_lsn: int | None = None
    ) -> None:
        """Whether ``table``'s index maps each column so that it takes the column's values
        now (a column whose type changed: ``integer`` in the index, text in the table): the
        columns it refuses are recorded in the watermark index (``refused:<table>``), which
        ``cdc status`` reads, and the record goes once the index takes them again."""
        try:
            name = self.index_for(table)
        except SinkError:
            return  # no index can hold it: its changes are refused with the reason (apply)

        props = self._properties(name)
        self._checked.add(table)
        doc_id, index = f"{_REFUSED}{table}", self.watermark_index
        if props is None:
            return  # no index yet: it is created with this schema's mapping
        props = self._map_new_columns(name, props, fields, since_lsn)
        refused = refused_columns(props, fields)
        # Columns the index maps from a newer shape: this one is older, and its changes that
        # the index refuses are superseded (_of_newer_shape), no reason to build a version.
        newer = set(newer_columns(props, fields, since_lsn)) if since_lsn is not None else set()
        refused = [r for r in refused if r[0] not in newer]
        if self.evolve_indices and self._evolve(table, name, fields, refused, since_lsn):
            refused = []  # the next version takes them: nothing is refused
            self._map_new_columns(self._builds[table][1], None, fields, since_lsn)
        if newer and not refused:
            return  # what the index records of the table is of a newer shape than this one
        if refused:
            columns = "; ".join(
                f"{c} is {held} in the index, {now} now" for c, held, now in refused
            )
            log.error(
                "index %s cannot take table %s's changes as it is now (%s): they are refused "
                "and dead-lettered; docs/schema-changes.md says how to rebuild it",
                name,
                table,
                columns,
                extra={"table": table, "index": name},
            )
            body = {
                "table": table,
                "index": name,
                "columns": columns,
                "refused": [list(r) for r in refused],
                "at_ms": int(time.time() * 1000),
            }
            self._watermark_write(f"record {doc_id}", doc_id, body)
        else:  # an index missing its record is 404 too
            self._retrying.call(
                f"clear {doc_id}",
                lambda: self.client.delete(index=index, id=doc_id, params={"ignore": 404}),
            )

    def _map_new_columns(
        self,
        index: str,
        props: Mapping[str, Any] | None,
        fields: Sequence[Mapping[str, Any]],
        since_lsn: int | None,
    ) -> dict[str, Any]:
        """Map the columns of ``fields`` that ``index`` (its ``props``, read if None) does not
        map yet as their schema says, recording ``since_lsn`` (:func:`new_columns`), rather
        than as OpenSearch would guess from the first value written, which may be of another
        shape of the column; the index's properties after. A column another writer mapped
        meanwhile is read back as it mapped it. A mapping OpenSearch refuses otherwise (a
        field limit) is logged: the columns are then mapped from their values, as before."""

        def put(new: Mapping[str, Any]) -> bool:
            if not self._reads_rfc3339():
                new = strict_properties(new)
            try:
                self.client.indices.put_mapping(index=index, body={"properties": new})
            except TransportError as e:
                if e.status_code != 400:
                    raise
                if _refuses_rfc3339(e, {"properties": new}):
                    self._parse_dates_strictly()
                    return put(new)  # once: the mapping has no such date left
                if error_type(e) == "illegal_argument_exception":
                    return False  # "mapper [c] cannot be changed from type [long] to [text]"
                log.warning(
                    "index %s does not take the mapping of the new columns %s: %s; they are "
                    "mapped from the values written",
                    index,
                    ", ".join(sorted(new)),
                    e,
                    extra={"index": index},
                )
            return True

        if props is None:
            props = self._properties(index) or {}
        for _ in range(3):  # each conflict is a column someone else mapped: fewer are left
            new = new_columns(props, fields, since_lsn)
            if not new or self._retrying.call(f"map new columns of {index}", partial(put, new)):
                return {**props, **new}
            props = self._properties(index) or {}
        return dict(props)

    def _properties(self, index: str) -> dict[str, Any] | None:
        """The properties ``index`` (an index or an alias of one) maps, None if it is gone."""

        def read() -> dict[str, Any] | None:
            got = versions.mappings(self.client, index)
            if got is None:
                return None
            (only,) = got.values()
            return dict(only.get("mappings", {}).get("properties", {}))

        return self._retrying.call(f"read the mapping of {index}", read)

    def _of_newer_shape(
        self, change: Change, index: str, known: dict[str, dict[str, Any] | None]
    ) -> bool:
        """Whether ``index`` (``known``: the properties read so far, by index) refuses
        ``change`` because it maps a column as a column of another shape, mapped from a
        change committed after it (:func:`sinks.search_index.newer_columns`): the table's
        shape changed after the change, so the reader's snapshot of the table after the
        change of shape brings its row again, and the refusal is no reason to dead-letter
        it. A worker that applied the newer shape's changes first (another partition of the
        topic, ahead) mapped the column so."""
        if change.schema is None:
            return False
        if index not in known:
            known[index] = self._properties(index)
        props = known[index]
        try:
            fields = row_fields(change.schema)
        except SinkError:
            return False
        return props is not None and bool(newer_columns(props, fields, change.commit_lsn))

    def _evolve(
        self,
        table: str,
        name: str,
        fields: Sequence[Mapping[str, Any]],
        refused: Sequence[tuple[str, str, str]],
        since_lsn: int | None = None,
    ) -> bool:
        """Build (or join the build of) the next version of ``table``'s index when its
        serving version refuses columns, or when a build is under way (a job that died
        mid-build, another worker that started it); True if the table's writes now go to the
        next version too (:meth:`apply`). A version this sink makes records ``since_lsn``:
        the changes it refuses that committed before it are of an older shape
        (:meth:`_older_shape`)."""
        now = self._retrying.call(f"resolve {name}", partial(versions.serving, self.client, name))
        if now is None:
            return False
        target = self._retrying.call(
            f"look for a build of {name}", partial(versions.building, self.client, now)
        )
        if target is None and refused:
            if self._retrying.call(
                f"look for {now.next_index}", partial(versions.foreign, self.client, now)
            ):
                log.error(
                    "index %s cannot take table %s's columns as they are now, and the name of "
                    "its version %d, %s, is taken by an index this follower did not make: "
                    "nothing is written to it, the table's changes are refused; delete or "
                    "rename that index, restart the job and run cdc snapshot for the table",
                    name,
                    table,
                    now.version + 1,
                    now.next_index,
                    extra={"table": table, "index": name},
                )
                return False
            target = now.next_index
            mapping = versions.with_version(self._mapping(fields), name, now.version + 1, since_lsn)
            columns = "; ".join(
                f"{c} is {held} in the index, {new} now" for c, held, new in refused
            )
            try:
                if self._create_index(target, mapping, [versions.write_alias(target)]):
                    self._shape_lsns[(table, target)] = since_lsn
            except RetryableSinkError:
                raise
            except SinkError as e:
                # Refused for good (a shard or field limit, a template, no privilege): the
                # table's changes are refused as without versions, and cdc status says so.
                log.error(
                    "index %s cannot take table %s's columns as they are now (%s), and "
                    "OpenSearch refuses to create version %d (%s): %s",
                    name,
                    table,
                    columns,
                    now.version + 1,
                    target,
                    e,
                    extra={"table": table, "index": name},
                )
                return False
            log.warning(
                "index %s cannot take table %s's columns as they are now (%s): building version "
                "%d (%s) beside it; searches read version %d, complete, until the new one holds "
                "every document (the reader snapshots the table again after such a change)",
                name,
                table,
                columns,
                now.version + 1,
                target,
                now.version,
                extra={"table": table, "index": name},
            )
        if target is None:
            return False
        if (table, target) not in self._shape_lsns:
            self._shape_lsns[(table, target)] = self._retrying.call(
                f"read the shape of {target}", partial(versions.shape_lsn, self.client, target)
            )
        self._builds[table] = (now, target)
        self._build_writes[table] = self._write_alias(versions.write_alias(target), target)
        return True

    def advance_builds(self, *, force: bool = False) -> list[str]:
        """Switch each table whose next index version holds every document of the serving
        one (checked at most every ``build_check_interval_s``, unless ``force``); the
        tables switched."""
        done: list[str] = []
        for table, (now, target) in list(self._builds.items()):
            last = self._build_checked.get(table, 0.0)
            if not force and time.monotonic() - last < self.build_check_interval_s:
                continue
            self._build_checked[table] = time.monotonic()
            if self._advance(now, target, table):
                del self._builds[table]
                self._build_writes.pop(table, None)
                done.append(table)
        return done

    def maintain(self) -> None:
        """After each batch, on the job's driver: switch every build under way that caught
        up, those the workers started included (found by their indices), also while no
        change of their table comes to call :meth:`advance_builds`."""
        if not self.evolve_indices:
            return
        found = self._retrying.call(
            "look for index builds",
            partial(versions.under_way, self.client, self.index_prefix.lower()),
        )
        for now, target in found:  # once a batch: a count while the build is short
            self._advance(now, target, now.name)
        unnamed = self._retrying.call(
            "look for versions their name lost",
            partial(versions.unnamed, self.client, self.index_prefix.lower()),
        )
        for name, index in unnamed:
            if self._retrying.call(f"resolve {name}", partial(versions.serving, self.client, name)):
                continue  # the name reads another index (made by hand): left as it is
            version = int(index.rpartition("-v")[2])
            self._restore_alias(versions.Serving(name, index, version), name)

    def _advance(self, now: versions.Serving, target: str, table: str) -> bool:
        """Switch ``now.name`` to ``target`` if it caught up; True once it reads ``target``
        (switched here or by another worker)."""
        current = self._retrying.call(
            f"resolve {now.name}", partial(versions.serving, self.client, now.name)
        )
        if current is not None and current.index == target:
            self._switched(now.name, current)
            return True
        lacking = self._retrying.call(
            f"compare {target} with {now.index}",
            partial(versions.missing, self.client, now, target),
        )
        if lacking:
            log.info(
                "index %s: version %d still lacks %d documents of version %d",
                now.name,
                now.version + 1,
                lacking,
                now.version,
                extra={"table": table, "index": now.name},
            )
            return False
        try:
            retired = versions.switch(self.client, now, target)
        except TransportError as e:
            # Another worker switched first (the old version or alias is gone): as it is now.
            current = versions.serving(self.client, now.name)
            if current is not None and current.index == target:
                self._switched(now.name, current)
                return True
            if retryable_status(e.status_code):
                raise RetryableSinkError(f"cannot switch {now.name} to {target}: {e}") from e
            if e.status_code == 404:
                # Something moved under the call (another worker's switch or retire not yet
                # visible): not a refusal; the next check sees how it ended.
                return False
            # Refused (e.g. no privilege on aliases, a block on the index): searches keep
            # reading the serving version, writes go on to both; never a stop of the job for
            # good. The serving version no longer takes the table's changes: cdc status says
            # so until the switch lands.
            if target not in self._switch_refused:
                self._switch_refused.add(target)
                log.error(
                    "index %s cannot be switched to %s (%s): it keeps reading version %d, "
                    "which no longer follows its table; give the follower's user the "
                    "indices:admin/aliases privilege",
                    now.name,
                    target,
                    e,
                    now.version,
                    extra={"table": table, "index": now.name},
                )
                self._record_refused_switch(now, target, e)
            return False
        self._clear_refused_switch(now.name)
        # The switch moved the write alias too: writes go on into it.
        self._switched(now.name, versions.Serving(now.name, target, now.version + 1))
        if retired is not None:
            self._retrying.call(f"retire {retired}", partial(versions.retire, self.client, retired))
        log.warning(
            "index %s now reads version %d (%s), which holds every document of the table as "
            "it is now",
            now.name,
            now.version + 1,
            target,
            extra={"table": table, "index": now.name},
        )
        return True

    def _switched(self, name: str, now: versions.Serving) -> None:
        """``name`` reads (and its write alias writes into) ``now.index`` after a switch."""
        self._serving[name] = now
        for target in (versions.write_alias(name), self._writes.get(name)):
            if target is not None:
                self._digests.pop(target, None)

    def _record_refused_switch(self, now: versions.Serving, target: str, e: TransportError) -> None:
        """Record in the watermark index that ``now.name`` cannot switch to ``target``
        (``refused:switch:<name>``, read by :meth:`refused_tables`)."""
        body = {
            "index": now.name,
            "switch": target,
            "version": now.version + 1,
            "reason": _reason(e),
            "at_ms": int(time.time() * 1000),
        }
        self._watermark_write(
            f"record the refused switch of {now.name}", f"{_REFUSED}switch:{now.name}", body
        )

    def _clear_refused_switch(self, name: str) -> None:
        self._retrying.call(
            f"clear the refused switch of {name}",
            lambda: self.client.delete(
                index=self.watermark_index,
                id=f"{_REFUSED}switch:{name}",
                params={"ignore": 404},
            ),
        )

    def refused_tables(self) -> list[dict[str, Any]]:
        """The tables whose index refuses their columns as they are now (see
        :meth:`_check_mapping`): ``{"table", "index", "columns", "refused", "at_ms"}`` each;
        a record whose index has been built again since (or is gone) is left out. And the
        names whose switch to a complete next version was refused (:meth:`_advance`):
        ``{"index", "switch", "version", "reason", "at_ms"}``, until the name reads it."""

        def read() -> list[dict[str, Any]]:
            try:
                got = self.client.search(
                    index=self.watermark_index, body={"size": 1000, "query": {"match_all": {}}}
                )
            except TransportError as e:
                if e.status_code == 404:
                    return []
                raise
            return [
                dict(h["_source"]) for h in got["hits"]["hits"] if h["_id"].startswith(_REFUSED)
            ]

        def still(record: Mapping[str, Any]) -> bool:
            if "switch" in record:  # a refused switch: until the name reads that version
                now = versions.serving(self.client, record["index"])
                return now is not None and now.index != record["switch"]
            # The index may have been built again since (deleted, or by hand): as it is now.
            try:
                got = self.client.indices.get_mapping(index=record["index"])
            except TransportError as e:
                if e.status_code == 404:
                    return False
                raise
            (only,) = got.values()
            live = only.get("mappings", {}).get("properties", {})
            return any(
                c in live and not takes(live[c], {"type": now})
                for c, _held, now in record.get("refused", [])
            )

        records = self._retrying.call("read the refused tables", read)
        return [r for r in records if self._retrying.call("read a mapping", partial(still, r))]

    def ensure_index(self, table: str) -> str:
        """Create ``table``'s index unless it exists; return its name.

        The mapping comes from the registered Connect schema, or is dynamic if none is known.
        """
        name = self.index_for(table)
        if name not in self._ready:
            self._lay_out(table, lost=False)
        return name

    def _lay_out(self, table: str, *, lost: bool) -> None:
        """Make ``table``'s index name read an index and its write alias write into it,
        creating what is missing. ``lost``: a write found the index (or an alias) gone under
        the job: what is created again is what this sink had (the same version), and a
        WARNING says what was lost."""
        name = self.index_for(table)
        alias = versions.write_alias(name)
        if not lost:
            # The usual start: the write alias on the index of the name itself (version 1)
            # says that both are there, in one request; a later version's name is an alias
            # of its own, looked at below.
            held = self._retrying.call(f"resolve {alias}", partial(self._alias_index, alias))
            if held == name:
                self._serving[name] = versions.Serving(name, name, 1)
                self._writes[name] = alias
                self._aliased.add(alias)
                self._ready.add(name)
                return
        now = self._retrying.call(f"resolve {name}", partial(versions.serving, self.client, name))
        if now is None:
            now = self._retrying.call(f"resolve {alias}", partial(self._kept_version, name, alias))
            if now is not None:  # the name's alias alone was deleted: the index is kept
                self._restore_alias(now, table)
        if now is None:
            known = self._serving.get(name) if lost else None
            version = known.version if known is not None else 1
            fields = self._schemas.get(table)
            mapping = self._mapping(fields)
            if version == 1:
                index, aliases = name, [alias]
            else:
                index, aliases = versions.version_name(name, version), [name, alias]
                mapping = versions.with_version(mapping, name, version)
            made = self._create_index(index, mapping, aliases)
            now = versions.Serving(name, index, version)
            if lost and made:  # (another worker that made it first says so)
                log.warning(
                    "index %s was deleted under the search follower: created it again as the "
                    "follower creates it (%s, version %d, the table's mapping) and wrote the "
                    "changes it refused; the documents it held are gone until `cdc verify "
                    "--repair` (or `cdc snapshot %s`) publishes them again",
                    name,
                    index,
                    version,
                    table,
                    extra={"table": table, "index": name},
                )
        self._serving[name] = now
        self._writes[name] = self._write_alias(alias, now.index)
        self._ready.add(name)

    def _restore_alias(self, now: versions.Serving, table: str) -> None:
        """Make ``now.name`` read ``now.index`` again (its alias was deleted)."""
        add = {"actions": [{"add": {"index": now.index, "alias": now.name}}]}
        self._retrying.call(
            f"alias {now.name}", lambda: self.client.indices.update_aliases(body=add)
        )
        log.warning(
            "index %s: its alias was deleted under the search follower; it reads version %d "
            "(%s) again, which the follower kept writing: no document lost",
            now.name,
            now.version,
            now.index,
            extra={"table": table, "index": now.name},
        )

    def _alias_index(self, alias: str) -> str | None:
        """The one index ``alias`` points at, if it is an alias of one index."""
        got = self.client.indices.get_alias(name=alias, params={"ignore": 404})
        if got.get("status") == 404 and "error" in got:
            return None
        return next(iter(got)) if len(got) == 1 else None

    def _kept_version(self, name: str, alias: str) -> versions.Serving | None:
        """The version of ``name`` its write alias still writes into, if any (its name's
        alias deleted, the index kept)."""
        got = versions.mappings(self.client, alias)
        if got is None or len(got) != 1:
            return None
        ((index, body),) = got.items()
        meta = body.get("mappings", {}).get("_meta") or {}
        version = int(meta.get(versions.META_KEY, 1))
        if meta.get(versions.NAME_KEY) != name or version < 2:
            return None
        if index != versions.version_name(name, version):
            return None
        return versions.Serving(name, index, version)

    def _write_alias(self, alias: str, index: str) -> str:
        """Point ``alias`` at ``index`` alone; what to write into: the alias, or ``index``
        itself if OpenSearch refuses the alias for good (e.g. no alias privilege)."""

        def point() -> None:
            got = self.client.indices.get_alias(name=alias, params={"ignore": 404})
            if got.get("status") == 404 and "error" in got:
                got = {}
            if set(got) == {index}:
                return
            actions = [{"remove": {"index": i, "alias": alias}} for i in got if i != index]
            actions.append({"add": {"index": index, "alias": alias}})
            self.client.indices.update_aliases(body={"actions": actions})

        try:
            self._retrying.call(f"alias {alias}", point)
        except RetryableSinkError:
            raise
        except SinkError as e:
            log.warning(
                "index %s: cannot make its write alias %s (%s): the follower writes into the "
                "index itself, which OpenSearch creates again with a dynamic mapping if it "
                "is deleted under the job (docs/production.md)",
                index,
                alias,
                e,
                extra={"index": index},
            )
            return index
        self._aliased.add(alias)
        # The alias writes into ``index`` now: it takes the digest if that index does.
        known = self._digests.get(index)
        if known is None:
            self._digests.pop(alias, None)
        else:
            self._digests[alias] = known
        return alias

    def _recover(self, table: str) -> None:
        """A write into ``table``'s index found it (or its next version, or an alias) gone:
        forget what was known and lay it out again; a build under way goes on."""
        name = self.index_for(table)
        self._forget_digests(table)
        self._ready.discard(name)
        self._lay_out(table, lost=True)
        build = self._builds.get(table)
        if build is None:
            return
        now = self._serving[name]
        if now.version != build[0].version:  # switched meanwhile (another worker): built
            del self._builds[table]
            self._build_writes.pop(table, None)
            return
        target = self._retrying.call(
            f"look for a build of {name}", partial(versions.building, self.client, now)
        )
        if target is None:
            if self._retrying.call(
                f"look for {now.next_index}", partial(versions.foreign, self.client, now)
            ):
                log.error(
                    "index %s: its next version %s was deleted while it was built and an "
                    "index this follower did not make took its name: the build stops, the "
                    "table's changes the serving version refuses are dead-lettered; delete "
                    "that index, restart the job and run cdc snapshot %s",
                    name,
                    now.next_index,
                    table,
                    extra={"table": table, "index": name},
                )
                del self._builds[table]
                self._build_writes.pop(table, None)
                return
            target = now.next_index
            fields = self._schemas.get(table) or []
            mapping = versions.with_version(
                self._mapping(fields),
                name,
                now.version + 1,
                self._shape_lsns.get((table, target)),
            )
            if self._create_index(target, mapping, [versions.write_alias(target)]):
                log.warning(
                    "index %s: its next version %s was deleted while it was built: created it "
                    "again, empty; searches keep reading version %d until it holds every "
                    "document, so run `cdc snapshot %s` to bring the rows it lost",
                    name,
                    target,
                    now.version,
                    table,
                    extra={"table": table, "index": name},
                )
        self._builds[table] = (now, target)
        self._build_writes[table] = self._write_alias(versions.write_alias(target), target)

    def _forget_digests(self, table: str) -> None:
        """Forget whether ``table``'s write targets take the row digest: they are made or
        pointed again (read again at their next write if not known then)."""
        name = self.index_for(table)
        targets = {name, versions.write_alias(name), self._writes.get(name, name)}
        now = self._serving.get(name)
        if now is not None:
            targets.add(now.index)
        build = self._builds.get(table)
        if build is not None:
            nxt = build[1]
            targets |= {nxt, versions.write_alias(nxt), self._build_writes.get(table, nxt)}
        for target in targets:
            self._digests.pop(target, None)

    def _keeps_digest(self, target: str) -> bool:
        """Whether index actions into the write target ``target`` carry the row digest: its
        index leaves the digest's field out of ``_source`` (read once, then kept). A target
        found gone, or whose mapping the follower may not read (said once), takes none."""
        known = self._digests.get(target)
        if known is not None:
            return known
        try:
            got = self._retrying.call(
                f"read the mapping of {target}", partial(versions.mappings, self.client, target)
            )
        except RetryableSinkError:
            raise
        except SinkError as e:
            if not self._digest_unreadable:
                self._digest_unreadable = True
                log.warning(
                    "cannot read the mapping of %s (%s): documents are written without their "
                    "row digest, and cdc verify reads them back instead of folding them in "
                    "OpenSearch",
                    target,
                    e,
                    extra={"index": target},
                )
            self._digests[target] = False
            return False
        # Gone: its writes are refused and sent again once it is made again, which forgets
        # this (_recover).
        bodies = list((got or {}).values())
        known = bool(bodies) and all(keeps_digest(b.get("mappings") or {}) for b in bodies)
        self._digests[target] = known
        return known

    def _create_index(
        self, name: str, mapping: Mapping[str, Any], aliases: Sequence[str] = ()
    ) -> bool:
        """Create index ``name`` with its ``aliases`` unless it exists; whether this call
        created it (not another writer)."""
        created = [False]
        if not self._reads_rfc3339():
            mapping = strict_dates(mapping)
        if self._drops_recovery_source:
            mapping = without_recovery_source(mapping)
        settings = index_settings(
            self.gc_deletes,
            shards=self.shards,
            replicas=self.replicas,
            refresh_interval=self.refresh_interval,
        )
        body = {"settings": settings, "mappings": mapping, "aliases": {a: {} for a in aliases}}

        def send(body: dict[str, Any]) -> None:
            try:
                self.client.indices.create(index=name, body=body)
            except TransportError as e:
                if e.status_code != 403 or not aliases:
                    raise
                # No privilege on aliases: the index alone (the write alias is
                # refused next, said once, and writes go into the index itself).
                self.client.indices.create(index=name, body={**body, "aliases": {}})

        def send_as_taken(body: dict[str, Any]) -> None:
            # The node that told the version may be newer than the cluster's manager (a
            # rolling upgrade), which refuses what it does not have yet: the index as before
            # then, from now on. Each is taken off once, so this ends.
            while True:
                try:
                    send(body)
                    return
                except TransportError as e:
                    mappings = body["mappings"]
                    if _refuses_recovery_source_flag(e, mappings):
                        self._drops_recovery_source = False
                        log.info(
                            "OpenSearch refused _source.%s (its cluster manager is older "
                            "than the node that told the version, as in a rolling upgrade): "
                            "new indices keep their _recovery_source",
                            RECOVERY_SOURCE_FLAG,
                        )
                        body = {**body, "mappings": with_recovery_source(mappings)}
                    elif _refuses_rfc3339(e, mappings):
                        self._parse_dates_strictly()
                        body = {**body, "mappings": strict_dates(mappings)}
                    else:
                        raise

        def create() -> None:
            if not self.client.indices.exists(index=name):
                try:
                    send_as_taken(body)
                    created[0] = True
                    log.info("created index", extra={"index": name})
                except TransportError as e:
                    # Another writer created it first.
                    if error_type(e) != "resource_already_exists_exception":
                        raise
            wait_started(self.client, name, self.timeout_s, self._retrying.sleep)

        self._retrying.call(f"create index {name}", create)
        self._ready.add(name)
        if created[0]:  # made with this mapping: whether it takes the digest is known
            self._digests[name] = keeps_digest(mapping)
        return created[0]

    def _reads_rfc3339(self) -> bool:
        """Whether the server has the ``rfc3339_lenient`` date format that dates and zoned
        timestamps are mapped with (:data:`sinks.search_index.RFC3339_FORMAT`), asked once;
        if it has not, or may not be asked, they are mapped as strict_date_optional_time
        (the same dates, parsed slower), said in one line. The same answer tells whether the
        indices this sink makes may keep no ``_recovery_source``
        (:func:`~sinks.search_index.without_recovery_source`)."""
        if self._rfc3339 is None:
            try:
                info = self._retrying.call("read the server's version", self.client.info)
            except RetryableSinkError:
                raise  # unreachable now: the index is not made either, and asked again
            except SinkError as e:  # refused (no cluster:monitor/main privilege)
                info, why = {}, f"its version could not be read ({e})"
            else:
                version = info.get("version") or {}
                why = f"{version.get('distribution', 'elasticsearch')} {version.get('number')}"
            self._rfc3339 = reads_rfc3339(info)
            self._drops_recovery_source = drops_recovery_source(info)
            if not self._rfc3339:
                log.info(
                    "dates and zoned timestamps are mapped as strict_date_optional_time, "
                    "not rfc3339_lenient (OpenSearch 2.12 or later): %s",
                    why,
                )
        return self._rfc3339

    def _parse_dates_strictly(self) -> None:
        """Map dates and zoned timestamps as strict_date_optional_time from now on: the
        cluster refused ``rfc3339_lenient`` though the node asked said it has it (its cluster
        manager is older, as in a rolling upgrade to OpenSearch 2.12 or later)."""
        self._rfc3339 = False
        log.info(
            "OpenSearch refused the %s date format (its cluster manager is older than the node "
            "that told the version, as in a rolling upgrade): dates and zoned timestamps are "
            "mapped as strict_date_optional_time",
            RFC3339_FORMAT,
        )

    def refresh_indices(self, *tables: str) -> None:
        """Make everything written so far searchable (all of this sink's tables' indices if
        none; not the watermark index, which is only ever read by id, in real time)."""
        names = [self.index_for(t) for t in tables] or [
            f"{self.index_prefix}-*".lower(),
            f"-{self.watermark_index}",
        ]
        # ignore_unavailable: excluding an index that does not exist yet is no error.
        self._retrying.call(
            "refresh",
            lambda: self.client.indices.refresh(index=",".join(names), ignore_unavailable=True),
        )

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
        request for a reason that is not about a document (e.g. authentication) or a commit
        LSN cannot be a version: the caller fails the batch rather than dead-lettering it.
        Applying a batch again is safe.
        """
        if type(changes) is OnePerKey and changes:
            done = self._apply_rendered(changes)
            if done is not None:
                return done
        for change in changes:
            check_versionable(change)
        outcomes = BatchOutcomes(changes)
        ops: list[_Op] = []
        partial: list[tuple[int, Change, str]] = []
        for slot, change in outcomes.one_per_key():
            try:
                index = self._check(change)
            except (SinkError, ValueError) as e:
                outcomes.set(slot, Outcome.FAILED, str(e))
                continue
            self.ensure_index(change.table)
            index = self._writes.get(index, index)  # its write alias
            build = self._builds.get(change.table)
            if build is not None:
                # The next version's write is the change's outcome; the serving version
                # gets the same write as an echo, so searches see it until the switch.
                index = self._build_writes.get(change.table, build[1])
            if change.doc is None:
                line = self._action_format("delete", index) % (
                    orjson.dumps(change.key),
                    change.commit_lsn,
                )
                ops.append(_Op(slot, change.table, index, line))
                continue
            _, held = split_unchanged(change)
            if held:
                partial.append((slot, change, index))
            else:
                self._add_index_op(ops, outcomes, slot, change, index, change.doc, None)

        if partial:
            self._merge_held(partial, ops, outcomes)
        if self._builds:
            ops += self._echoes(ops)
        if ops:
            self._bulk(ops, outcomes)
        if self._builds:
            self.advance_builds()
        return outcomes.results()

    def _apply_rendered(self, changes: OnePerKey) -> list[ApplyResult] | None:
        """The native path's common batch written with no bookkeeping a change (about 1.7 µs
        less a change of the sink's CPU): one table, no index being built, each change a
        whole document rendered with it (:data:`sinks.base.Rendered`) or a delete, each id
        and version writable. Every change ``applied``, or None: the batch is not that one, or
        a request did not go through whole (refused, failed, a document refused), and
        :meth:`apply` writes the batch the general way, which decides each change's outcome
        as it always does. A write sent again so is the same write (the same external version,
        which ``external_gte`` takes): each outcome is what the general way alone gives."""
        table = changes[0].table
        if self._builds:
            return None
        try:
            name = self.index_for(table)
        except (SinkError, ValueError):
            return None
        self.ensure_index(table)
        if self._builds:  # laying the index out again began a build
            return None
        bodies = self._rendered_bodies(changes, table, self._writes.get(name, name))
        if bodies is None:
            return None
        params = self._bulk_params()
        for body in bodies:
            try:
                response = self.client.bulk(body=body, params=params)
            except TransportError:
                return None  # the general way retries, splits or refuses, as it does
            if response.get("errors") is not False:
                return None
        self.rendered_batches += 1
        new = _new_result
        return [new(ApplyResult, (c.key, table, _APPLIED, None, False)) for c in changes]

    def _rendered_bodies(
        self, changes: Sequence[Change], table: str, index: str
    ) -> list[bytes] | None:
        """:meth:`_apply_rendered`'s bulk bodies into the write target ``index``, each of
        at most ``bulk_max_bytes`` of documents (one larger alone); None when a change is
        not the common case. Written by the native module's ``SearchBulk`` when it is built,
        else by its Python twin (:meth:`_python_bodies`), byte for byte the same."""
        keeps = self._keeps_digest(index)
        aliased = index in self._aliased
        shape = (table, index, keeps, aliased)
        if shape not in self._bulk_writers:
            mod = native.module()
            self._bulk_writers[shape] = (
                None
                if mod is None
                else mod.SearchBulk(
                    table,
                    action_parts("index", index, require_alias=aliased),
                    action_parts("delete", index),
                    (_DIGEST_FIELD, _DIGEST_AFTER) if keeps else None,
                    MAX_EXTERNAL_VERSION,
                    _MAX_ID_BYTES,
                    self.bulk_max_bytes,
                )
            )
        writer = self._bulk_writers[shape]
        if writer is not None:
            return cast("list[bytes] | None", writer.bodies(changes))
        return self._python_bodies(changes, table, index, keeps)

    def _python_bodies(
        self, changes: Sequence[Change], table: str, index: str, keeps: bool
    ) -> list[bytes] | None:
        """:meth:`_rendered_bodies` in Python."""
        newest = 0
        for c in changes:
            key = c.key
            if (
                c.table != table
                or c.unchanged
                or (c.rendered is None and c.doc is not None)
                or not key
                or _id_too_long(key)
            ):
                return None
            if c.commit_lsn > newest:
                newest = c.commit_lsn
        if newest > MAX_EXTERNAL_VERSION:
            return None
        put = self._action_format("index", index)
        remove = self._action_format("delete", index)
        dumps = orjson.dumps
        try:
            lines = [
                remove % (dumps(c.key), c.commit_lsn)
                if c.rendered is None
                else put
                % (
                    dumps(c.key),
                    c.commit_lsn,
                    _with_digest(c.rendered) if keeps else c.rendered[0],
                )
                for c in changes
            ]
        except orjson.JSONEncodeError:  # an id with no UTF-8 form: the general way fails it
            return None
        return [b"".join(run) for run in chunks_by_bytes(lines, len, self.bulk_max_bytes)]

    def _bulk_params(self) -> dict[str, str]:
        """A bulk request's query: whether it waits for a refresh, and what of its answer is
        wanted (:data:`_BULK_ITEMS`)."""
        return {"refresh": "true" if self.refresh else "false", "filter_path": _BULK_ITEMS}

    def _echoes(self, ops: Sequence[_Op]) -> list[_Op]:
        """The same writes to the serving versions of the tables being built."""
        echoes = []
        for op in ops:
            build = self._builds.get(op.table)
            if build is None:
                continue
            serving = self._writes.get(build[0].name, build[0].name)
            action, digest = _moved(
                op,
                serving,
                require_alias=serving in self._aliased,
                digest=self._keeps_digest(serving),
            )
            echoes.append(_Op(op.slot, op.table, serving, action, echo=True, digest=digest))
        return echoes

    def _check(self, change: Change) -> str:
        """The change's index name; SinkError or ValueError if it cannot be written."""
        key = change.key
        if not key:
            raise SinkError("empty document id")
        if _id_too_long(key):
            raise SinkError(f"document id is longer than {_MAX_ID_BYTES} bytes")
        return self.index_for(change.table)

    def _action_format(self, kind: str, index: str) -> bytes:
        """The bulk action line's format for ``kind`` into ``index`` (kept): ``% (id's
        JSON, commit LSN)``, and for ``index`` then the source."""
        fmt = self._action_formats.get((kind, index))
        if fmt is None:
            fmt = action_format(kind, index, require_alias=index in self._aliased)
            if kind == "index":
                fmt += b"%b\n"
            self._action_formats[(kind, index)] = fmt
        return fmt

    def _add_index_op(
        self,
        ops: list[_Op],
        outcomes: BatchOutcomes,
        slot: int,
        change: Change,
        index: str,
        values: Mapping[str, Any],
        note: str | None,
    ) -> None:
        """An index action of ``values`` as ``_source``, with the row digest of exactly those
        values if ``index`` takes it (:meth:`_keeps_digest`)."""
        rendered = change.rendered if values is change.doc else None
        if rendered is not None:  # made with the change (sinks.base.Rendered)
            source = rendered[0]
        else:
            try:
                source = orjson.dumps(values)
            except (TypeError, orjson.JSONEncodeError) as e:
                outcomes.set(slot, Outcome.FAILED, f"document is not JSON: {e}")
                return
        digest = b""
        if source[-1:] == b"}" and self._keeps_digest(index):  # an object: the row
            kept = (
                rendered[2]
                if rendered is not None
                else orjson.dumps(self._stored_digest(change.key, values))
            )
            digest = _digest_bytes(source, kept)
            source = source[:-1] + digest + b"}"
        fmt = self._action_format("index", index)
        action = fmt % (orjson.dumps(change.key), change.commit_lsn, source)
        older = self._older_shape(change, index)
        ops.append(_Op(slot, change.table, index, action, note, older_shape=older, digest=digest))

    def _older_shape(self, change: Change, index: str) -> bool:
        """Whether ``change`` goes to its table's next version (``index``, its write alias)
        and committed before the change whose shape that version was made for: then it is of
        an older shape (an ALTER TABLE orders the commits around it), and the reader's
        snapshot of the table after the change of shape brings its row again in the new one.
        Refused by the new version, it is superseded, not dead-lettered."""
        build = self._builds.get(change.table)
        if build is None or index != self._build_writes.get(change.table, build[1]):
            return False
        since = self._shape_lsns.get((change.table, build[1]))
        return since is not None and change.commit_lsn < since

    def _merge_held(
        self, partial: list[tuple[int, Change, str]], ops: list[_Op], outcomes: BatchOutcomes
    ) -> None:
        """Fill unchanged-TOAST columns from the held documents (see the module doc)."""
        splits = [split_unchanged(c) for _, c, _ in partial]
        docs = [
            {"_index": index, "_id": c.key, "_source": {"includes": sorted(held)}}
            for (_, c, index), (_, held) in zip(partial, splits, strict=True)
        ]
        found = self._read_held(docs)
        for (slot, change, index), (values, held), doc in zip(partial, splits, found, strict=True):
            if "error" in doc and not _index_gone(doc["error"]):
                reason = doc["error"].get("reason", str(doc["error"]))
                outcomes.set(
                    slot, Outcome.FAILED, f"cannot read held document: {reason}", retryable=True
                )
                continue
            if not doc.get("found"):
                log.warning(
                    "partial change for a document the follower does not hold",
                    extra={"table": change.table, "index": index},
                )
                note = f"unchanged columns {sorted(held)} not held by the follower: left out"
                self._add_index_op(ops, outcomes, slot, change, index, values, note)
                continue
            if doc["_version"] > change.commit_lsn:
                outcomes.set(slot, Outcome.SKIPPED, "a newer version is held")
                continue
            source = doc.get("_source", {})
            merged = dict(values)
            missing = []
            for column in sorted(held):
                if column in source:
                    merged[column] = source[column]
                else:
                    missing.append(column)
            note = f"unchanged columns {missing} not held by the follower: left out"
            self._add_index_op(
                ops, outcomes, slot, change, index, merged, note if missing else None
            )

    def _read_held(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Multi-get in modest chunks; items that fail (e.g. a shard-level request the busy
        node rejected) are read again with backoff before their error is reported."""
        found: list[dict[str, Any]] = [{} for _ in docs]
        todo = list(range(len(docs)))
        attempts = self._retrying.max_attempts
        for attempt in range(attempts):
            failed: list[int] = []
            for start in range(0, len(todo), _MGET_CHUNK):
                part = todo[start : start + _MGET_CHUNK]
                body = {"docs": [docs[i] for i in part]}

                def read(body: dict[str, Any] = body) -> Any:
                    return self.client.mget(body=body, params={"realtime": "true"})

                got = self._retrying.call("read held documents", read)["docs"]
                for i, doc in zip(part, got, strict=True):
                    found[i] = doc
                    if "error" in doc and not _index_gone(doc["error"]):
                        failed.append(i)
            if not failed or attempt == attempts - 1:
                break
            log.warning("re-reading %d held documents (attempt %d)", len(failed), attempt + 2)
            self._retrying.pause(attempt)
            todo = failed
        return found

    def _bulk(self, ops: list[_Op], outcomes: BatchOutcomes) -> None:
        """Send the actions in requests of at most ``bulk_max_bytes``."""
        for run in chunks_by_bytes(ops, lambda op: len(op.action), self.bulk_max_bytes):
            self._bulk_request(run, outcomes)

    def _bulk_request(self, ops: list[_Op], outcomes: BatchOutcomes) -> None:
        """One bulk request; items refused with 429/5xx are sent again with backoff. A body
        the server finds too large (413) is split in two and each half sent; a single
        document too large on its own is refused for good (it goes to the dead letter)."""
        params = self._bulk_params()
        attempts = self._retrying.max_attempts
        pending = ops
        for attempt in range(attempts):
            last = attempt == attempts - 1
            body = b"".join([op.action for op in pending])
            try:
                response = self.client.bulk(body=body, params=params)
            except TransportError as e:
                if e.status_code == 413:
                    self._too_large(pending, len(body), outcomes)
                    return
                if not retryable_status(e.status_code):
                    raise SinkError(f"OpenSearch refused the bulk request: {e}") from e
                if last:
                    raise RetryableSinkError(f"OpenSearch bulk request failed: {e}") from e
                log.warning("bulk request failed (attempt %d): %s", attempt + 1, e)
                self._retrying.pause(attempt)
                continue
            if response.get("errors") is False:
                # No item failed: each is 2xx, or 404 for a delete of a document never held,
                # which the loop below takes as applied too (item_outcome).
                for op in pending:
                    if not op.echo:
                        outcomes.set(op.slot, Outcome.APPLIED, op.note)
                return
            again: list[_Op] = []
            lost: list[_Op] = []
            known: dict[str, dict[str, Any] | None] = {}  # mappings read for refusals
            for op, item in zip(pending, response["items"], strict=True):
                answer = next(iter(item.values()))
                status = answer.get("status")
                if type(status) is int and 200 <= status < 300 and not op.echo:
                    outcomes.set(op.slot, Outcome.APPLIED, op.note)  # item_outcome's first case
                    continue
                if status == 404 and op.index in self._aliased and _index_gone(answer.get("error")):
                    lost.append(op)  # the index went under the job: made again, sent again
                    continue
                outcome, reason = item_outcome(answer)
                if outcome == RETRY:
                    op.last_error = reason
                    again.append(op)
                elif op.echo:
                    continue  # the serving version's copy: the next version's outcome counts
                elif outcome == Outcome.APPLIED:
                    outcomes.set(op.slot, Outcome.APPLIED, op.note)
                elif outcome == Outcome.FAILED and op.older_shape:
                    outcomes.set(op.slot, Outcome.SKIPPED, f"{_OLDER_SHAPE} ({reason})")
                elif outcome == Outcome.FAILED and self._of_newer_shape(
                    outcomes.change(op.slot), op.index, known
                ):
                    outcomes.set(op.slot, Outcome.SKIPPED, f"{_OLDER_COLUMNS} ({reason})")
                else:
                    outcomes.set(op.slot, outcome, reason)
                    if outcome == Outcome.FAILED:
                        log.warning("document refused: %s", reason, extra={"table": op.table})
            if lost:
                self._send_again(lost)
                again += lost
            if not again:
                return
            if last:
                for op in again:
                    if op.echo:
                        continue
                    reason = f"refused after {attempts} attempts: {op.last_error}"
                    outcomes.set(op.slot, Outcome.FAILED, reason, retryable=True)
                return
            pending = again
            self._retrying.pause(attempt)

    def _send_again(self, lost: list[_Op]) -> None:
        """Lay out again the indices of the tables whose writes found them gone, and point
        the refused writes at what each table writes into now."""
        for table in dict.fromkeys(op.table for op in lost):
            self._recover(table)
        for op in lost:
            name = self.index_for(op.table)
            build = self._builds.get(op.table)
            if op.echo or build is None:
                index = self._writes.get(name, name)
            else:
                index = self._build_writes.get(op.table, build[1])
            op.action, op.digest = _moved(
                op, index, require_alias=index in self._aliased, digest=self._keeps_digest(index)
            )
            op.index = index
            op.last_error = f"index {op.index} was gone"

    def _too_large(self, ops: list[_Op], size: int, outcomes: BatchOutcomes) -> None:
        """A request answered 413: halves sent again, or a lone document refused."""
        if len(ops) > 1:
            log.warning(
                "bulk request of %d bytes too large for OpenSearch (413): split in two "
                "(lower search.bulk_max_bytes)",
                size,
            )
            half = len(ops) // 2
            self._bulk_request(ops[:half], outcomes)
            self._bulk_request(ops[half:], outcomes)
            return
        (op,) = ops
        reason = (
            f"document of {size} bytes is larger than OpenSearch takes in one request "
            "(HTTP 413: raise http.max_content_length on the server)"
        )
        outcomes.set(op.slot, Outcome.FAILED, reason)
        log.warning("document refused: %s", reason, extra={"table": op.table})

    # -- watermarks ----------------------------------------------------------------------

    def record_watermark(self, job: str, lsn: int) -> None:
        """Record ``lsn`` for ``job``; an older ``lsn`` than the recorded one is ignored."""
        if not 0 <= lsn <= _MAX_LONG:
            raise ValueError(f"watermark LSN {lsn} does not fit a signed 64-bit long")
        body = {"job": job, "lsn": lsn, "updated_at_ms": int(time.time() * 1000)}
        # A conflict (409) means an equal or higher watermark is already recorded: the usual
        # outcome of a batch that did not move it, so neither an error nor (with ``ignore``)
        # the client's WARNING line of a failed request.
        params = {"version": str(lsn), "version_type": "external", "ignore": 409}
        self._watermark_write(f"record watermark of {job}", job, body, params)

    def _watermark_write(
        self,
        what: str,
        doc_id: str,
        body: Mapping[str, Any],
        params: Mapping[str, Any] | None = None,
    ) -> None:
        """Write ``doc_id`` into the watermark index through its write alias (as a table's
        index: never an index OpenSearch makes); the index deleted under the job is made
        again, with one WARNING, and the document written."""
        index = self.watermark_index
        lost = False
        for attempt in range(2):
            if index not in self._ready:
                made = self._create_index(index, WATERMARK_MAPPING, [versions.write_alias(index)])
                self._watermarks_to = self._write_alias(versions.write_alias(index), index)
                if lost and made:
                    log.warning(
                        "the watermark index %s was deleted under the search follower: created "
                        "it again; each search job records its watermark again at its next batch "
                        "(cdc verify and cdc status wait for that)",
                        index,
                        extra={"index": index},
                    )
            target = self._watermarks_to
            asked = dict(params or {})
            if target != index:
                # 404 is an answer here (the index gone), not a failed request to log.
                ignore = asked.get("ignore", ())
                ignore = (ignore,) if isinstance(ignore, int) else tuple(ignore)
                asked.update(require_alias="true", ignore=(*ignore, 404))

            def write(target: str = target, asked: dict[str, Any] = asked) -> Any:
                return self.client.index(index=target, id=doc_id, body=body, params=asked)

            got = self._retrying.call(what, write)
            if not (isinstance(got, Mapping) and got.get("status") == 404):
                return
            if attempt or not _index_gone(got.get("error")):
                raise SinkError(f"OpenSearch: {what} failed: {got.get('error')}")
            lost = True
            self._ready.discard(index)

    def read_watermark(self, job: str) -> int | None:
        """The recorded watermark of ``job``, or None."""
        doc = self._watermark_doc(job)
        return None if doc is None else int(doc["lsn"])

    def read_watermark_time(self, job: str) -> float | None:
        """When ``job``'s watermark last advanced (Unix seconds), or None: a write that did
        not advance it is refused (409), so ``updated_at_ms`` is the advance's time."""
        doc = self._watermark_doc(job)
        at_ms = None if doc is None else doc.get("updated_at_ms")
        return None if at_ms is None else int(at_ms) / 1000

    def _watermark_doc(self, job: str) -> dict[str, Any] | None:
        def read() -> dict[str, Any] | None:
            try:
                doc = self.client.get(index=self.watermark_index, id=job)
            except TransportError as e:
                if e.status_code == 404:
                    return None
                raise
            return dict(doc["_source"])

        return self._retrying.call(f"read watermark of {job}", read)

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()


def _moved(op: _Op, index: str, *, require_alias: bool, digest: bool) -> tuple[bytes, bytes]:
    """``op``'s action into ``index`` instead (its index is in the action line's head), and
    the digest bytes it carries: ``op``'s if ``digest`` (``index`` takes the row digest),
    else none, cut from the source line, which is then exactly the row."""
    action, kept = op.action, op.digest
    if kept and not digest:
        # The source line ends with the digest, the row's closing brace and a newline.
        action, kept = action[: -len(kept) - 2] + b"}\n", b""
    if index == op.index:
        return action, kept
    head, sep, rest = action.partition(b"\n")
    head = head.replace(orjson.dumps(op.index), orjson.dumps(index), 1)
    # The flag follows the target (an alias can require one, an index cannot): as
    # action_format sets it, not on deletes.
    flag = b',"require_alias":true'
    head = head.replace(flag, b"", 1)
    if require_alias and not head.startswith(b'{"delete"'):
        head = head[:-2] + flag + b"}}"
    return head + sep + rest, kept


def _refuses_recovery_source_flag(e: TransportError, mapping: Mapping[str, Any]) -> bool:
    """Whether OpenSearch refused ``mapping`` for its :data:`RECOVERY_SOURCE_FLAG` (a mapping
    error that names it, the mapping having it)."""
    source = mapping.get("_source")
    return (
        isinstance(source, Mapping)
        and RECOVERY_SOURCE_FLAG in source
        and error_type(e) == "mapper_parsing_exception"
        and RECOVERY_SOURCE_FLAG in str(e.info)
    )


def _refuses_rfc3339(e: TransportError, mapping: Mapping[str, Any]) -> bool:
    """Whether OpenSearch refused ``mapping`` for its :data:`RFC3339_FORMAT` dates (a mapping
    error that names the format as invalid, the mapping having such a date)."""
    return (
        e.status_code == 400
        and f"Invalid format: [{RFC3339_FORMAT}]" in str(e.info)
        and strict_dates(mapping) != mapping
    )


def _index_gone(error: object) -> bool:
    """Whether OpenSearch answered that the index (or alias) written or read is gone."""
    return isinstance(error, Mapping) and error.get("type") == "index_not_found_exception"


def _reason(e: TransportError) -> str:
    """``<status> <type>: <reason>`` of an answer OpenSearch refused."""
    info = e.info if isinstance(e.info, Mapping) else {}
    error = info.get("error")
    if isinstance(error, Mapping):
        return f"{e.status_code} {error.get('type', '')}: {error.get('reason', '')}"
    return f"{e.status_code} {e.error}"
