"""Incremental snapshots: tables read in key-ordered chunks between watermarks while the
stream runs (DBLog's algorithm, as Debezium's incremental snapshots use it).

For each chunk a worker thread, on a connection of its own,

1. writes a *low* watermark L into the WAL (a non-transactional
   ``pg_logical_emit_message(false, 'pgcdc-watermark', …)``: no table, no write access to
   user schemas);
2. reads the chunk: ``SELECT … WHERE (key) > (last key) [AND (filter)] ORDER BY key LIMIT n``
   and encodes its keys and values (``source.lsn`` is L's position, for information: the
   version that followers compare is set at H, below);
3. writes a *high* watermark H.

The streaming thread never waits for the read: it goes on reading and publishing, and notes
the keys of the chunk's table that it streams from the moment the chunk is asked for. At H
(which the worker writes only after its read and encoding, so the events are ready by then)
it merges (:func:`merge_chunk`): a key streamed after L leaves the chunk (a change committed
inside the window may or may not be in what the SELECT saw; the streamed event is right
either way), and so does a key of a transaction the SELECT's snapshot saw as running or not
yet begun, streamed before L (its commit record can precede L while the transaction becomes
visible only after the SELECT began). A transaction the stream finished *before* the chunk
was asked for and that the SELECT still did not see left no key to drop: the chunk is read
again. The chunk's remaining rows are published as ``op: "r"`` with ``source.snapshot =
"incremental"`` right there, before any streamed event that follows H. A chunk is asked for
only between streamed transactions.

**The version rule.** Chunk rows carry the high watermark's position as their commit LSN
(``cdc.commit_lsn`` = H - 1, where H is the end of the watermark's record as pgoutput reports
it, and ``cdc.order`` = the row's place in the chunk). A change committed before the low
watermark L has a smaller commit LSN and its effect is in the chunk row (or, if the SELECT
could not see it yet, its key left the chunk); a change committed between L and H removed its
key from the chunk; a change committed after H has a commit LSN of at least H and wins at
every follower (OpenSearch external versions, Redis
compare-and-set). So a chunk row never overwrites a newer streamed value.

**Acknowledgement.** The chunk is one tracked transaction whose end is H
(:meth:`cdc.publisher.Publisher.begin`), so the slot never moves past H before Kafka holds the
chunk. Once it does, the snapshot's progress (last key, chunks, rows) is written to the state
topic (:mod:`cdc.state`, key ``<database>/<slot>#snapshots``), in chunk order. The next chunk
is asked for as soon as one is published (its read overlaps the other's wait for Kafka). A
crash or a stop before a chunk's progress is written re-reads it, with new watermarks, on the
next run; a re-read row is the row as of its new H, never older than what a follower holds.

Memory is two chunks of rows at most (one in Kafka's hands, one being read); the slot
advances with the stream throughout.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import psycopg
from psycopg import sql

from cdc import pgoutput
from cdc.connection import connect, in_recovery
from cdc.observer import NullObserver, StreamObserver
from cdc.publication import captured_tables
from cdc.publisher import Publisher, TxnTracker
from cdc.signal_topic import SignalTopic
from cdc.signals import (
    SIGNAL_PREFIX,
    Signal,
    SnapshotRequest,
    StopRequest,
    parse_envelope,
    parse_signal,
)
from cdc.snapshot_progress import SnapshotProgress
from cdc.state import StateStore
from cdc.table_checks import warn_not_snapshotted
from cdc.table_topics import TableTopics
from pgcdc.core.contract import version_headers
from pgcdc.core.errors import SchemaError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import Settings
from pgcdc.core.values import RawValue
from schemas.envelope import EventEncoder
from schemas.model import SourceInfo, TableSchema

log = logging.getLogger(__name__)

WATERMARK_PREFIX = "pgcdc-watermark"
POLL_INTERVAL_S = 2.0  # how often the publication and the signal topic are looked at
RECENT_XIDS = 4096  # transactions streamed lately, remembered while a snapshot runs
# The stream remembers transactions only while a snapshot is queued: the first chunk waits
# this long, so a transaction streamed just before the request is remembered too.
WARM_UP_S = 0.5

Table = tuple[str, str]
Row = tuple[RawValue, ...]
SchemaLoader = Callable[[psycopg.Connection[Any], str, str], TableSchema]


@dataclass
class TableSnapshot:
    """One table's incremental snapshot, as kept in the state topic."""

    id: str
    schema: str
    table: str
    where: str | None = None
    via: str = "signal"  # signal | cli | kafka | table | joined | initial
    last_key: list[str] | None = None  # the key columns' text of the last row read
    chunks: int = 0  # chunks published and acknowledged
    rows: int = 0  # rows published by those chunks
    estimated_rows: int = 0

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass
class SnapshotsState:
    """The slot's incremental snapshots: the tables captured so far and the queue."""

    captured: list[Table] | None = None  # None: never recorded (a reader from before)
    queue: list[TableSnapshot] = field(default_factory=list)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "captured": None if self.captured is None else [list(t) for t in self.captured],
                "queue": [asdict(s) for s in self.queue],
            }
        )

    @classmethod
    def from_json(cls, data: bytes | None) -> SnapshotsState:
        if not data:
            return cls()
        d: dict[str, Any] = orjson.loads(data)
        captured = d.get("captured")
        return cls(
            captured=None if captured is None else [(s, t) for s, t in captured],
            queue=[TableSnapshot(**s) for s in d.get("queue", [])],
        )


