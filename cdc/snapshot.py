"""Snapshotter: copies every captured table as ``op: "r"`` events, inside one snapshot.

Every worker connection imports the same snapshot (``SET TRANSACTION SNAPSHOT``), so a
parallel copy is exactly the database at the slot's consistent point. Tables are cut into
ctid ranges (PostgreSQL 14+ scans a TID range directly), which works for any table, with or
without a primary key. Rows are read with ``COPY (SELECT ...) TO STDOUT`` in text format:
the same text pgoutput sends, so snapshot and stream share one conversion path. The text is
split here (:func:`copy_text_rows`, a third of psycopg's ``copy.rows()`` cost) and rows are
encoded and sent :data:`KEY_BATCH` at a time (:class:`schemas.envelope.RowEvents`, the same
bytes as the per-row ``encode_change``; :meth:`cdc.publisher.Publisher.send_many`).

Workers read chunks in parallel; the calling thread encodes and publishes them in table and
chunk order, holding back one row so it can mark the last one (``source.snapshot``), the way
Debezium does: ``first`` on the first record, ``last`` on the very last,
``first_in_data_collection`` / ``last_in_data_collection`` on a table's first and last
records, ``true`` otherwise.

Keys already live in a table's topic (an earlier, interrupted snapshot, or a re-snapshot
after ``cdc reset-state`` or a lost slot) are compared with the snapshot's keys by value, not
bytes (:meth:`schemas.envelope.EventEncoder.key_identity`): a key whose row is still there
but whose bytes changed (``schemas_enable`` switched, a key column from int to bigint) gets
a tombstone for its old bytes ordered before its new ``r`` record, so followers keep the
row and compaction drops the old bytes; keys whose row is gone get tombstones after the
snapshot's rows. The live keys are kept on disk (:mod:`cdc.live_keys`).

An interrupted snapshot is not resumed: its exported snapshot died with the connection. The
next run drops the slot that was never streamed from and starts over (see
:func:`cdc.slots.plan_start`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.abc import Buffer

from cdc.connection import CURRENT_WAL_LSN, connect, first_line
from cdc.connection_lost import connection_bad, connection_lost
from cdc.live_keys import LiveKeys, scan_many
from cdc.published_rows import from_item
from cdc.publisher import Publisher
from cdc.snapshot_progress import SnapshotProgress, estimate_rows
from cdc.table_topics import TableTopics
from pgcdc.core.contract import HEADER_COMMIT_LSN, HEADER_ORDER
from pgcdc.core.errors import CdcError, ConnectionFailed, SnapshotError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import KafkaSettings
from pgcdc.core.values import RawValue
from schemas.envelope import Record, RowEvents
from schemas.model import SourceInfo, TableSchema

log = logging.getLogger(__name__)

Row = Sequence[RawValue]
SchemaLoader = Callable[[psycopg.Connection[Any], str, str], TableSchema]


KEY_BATCH = 1_000  # rows encoded, compared with the live keys and sent at once

# COPY's text format escapes (what COPY TO writes; ``\N`` is a null field).
_COPY_ESCAPE = re.compile(r"\\[btnvfr\\]")
_COPY_UNESCAPE = {"\\" + c: e for c, e in zip("btnvfr\\", "\b\t\n\v\f\r\\", strict=True)}


def _unescape(m: re.Match[str]) -> str:
    return _COPY_UNESCAPE[m.group(0)]


def parse_copy_line(line: str) -> Sequence[str | None]:
    """One line of ``COPY ... TO STDOUT`` text (without its newline) as its fields: the
    same values psycopg's ``copy.rows()`` gives with every column loaded as text."""
    fields = line.split("\t")
    if "\\" not in line:
        return fields
    sub = _COPY_ESCAPE.sub
    return [None if f == "\\N" else sub(_unescape, f) if "\\" in f else f for f in fields]


def copy_text_rows(copy: Iterable[Buffer]) -> list[Row]:
    """The rows of a ``COPY ... TO STDOUT`` in text format (UTF-8), each value text or None:
    what psycopg's ``copy.rows()`` gives with every column loaded as text, at a third of
    its cost. One COPY message is one line; a line without a backslash has neither escapes
    nor nulls."""
    return list(each_copy_text_row(copy))


def each_copy_text_row(copy: Iterable[Buffer]) -> Iterator[Row]:
    """:func:`copy_text_rows` one row at a time (a table read through without holding it)."""
    for data in copy:
        line = bytes(data)[:-1].decode()
        yield parse_copy_line(line) if "\\" in line else line.split("\t")


class SnapshotInterrupted(SnapshotError):
    """A stop was requested during the snapshot."""


class Encoder(Protocol):
    """The part of ``schemas.envelope.EventEncoder`` the snapshotter uses."""

    def topic(self, table: TableSchema) -> str: ...
    def key_identity(self, table: TableSchema, key: bytes) -> bytes: ...
    def row_events(
        self, table: TableSchema, op: str, source: SourceInfo, transaction: Any = None
    ) -> RowEvents: ...


@dataclass(frozen=True)
class Chunk:
    table_index: int
    first_page: int
    end_page: int | None  # None: to the end of the table


@dataclass
class TablePlan:
    schema: TableSchema
    pages: int
    estimated_rows: int | None  # None: never analyzed and too large to count
    rows_of: sql.Composable  # what is read (cdc.published_rows.from_item)
    chunks: list[Chunk] = field(default_factory=list)
    rows: int = 0


@dataclass(frozen=True)
class SnapshotResult:
    position: Lsn
    tables: int
    rows: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def snapshot_marker(first_overall: bool, last_overall: bool, first_in: bool, last_in: bool) -> str:
    """Debezium's ``source.snapshot`` value for a snapshot record."""
    if last_overall:
        return "last"
    if first_overall:
        return "first"
    if last_in:
        return "last_in_data_collection"
    if first_in:
        return "first_in_data_collection"
    return "true"


def _count(conn: psycopg.Connection[Any], rows_of: sql.Composable) -> int:
    """The rows of a table in the snapshot ``conn`` reads."""
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(rows_of)).fetchone()
    return int(row[0]) if row else 0


def _begin_in_snapshot(conn: psycopg.Connection[Any], snapshot_name: str) -> None:
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))


def _snapshot_xid(conn: psycopg.Connection[Any]) -> int | None:
    """source.txId of snapshot records: the snapshot's xmax, the first transaction it does not
    see (a read-only snapshot has no transaction id of its own; Debezium's is the one it takes
    for its snapshot transaction, just after)."""
    row = conn.execute("SELECT txid_snapshot_xmax(txid_current_snapshot())").fetchone()
    return None if row is None else int(row[0])