def load_snapshots(store: StateStore, database: str, slot: str) -> SnapshotsState:
    return SnapshotsState.from_json(store.load_record(store.snapshots_key(database, slot)))


@dataclass(frozen=True)
class ReadSnapshot:
    """The transactions a chunk's SELECT did not see: those its snapshot lists as running,
    and every one from its xmax on (32-bit xids, as pgoutput sends them)."""

    invisible: frozenset[int] = frozenset()
    xmax: int = 0

    def unseen(self, xid: int | None) -> bool:
        """The SELECT did not see this transaction (running, or begun after its snapshot)."""
        if xid is None:
            return False
        return xid in self.invisible or (xid - self.xmax) & 0xFFFFFFFF < 0x80000000


def merge_chunk(
    keys: Sequence[bytes],
    seen: ReadSnapshot,
    *,
    window_keys: set[bytes],
    early: dict[int | None, set[bytes]],
    recent: frozenset[int],
    truncated: bool = False,
) -> list[int] | None:
    """The places in ``keys`` (a chunk's rows, in key order) of the rows that go out at the
    high watermark, or None when the chunk must be read again.

    ``window_keys``: keys streamed after the low watermark; ``early``: keys streamed between
    the chunk's request and the low watermark, by transaction (those of a transaction the
    SELECT did not see leave the chunk too); ``recent``: transactions the stream finished
    before the request: one the SELECT did not see is not in the rows, and its changes will
    not be streamed again, so the chunk is read again. A TRUNCATE in the window empties it.
    """
    if any(seen.unseen(xid) for xid in recent):
        return None
    if truncated:
        return []
    drop = set(window_keys)
    for xid, ks in early.items():
        if seen.unseen(xid):
            drop |= ks
    if not drop:
        return list(range(len(keys)))
    return [i for i, k in enumerate(keys) if k not in drop]


class _Dropped(Exception):
    """A chunk's request cannot be carried out (gone table, no key, a filter the server
    refuses): the snapshot is dropped with a warning, the stream goes on."""


@dataclass
class _ChunkRead:
    """A chunk as the worker read and encoded it."""

    table: TableSchema
    keys: list[bytes]  # in key order (rows without a key are left out)
    values: list[bytes]  # the rows' "r" events
    last_key: list[str] | None  # the last row's key columns (None: no row read)
    complete: bool  # fewer rows than a chunk: the table ends with this one
    seen: ReadSnapshot
    counted: int | None  # rows counted, when the table had no estimate