class Snapshotter:
    """Copies the captured tables inside an exported snapshot and publishes ``r`` events."""

    def __init__(
        self,
        dsn: str,
        *,
        encoder: Encoder,
        publisher: Publisher,
        table_topics: TableTopics,
        kafka: KafkaSettings,
        load_schema: SchemaLoader,
        workers: int = 2,
        chunk_rows: int = 50_000,
        progress: bool | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self._dsn = dsn
        self._encoder = encoder
        self._publisher = publisher
        self._table_topics = table_topics
        self._kafka = kafka
        self._load_schema = load_schema
        self._workers = workers
        self._chunk_rows = chunk_rows
        self._progress = sys.stderr.isatty() if progress is None else progress
        self._stop = stop or threading.Event()
        self._cancel = threading.Event()  # stops queued chunk reads after a failure
        self._local = threading.local()
        self._worker_conns: list[psycopg.Connection[Any]] = []
        self._conns_lock = threading.Lock()
        self._xid: int | None = None  # source.txId of the snapshot's records

    # --- public -------------------------------------------------------------------------

    def run(
        self,
        tables: Sequence[tuple[str, str]],
        snapshot_name: str | None,
        position: Lsn | None,
    ) -> SnapshotResult:
        """Publish every row of ``tables`` as of the snapshot; return what was done.

        With ``snapshot_name`` None (``initial_only``, no slot) a snapshot is exported here and
        ``position`` is the server's WAL position inside it.
        """
        started = time.monotonic()
        try:
            with connect(self._dsn) as lead:
                if snapshot_name is None:
                    lead.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    row = lead.execute(
                        f"SELECT pg_export_snapshot(), ({CURRENT_WAL_LSN})::text"
                    ).fetchone()
                    assert row is not None
                    snapshot_name, position = row[0], Lsn.parse(row[1])
                else:
                    _begin_in_snapshot(lead, snapshot_name)
                assert position is not None
                self._xid = _snapshot_xid(lead)
                plans = self._plan(lead, tables)
                # The lead keeps its transaction (and so the exported snapshot) open throughout.
                rows = self._copy_all(plans, snapshot_name, position)
                lead.execute("COMMIT")
        except psycopg.Error as e:
            raise self._failed(e) from e
        finally:
            self._close_workers()
        result = SnapshotResult(position, len(plans), rows, time.monotonic() - started)
        log.info(
            "snapshot complete: %d rows from %d tables in %.1fs (%.0f rows/s)",
            result.rows,
            result.tables,
            result.seconds,
            result.rows_per_s,
            extra={"lsn": str(position)},
        )
        return result

    def _failed(self, e: psycopg.Error) -> CdcError:
        """A snapshot that lost PostgreSQL (its error, or a worker's connection, says so) is
        worth starting over: ConnectionFailed. Anything else is a SnapshotError."""
        with self._conns_lock:
            bad = any(connection_bad(c.pgconn) for c in self._worker_conns)
        if bad or connection_lost(e):
            return ConnectionFailed(f"snapshot failed: {first_line(e)}")
        return SnapshotError(f"snapshot failed: {e}")

    # --- planning -----------------------------------------------------------------------

    def _plan(
        self, conn: psycopg.Connection[Any], tables: Sequence[tuple[str, str]]
    ) -> list[TablePlan]:
        plans: list[TablePlan] = []
        for i, (schema, table) in enumerate(tables):
            ts = self._load_schema(conn, schema, table)
            ident = sql.Identifier(schema, table)
            row = conn.execute(
                "SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint, "
                "c.reltuples FROM pg_class c WHERE c.oid = %s::regclass",
                (ident.as_string(conn),),
            ).fetchone()
            pages, reltuples = (int(row[0]), float(row[1])) if row else (0, 0.0)
            rows_of = from_item(conn, schema, table)
            est = estimate_rows(reltuples, pages, partial(_count, conn, rows_of))
            plan = TablePlan(ts, pages, est, rows_of)
            rows_per_page = max(1.0, est / pages) if pages and est else 50.0
            step = max(1, int(self._chunk_rows / rows_per_page))
            first = 0
            while first + step < pages:
                plan.chunks.append(Chunk(i, first, first + step))
                first += step
            plan.chunks.append(Chunk(i, first, None))  # open-ended: covers any growth
            plans.append(plan)
        return plans

    # --- copying ------------------------------------------------------------------------

    def _worker_conn(self, snapshot_name: str) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self._dsn)
            _begin_in_snapshot(conn, snapshot_name)
            self._local.conn = conn
            with self._conns_lock:
                self._worker_conns.append(conn)
        return conn

    def _close_workers(self) -> None:
        with self._conns_lock:
            for conn in self._worker_conns:
                conn.close()
            self._worker_conns.clear()

    def _read_chunk(self, plan: TablePlan, chunk: Chunk, snapshot_name: str) -> list[Row]:
        if self._stop.is_set() or self._cancel.is_set():
            return []
        conn = self._worker_conn(snapshot_name)
        cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in plan.schema.columns)
        where = sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({chunk.first_page},0)"))
        if chunk.end_page is not None:
            where = sql.SQL("{} AND ctid < {}::tid").format(
                where, sql.Literal(f"({chunk.end_page},0)")
            )
        query = sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT").format(
            cols, plan.rows_of, where
        )
        out: list[Row] = []
        if self._stop.is_set() or self._cancel.is_set():  # stopped while it connected
            return []
        with conn.cursor() as cur, cur.copy(query) as copy:
            if conn.info.encoding != "utf-8" or not plan.schema.columns:
                # Load every column as text: exactly the text pgoutput would send.
                copy.set_types(["text"] * len(plan.schema.columns))
                out.extend(copy.rows())
                return out
            return copy_text_rows(self._until_stopped(copy))

    def _until_stopped(self, lines: Iterable[Buffer]) -> Iterator[Buffer]:
        """A COPY's lines, ending early once a stop (or a failure elsewhere) is asked for:
        the read need not run to the chunk's end, whatever the cancel request's timing."""
        for n, line in enumerate(lines):
            if not n & 0x3FF and (self._stop.is_set() or self._cancel.is_set()):
                raise SnapshotInterrupted("snapshot interrupted; it restarts on the next run")
            yield line

    def _chunks_in_order(
        self, plans: list[TablePlan], snapshot_name: str
    ) -> Iterator[tuple[int, list[Row]]]:
        """Chunks read by the pool, yielded in table and chunk order, a few read ahead."""
        todo = deque((plans[c.table_index], c) for p in plans for c in p.chunks)
        window: deque[tuple[int, Future[list[Row]]]] = deque()
        with ThreadPoolExecutor(self._workers, thread_name_prefix="snapshot") as pool:
            try:
                while todo or window:
                    while todo and len(window) < self._workers + 1:
                        plan, chunk = todo.popleft()
                        fut = pool.submit(self._read_chunk, plan, chunk, snapshot_name)
                        window.append((chunk.table_index, fut))
                    index, fut = window.popleft()
                    while True:
                        self._raise_if_stopped()
                        try:
                            rows = fut.result(timeout=0.05)  # a stop is seen this soon
                            break
                        except TimeoutError:
                            self._publisher.poll(0)  # keep delivery reports flowing
                    self._raise_if_stopped()
                    yield index, rows
            finally:
                self._cancel.set()  # let queued chunks return at once
                for _, f in window:
                    f.cancel()
                if self._stop.is_set():
                    self._cancel_reads()  # a chunk's COPY need not run to its end

    def _raise_if_stopped(self) -> None:
        if self._stop.is_set():
            raise SnapshotInterrupted("snapshot interrupted; it restarts on the next run")

    def _cancel_reads(self) -> None:
        """Ask the server to cancel the workers' running COPYs (their threads then return),
        all at once: each cancel request is a connection of its own."""
        with self._conns_lock:
            conns = list(self._worker_conns)

        def cancel(conn: psycopg.Connection[Any]) -> None:
            with contextlib.suppress(psycopg.Error):
                conn.cancel_safe(timeout=1.0)

        threads = [threading.Thread(target=cancel, args=(c,), daemon=True) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(1.5)

    def _tick(self) -> None:
        """Between reads of a topic's live keys: serve deliveries, give way to a stop."""
        self._publisher.poll(0)
        self._raise_if_stopped()

    def _live_keys(self, plans: list[TablePlan], topics: list[str]) -> list[LiveKeys | None]:
        """Each keyed table's live keys with their identities (None for a keyless table)."""
        scans = [
            (topic, partial(self._encoder.key_identity, p.schema)) if p.schema.key_columns else None
            for p, topic in zip(plans, topics, strict=True)
        ]
        return scan_many(self._kafka, scans, tick=self._tick)

    def _copy_all(self, plans: list[TablePlan], snapshot_name: str, position: Lsn) -> int:
        topics = [self._encoder.topic(p.schema) for p in plans]
        for plan, topic in zip(plans, topics, strict=True):
            table = plan.schema
            self._table_topics.ensure(
                topic, keyless=not table.key_columns, table=f"{table.schema}.{table.table}"
            )
        stale = self._live_keys(plans, topics)
        try:
            return self._copy_tables(plans, topics, stale, snapshot_name, position)
        finally:
            for store in stale:
                if store is not None:
                    store.close()

    def _copy_tables(
        self,
        plans: list[TablePlan],
        topics: list[str],
        stale: list[LiveKeys | None],
        snapshot_name: str,
        position: Lsn,
    ) -> int:
        txn = self._publisher.begin(position)
        # Snapshot rows must sort before every streamed change. A transaction can commit with
        # its commit record exactly at the consistent point, and it is streamed (not in the
        # snapshot): so the snapshot's version is the LSN just before that point.
        headers_lsn = str(position.value - 1).encode()
        # A re-snapshot's tombstone for a key's old bytes stays in the old bytes' partition
        # (compaction must see it there), so with several partitions a follower may apply it
        # after the new row of the same key value: one LSN lower than every snapshot row, it
        # loses to that row in both followers (OpenSearch compares the LSN alone).
        tombstone_lsn = str(position.value - 2).encode()
        progress = SnapshotProgress(plans, self._progress)
        counter = 0  # records written (the order in the snapshot's version)
        emitted = 0  # rows written
        # The last row read, held back until the next one shows whether it is the last of
        # its table: (table index, row, its record as a "true" one, first in its table).
        held: tuple[int, Row, Record, bool] | None = None
        ts_us = int(time.time() * 1_000_000)
        # One RowEvents per table and source.snapshot marker: all but a few rows are "true".
        row_events: dict[tuple[int, str], RowEvents] = {}

        def events(index: int, marker: str) -> RowEvents:
            ev = row_events.get((index, marker))
            if ev is None:
                source = SourceInfo(ts_us, marker, self._xid, position.value, None)
                ev = self._encoder.row_events(plans[index].schema, "r", source)
                row_events[(index, marker)] = ev
            return ev

        def send(
            index: int,
            records: Sequence[tuple[bytes | None, bytes | None]],
            lsn: bytes = headers_lsn,
        ) -> None:
            """Records of table ``index``, each with the next order (as version_headers)."""
            nonlocal counter
            first = counter
            counter += len(records)
            self._publisher.send_many(
                txn,
                topics[index],
                [
                    (key, value, [(HEADER_COMMIT_LSN, lsn), (HEADER_ORDER, b"%d" % order)])
                    for order, (key, value) in enumerate(records, first)
                ],
            )

        def emit_held(last_in: bool, last_overall: bool) -> None:
            nonlocal emitted
            assert held is not None
            index, row, record, first_in = held
            marker = snapshot_marker(emitted == 0, last_overall, first_in, last_in)
            if marker != "true":
                record = events(index, marker).encode([row])[0]
            emitted += 1
            send(index, [record])

        def tombstones_of_old_bytes(index: int, records: list[Record]) -> None:
            """Old bytes of these rows' keys get their tombstones, before the rows."""
            store = stale[index]
            if store is not None and len(store):
                table = plans[index].schema
                identity = self._encoder.key_identity
                claimed = [(k, identity(table, k)) for k, _ in records if k]
                old: list[tuple[bytes | None, bytes | None]] = [
                    (key, None) for key in store.claim(claimed)
                ]
                if old:
                    send(index, old, tombstone_lsn)

        try:
            current = -1
            first_in = True
            for index, rows in self._chunks_in_order(plans, snapshot_name):
                plan = plans[index]
                if index != current:
                    current = index
                    first_in = True
                # A slice at a time: each value holds a few kB until it is sent.
                for start in range(0, len(rows), KEY_BATCH):
                    self._raise_if_stopped()
                    part = rows[start : start + KEY_BATCH]
                    records = events(index, "true").encode(part)
                    tombstones_of_old_bytes(index, records)
                    if held is not None:
                        emit_held(held[0] != index, False)
                    body = records[:-1]
                    if body:
                        if first_in:  # the table's first row: its own marker
                            marker = snapshot_marker(emitted == 0, False, True, False)
                            body[0] = events(index, marker).encode(part[:1])[0]
                            first_in = False
                        emitted += len(body)
                        send(index, body)
                    held = (index, part[-1], records[-1], first_in)
                    first_in = False
                plan.rows += len(rows)
                progress.update(plan)
            if held is not None:
                emit_held(True, True)
            for index, store in enumerate(stale):
                if store is None or not len(store):
                    continue
                log.info(
                    "%d keys in %s are gone since an earlier snapshot: tombstones",
                    len(store),
                    topics[index],
                    extra={"topic": topics[index]},
                )
                gone: list[tuple[bytes | None, bytes | None]] = []
                for key in store:
                    gone.append((key, None))
                    if len(gone) == KEY_BATCH:
                        send(index, gone)
                        gone = []
                send(index, gone)
        finally:
            progress.close()
        self._publisher.close_txn(txn, position)
        self._publisher.settle(timeout_s=300, stop=self._stop)
        return sum(p.rows for p in plans)