@dataclass
class _Cursor:
    """Where this run's reading of one snapshot stands (ahead of its acknowledged state)."""

    snap: TableSnapshot
    topic: str
    next_key: list[str] | None
    chunks: int  # chunks published (acknowledged or not)
    count: bool  # the first chunk also counts the table's rows (no estimate)
    exhausted: bool = False


@dataclass
class _Chunk:
    """A chunk asked for: the worker reads it while the stream notes its table's keys."""

    snap: TableSnapshot
    topic: str
    number: int
    low: bytes
    high: bytes
    recent: frozenset[int]  # transactions the stream had finished when it was asked for
    future: Future[_ChunkRead] | None = None
    in_window: bool = False
    window_keys: set[bytes] = field(default_factory=set)
    early: dict[int | None, set[bytes]] = field(default_factory=dict)
    truncated: bool = False
    # Set at the high watermark:
    table: TableSchema | None = None
    last_key: list[str] | None = None
    complete: bool = False
    dropped: int = 0  # rows whose key a streamed change took out
    emitted: int = 0  # rows published at H


@dataclass
class _Progress:
    """What the progress bar shows for a table (see :class:`SnapshotProgress`)."""

    schema: TableSchema
    estimated_rows: int
    rows: int


class IncrementalSnapshots:
    """Runs the queued incremental snapshots beside the streaming loop.

    The streamer calls :meth:`on_message` for logical messages, :meth:`observe` for every
    record of :attr:`window_topic` while a chunk is asked for, :meth:`on_truncate`,
    :meth:`table_joined` for a table first seen in the stream, and :meth:`tick` often (between
    transactions). Chunks are read on a worker thread; everything else, including the merge
    and publishing of a chunk at its high watermark, runs on the streaming thread.
    """

    def __init__(
        self,
        dsn: str,
        *,
        settings: Settings,
        publisher: Publisher,
        encoder: EventEncoder,
        load_schema: SchemaLoader,
        store: StateStore,
        table_topics: TableTopics,
        database: str,
        state: SnapshotsState,
        observer: StreamObserver | None = None,
        progress: bool | None = None,
    ) -> None:
        import sys

        pg = settings.postgres
        self.state = state
        self._publisher = publisher
        self._encoder = encoder
        # The worker encodes with its own encoder (its plan cache is not shared).
        self._worker_encoder = EventEncoder(
            encoder.settings, encoder.topic_prefix, encoder.database, encoder.format
        )
        self._load_schema = load_schema
        self._store = store
        self._table_topics = table_topics
        self._key = store.snapshots_key(database, pg.slot_name)
        self._chunk_rows = pg.incremental_chunk_rows
        self._publication = pg.publication_name
        self._auto = pg.snapshot_new_tables
        self._observer: StreamObserver = observer or NullObserver()
        self._tty = sys.stderr.isatty() if progress is None else progress
        sig = pg.signal_data_collection
        self.signal_table: Table | None = tuple(sig.split(".", 1)) if sig else None  # type: ignore[assignment]
        self._conn = connect(dsn, application_name="cdc-snapshot")
        self._worker_conn = connect(dsn, application_name="cdc-snapshot-chunks")
        # A standby (the reader may read from one, PostgreSQL 16+) cannot write watermarks.
        self.on_standby = in_recovery(self._conn)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-chunk")
        self._signal_topic = (
            SignalTopic(settings.kafka, settings.kafka.signal_topic, database, pg.slot_name)
            if settings.kafka.signal_topic
            else None
        )
        self._run = uuid.uuid4().hex[:12]
        self._seq = 0
        self._open: _Chunk | None = None
        # Chunks published, waiting for Kafka, oldest first (their progress is saved in order).
        self._acking: collections.deque[tuple[_Chunk, TxnTracker]] = collections.deque()
        self._cursors: dict[int, _Cursor] = {}  # by id() of the TableSnapshot
        self._bars: dict[int, tuple[SnapshotProgress, _Progress]] = {}
        self._next_poll = 0.0
        self.window_topic: str | None = None
        self._recent: dict[int, None] = {}  # xids streamed lately, oldest first
        self._busy_since: float | None = None
        self.retries = 0  # chunks read again: a transaction streamed already was invisible
        self.dropped = 0  # chunk rows dropped for a change inside their window (this run)
        self.chunks = 0  # chunks published and acknowledged (this run)

    # --- state --------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A snapshot is queued, or a chunk is in flight."""
        return bool(self.state.queue) or self._open is not None or bool(self._acking)

    def save(self) -> None:
        """Write the state and wait for Kafka: a signal or a chunk counts once it is saved."""
        self._store.save_record(self._key, self.state.to_json(), wait=True)

    def close(self) -> None:
        for bar, _ in self._bars.values():
            bar.close()
        if self._signal_topic is not None:
            self._signal_topic.close()
        chunk = self._open
        if chunk is not None and chunk.future is not None and chunk.future.running():
            # A long chunk query need not run to its end (closing below ends it anyway).
            with contextlib.suppress(psycopg.Error):
                self._worker_conn.cancel_safe()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._worker_conn.close()
        self._conn.close()

    # --- requests -----------------------------------------------------------------------

    def on_signal(self, signal: Signal, via: str) -> None:
        """Carry out a signal and save the state (before the signal itself is acknowledged)."""
        if isinstance(signal, SnapshotRequest):
            for t in signal.tables:
                self._queue(TableSnapshot(signal.id, *t, where=signal.where(t), via=via))
        elif isinstance(signal, StopRequest):
            self._stop(signal)
        self.save()

    def _queue(self, snap: TableSnapshot) -> None:
        if self.on_standby:
            log.error(
                "incremental snapshot of %s (%s) not taken: the reader reads from a standby, "
                "which cannot write the snapshot's watermarks into the WAL; take it with a "
                "reader on the primary, or snapshot again with --snapshot-mode when_needed "
                "and a new slot",
                snap.name,
                snap.via,
                extra={"table": snap.name},
            )
            return
        if any(
            s.schema == snap.schema
            and s.table == snap.table
            and s.where == snap.where
            and s.chunks == 0
            and s.last_key is None
            for s in self.state.queue
        ):
            log.info("incremental snapshot of %s already queued", snap.name)
            return
        self.state.queue.append(snap)
        log.info(
            "incremental snapshot of %s queued (%s%s)",
            snap.name,
            snap.via,
            f", where {snap.where}" if snap.where else "",
            extra={"table": snap.name},
        )

    def _stop(self, signal: StopRequest) -> None:
        wanted = set(signal.tables)
        keep = [s for s in self.state.queue if wanted and (s.schema, s.table) not in wanted]
        for s in self.state.queue:
            if s not in keep:
                log.info("incremental snapshot of %s stopped (signal %s)", s.name, signal.id)
                self._cursors.pop(id(s), None)
        self.state.queue = keep
        if self._open is not None and self._open.snap not in keep:
            self._open = None  # the worker's result, if any, is left unused
            self.window_topic = None

    def table_joined(self, table: Table, when: str, *, save: bool = True) -> None:
        """``table`` is captured now and was not before: snapshot it (unless turned off)."""
        if self.state.captured is None:
            self.state.captured = []
        if table in self.state.captured:
            return
        self.state.captured.append(table)
        name = f"{table[0]}.{table[1]}"
        if self._auto and table != self.signal_table:
            log.warning(
                "table %s joined the captured tables %s: its changes from now on are "
                "captured and its rows are snapshotted incrementally",
                name,
                when,
                extra={"table": name},
            )
            self._queue(TableSnapshot(uuid.uuid4().hex, *table, via="joined"))
        elif table != self.signal_table:
            warn_not_snapshotted(name, when)
        if save:
            self.save()

    # --- stream hooks -------------------------------------------------------------------

    def on_message(self, msg: pgoutput.LogicalMessage) -> None:
        if msg.prefix == WATERMARK_PREFIX:
            content = bytes(msg.content)
            chunk = self._open
            if chunk is None:
                return  # an earlier run's, or a stopped chunk's
            if content == chunk.low:
                chunk.in_window = True
            elif content == chunk.high:
                self._merge(chunk, msg.lsn)
        elif msg.prefix == SIGNAL_PREFIX:
            signal = parse_envelope(f"wal@{msg.lsn}", bytes(msg.content))
            if signal is not None:
                self.on_signal(signal, "wal")

    def on_signal_row(self, values: dict[str, str | None]) -> None:
        """A row inserted into the signal table (Debezium's id, type, data)."""
        signal = parse_signal(values.get("id"), values.get("type"), values.get("data"))
        if signal is not None:
            self.on_signal(signal, "table")

    def observe(self, key: bytes | None, xid: int | None) -> None:
        """A streamed record of the asked-for chunk's table: its key is noted, as inside the
        window or by transaction before it (see :func:`merge_chunk`)."""
        chunk = self._open
        if chunk is None or key is None:
            return
        if chunk.in_window:
            chunk.window_keys.add(key)
        else:
            keys = chunk.early.get(xid)
            if keys is None:
                keys = chunk.early[xid] = set()
            keys.add(key)

    def committed(self, xid: int | None) -> None:
        """The stream has passed this transaction's commit (called while :attr:`busy`)."""
        if xid is not None:
            recent = self._recent
            recent[xid] = None
            if len(recent) > RECENT_XIDS:
                del recent[next(iter(recent))]

    def on_truncate(self, table: Table) -> None:
        chunk = self._open
        if chunk is not None and (chunk.snap.schema, chunk.snap.table) == table:
            chunk.truncated = True

    # --- driving ------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Finish acknowledged chunks, look for signals and new tables, ask for a chunk."""
        if self._acking:
            self._publisher.poll(0)
            while self._acking:
                chunk, txn = self._acking[0]
                if not (txn.closed and txn.pending == 0):
                    break
                self._acking.popleft()
                self._finish(chunk)
        if now >= self._next_poll:
            self._next_poll = now + POLL_INTERVAL_S
            self._poll()
        asked = self._open
        if asked is not None and asked.future is not None and asked.future.done():
            error = asked.future.exception()
            if error is not None:
                self._open = None
                self.window_topic = None
                self._failed(asked.snap, error)
        if not self.busy:
            self._busy_since = None
            self._recent.clear()
        elif self._busy_since is None:
            self._busy_since = now
        # One chunk read while at most one waits for Kafka: memory stays two chunks.
        ready = self._open is None and len(self._acking) <= 1
        if ready and self.state.queue and now - (self._busy_since or now) >= WARM_UP_S:
            self._ask_chunk()

    def _poll(self) -> None:
        if self._signal_topic is not None:
            signals = self._signal_topic.poll()
            for signal in signals:
                self.on_signal(signal, "kafka")
            self._signal_topic.commit()
        for table in captured_tables(self._conn, self._publication):
            if self.state.captured is not None and table not in self.state.captured:
                self.table_joined(table, "while streaming")

    def _failed(self, snap: TableSnapshot, error: BaseException) -> None:
        """The worker could not read a chunk: drop the request, or stop the reader."""
        if not isinstance(error, _Dropped):
            raise error
        log.warning(
            "incremental snapshot of %s dropped: %s", snap.name, error, extra={"table": snap.name}
        )
        self._cursors.pop(id(snap), None)
        if snap in self.state.queue:
            self.state.queue.remove(snap)
            self.save()

    def _cursor(self, snap: TableSnapshot) -> _Cursor | None:
        cursor = self._cursors.get(id(snap))
        return cursor if cursor is not None and cursor.snap is snap else None

    def _ask_chunk(self) -> None:
        """Ask the worker for the next chunk of the first snapshot with rows left to read."""
        for snap in self.state.queue:
            cursor = self._cursor(snap)
            if cursor is None or not cursor.exhausted:
                break
        else:
            return  # every queued table is read to its end; its last chunk waits for Kafka
        if cursor is None:
            try:
                cursor = self._begin_table(snap)
            except _Dropped as e:
                self._failed(snap, e)
                return
        self._seq += 1
        chunk = _Chunk(
            snap,
            cursor.topic,
            cursor.chunks + 1,
            f"{self._run}:{self._seq}:low".encode(),
            f"{self._run}:{self._seq}:high".encode(),
            frozenset(self._recent),
        )
        self._open = chunk
        self.window_topic = chunk.topic
        chunk.future = self._pool.submit(
            self._read_chunk,
            snap.schema,
            snap.table,
            snap.where,
            cursor.next_key,
            chunk.low,
            chunk.high,
            cursor.count,
        )
        cursor.count = False

    def _begin_table(self, snap: TableSnapshot) -> _Cursor:
        """This run's first chunk of ``snap``: check the table, make its topic, log."""
        try:
            table = self._load_schema(self._conn, snap.schema, snap.table)
        except SchemaError as e:
            raise _Dropped(str(e)) from e
        if not table.key_columns:
            raise _Dropped(
                "it has no key to read it in chunks by (set CDC_POSTGRES__MESSAGE_KEY_COLUMNS "
                "for it)"
            )
        topic = self._encoder.topic(table)
        self._table_topics.ensure(topic, keyless=False, table=snap.name)
        if not snap.estimated_rows:
            row = self._conn.execute(
                "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %s::regclass",
                (sql.Identifier(snap.schema, snap.table).as_string(self._conn),),
            ).fetchone()
            snap.estimated_rows = int(row[0]) if row else 0
        cursor = _Cursor(snap, topic, snap.last_key, snap.chunks, count=not snap.estimated_rows)
        self._cursors[id(snap)] = cursor
        if snap.chunks:
            log.info(
                "incremental snapshot of %s resumed after chunk %d (%d rows done, key > %s)",
                snap.name,
                snap.chunks,
                snap.rows,
                ",".join(snap.last_key or []),
                extra={"table": snap.name},
            )
        else:
            log.info(
                "incremental snapshot of %s started (%s, %d per chunk)",
                snap.name,
                f"~{snap.estimated_rows} rows" if snap.estimated_rows else "rows counted",
                self._chunk_rows,
                extra={"table": snap.name},
            )
        return cursor

    # --- the worker thread --------------------------------------------------------------

    def _read_chunk(
        self,
        schema: str,
        name: str,
        where: str | None,
        after: list[str] | None,
        low: bytes,
        high: bytes,
        count: bool,
    ) -> _ChunkRead:
        """On the worker thread: the low watermark, the chunk's rows, the high watermark,
        then the rows encoded as of H. Raises :class:`_Dropped` for a request that cannot be
        carried out."""
        conn = self._worker_conn
        try:
            table = self._load_schema(conn, schema, name)
        except SchemaError as e:
            raise _Dropped(str(e)) from e
        if not table.key_columns:
            raise _Dropped("it has no key to read it in chunks by")
        try:
            counted = _count(conn, table) if count else None
            low_lsn = _emit(conn, low)
            rows, last_key, seen = self._select(conn, table, where, after)
        except psycopg.Error as e:
            if conn.closed:
                raise
            # A filter the server refuses (a signal's --where) must not stop the stream.
            text = str(e).strip()
            raise _Dropped(
                f"its chunk query failed: {text.splitlines()[0] if text else type(e).__name__}"
            ) from e
        # Encoded before H: the streaming thread, reaching H, finds the rows ready and never
        # waits for the encoding (the window is longer by it, which only drops more keys).
        keys: list[bytes] = []
        values: list[bytes] = []
        encoder = self._worker_encoder
        source = SourceInfo(int(time.time() * 1_000_000), "incremental", None, low_lsn.value, None)
        for row in rows:
            key = encoder.encode_key(table, row)
            if key is None:
                continue
            try:
                values.append(encoder.encode_value(table, "r", None, row, source))
            except SchemaError as e:
                raise SchemaError(
                    f"cannot encode a snapshot row of {schema}.{name} (key "
                    f"{key.decode(errors='replace')}): {e}"
                ) from e
            keys.append(key)
        complete = len(rows) < self._chunk_rows
        del rows
        _emit(conn, high)
        return _ChunkRead(table, keys, values, last_key, complete, seen, counted)

    def _select(
        self,
        conn: psycopg.Connection[Any],
        table: TableSchema,
        where: str | None,
        after: list[str] | None,
    ) -> tuple[list[Row], list[str] | None, ReadSnapshot]:
        """The next chunk's rows (as text, like pgoutput's), the last one's key, and the
        transactions its snapshot did not see: those it lists as running, and every one from
        its xmax on (xmax is the latest completed xid + 1, so a transaction still running
        above it is invisible without being listed).

        A transaction's commit record reaches the WAL before the transaction becomes visible,
        so one whose commit lies just before L can still be invisible to the SELECT: its
        changes are streamed before L, yet not in the chunk. Its xid is in the snapshot's
        running list, and its changes remove their keys from the chunk like those inside
        the window."""
        cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns)
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in table.key_columns)
        conds: list[sql.Composable] = []
        if after is not None:
            conds.append(
                sql.SQL("({}) > ({})").format(
                    keys, sql.SQL(", ").join(sql.Literal(v) for v in after)
                )
            )
        if where:
            conds.append(sql.SQL("({})").format(sql.SQL(where)))  # the user's filter
        cond = sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(conds)) if conds else sql.SQL("")
        query = sql.SQL("COPY (SELECT {} FROM {}{} ORDER BY {} LIMIT {}) TO STDOUT").format(
            cols,
            sql.Identifier(table.schema, table.table),
            cond,
            keys,
            sql.Literal(self._chunk_rows),
        )
        names = [c.name for c in table.columns]
        positions = [names.index(k) for k in table.key_columns]
        rows: list[Row] = []
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            # The first query fixes the snapshot the COPY below reads with.
            cur.execute(
                "SELECT pg_snapshot_xmax(s)::text::bigint, "
                "ARRAY(SELECT pg_snapshot_xip(s)::text::bigint) FROM pg_current_snapshot() s"
            )
            row = cur.fetchone()
            assert row is not None
            xmax = int(row[0]) & 0xFFFFFFFF
            running = frozenset(int(x) & 0xFFFFFFFF for x in row[1])
            with cur.copy(query) as copy:
                copy.set_types(["text"] * len(table.columns))
                for r in copy.rows():
                    rows.append(r)
        last = [str(rows[-1][i]) for i in positions] if rows else None
        return rows, last, ReadSnapshot(running, xmax)

    # --- the high watermark, on the streaming thread --------------------------------------

    def _merge(self, chunk: _Chunk, high: Lsn) -> None:
        """The high watermark: publish what is left of the chunk, versioned at H."""
        self._open = None
        self.window_topic = None
        assert chunk.future is not None
        try:
            # The worker wrote H after its read: at most the encoding is left to wait for.
            read = chunk.future.result()
        except _Dropped as e:
            self._failed(chunk.snap, e)
            return
        cursor = self._cursor(chunk.snap)
        if cursor is None or chunk.snap not in self.state.queue:
            return  # stopped meanwhile
        if read.counted is not None:
            chunk.snap.estimated_rows = read.counted
        kept = merge_chunk(
            read.keys,
            read.seen,
            window_keys=chunk.window_keys,
            early=chunk.early,
            recent=chunk.recent,
            truncated=chunk.truncated,
        )
        if kept is None:
            # A transaction the stream already passed was not visible to the SELECT yet (its
            # commit record was written, its visibility not): its change is not in these
            # rows and will not come again. Read the chunk again, with new watermarks.
            self.retries += 1
            log.info(
                "chunk of %s read again: a streamed transaction was invisible", chunk.snap.name
            )
            return
        values = read.values
        txn = self._publisher.begin(high)
        # pgoutput gives the end of the watermark's record; a commit record may start right
        # there. One byte less still follows every commit before the watermark.
        lsn_header = str(high.value - 1).encode()
        keys = read.keys
        # The stream waits for this loop (the worst gap between streamed events is about it:
        # its length grows with incremental_chunk_rows), so the per-record work is done once.
        self._publisher.send_many(
            txn,
            chunk.topic,
            [(keys[i], values[i], version_headers(lsn_header, n)) for n, i in enumerate(kept)],
        )
        on_event = self._observer.on_event
        for _ in range(len(kept)):
            on_event("r")
        self._publisher.close_txn(txn, high)
        chunk.table = read.table
        chunk.last_key = read.last_key if read.last_key is not None else cursor.next_key
        chunk.complete = read.complete
        chunk.emitted = len(kept)
        chunk.dropped = len(read.keys) - len(kept)
        cursor.chunks = chunk.number
        cursor.next_key = chunk.last_key
        cursor.exhausted = read.complete
        self._acking.append((chunk, txn))

    def _finish(self, chunk: _Chunk) -> None:
        """The chunk is in Kafka: record the progress (the next run starts after it)."""
        snap = chunk.snap
        self.dropped += chunk.dropped
        if snap not in self.state.queue:
            return  # stopped meanwhile
        emitted = chunk.emitted
        snap.chunks = chunk.number
        snap.rows += emitted
        snap.last_key = chunk.last_key
        if chunk.complete:
            self.state.queue.remove(snap)
            self._cursors.pop(id(snap), None)
        self.save()
        self.chunks += 1
        log.info(
            "incremental snapshot chunk %d of %s done: %d rows, %d dropped for changes in "
            "its window, key up to %s",
            chunk.number,
            snap.name,
            emitted,
            chunk.dropped,
            ",".join(chunk.last_key or []),
            extra={"table": snap.name},
        )
        assert chunk.table is not None
        self._observer_progress(snap, chunk.table, complete=chunk.complete)
        if chunk.complete:
            log.info(
                "incremental snapshot of %s complete: %d rows in %d chunks",
                snap.name,
                snap.rows,
                snap.chunks,
                extra={"table": snap.name},
            )
            bar = self._bars.pop(id(snap), None)
            if bar is not None:
                bar[0].close()

    def _observer_progress(
        self, snap: TableSnapshot, table: TableSchema, *, complete: bool = False
    ) -> None:
        on_progress = getattr(self._observer, "on_snapshot_progress", None)
        if on_progress is not None:
            on_progress(snap.name, snap.rows, snap.estimated_rows, snap.chunks)
        bar = self._bars.get(id(snap))
        if bar is None:
            view = _Progress(table, snap.estimated_rows, snap.rows)
            bar = self._bars[id(snap)] = (SnapshotProgress([view], self._tty), view)
        bar[1].rows = snap.rows
        # Done is 100 %: rows a streamed change replaced, or an estimate too high, leave the
        # count below the estimate.
        bar[1].estimated_rows = snap.rows if complete else max(snap.estimated_rows, snap.rows)
        bar[0].update(bar[1], refresh=True)  # one frame per chunk


def _emit(conn: psycopg.Connection[Any], content: bytes) -> Lsn:
    """Write a watermark into the WAL; where its record ends (as pgoutput reports it)."""
    row = conn.execute(
        "SELECT pg_logical_emit_message(false, %s, %s::bytea)::text",
        (WATERMARK_PREFIX, content),
    ).fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def _count(conn: psycopg.Connection[Any], table: TableSchema) -> int:
    """The table's rows, counted (a table never analyzed has no estimate)."""
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table.schema, table.table))
    ).fetchone()
    return int(row[0]) if row else 0


def join_tables(state: SnapshotsState, tables: Sequence[Table]) -> list[Table]:
    """Tables of ``tables`` not captured before (all of them if nothing was recorded)."""
    if state.captured is None:
        return list(tables)
    return [t for t in tables if t not in state.captured]
