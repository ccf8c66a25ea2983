"""The chunk reader: the PostgreSQL side of one incremental snapshot chunk, on a worker thread.

For a :class:`ChunkRequest` it, on a connection of its own,

1. writes the low watermark L (``pg_logical_emit_message(false, 'pgcdc-watermark', …)``:
   no table, no write access to user schemas);
2. opens a ``REPEATABLE READ, READ ONLY`` transaction with ``search_path = pg_catalog,
   pg_temp``, takes ``ACCESS SHARE`` on the table *before* its snapshot (``LOCK`` takes
   none), so no DDL commits between the snapshot and the read: the table's description, the
   captured set (the publication), the filter's check and the rows are all read inside that
   one snapshot (a table rewritten by ``ALTER … TYPE`` after a snapshot would look empty to
   it; the lock rules that out);
3. reads the rows, ``COPY (SELECT … WHERE (key) > (last key) [AND range] [AND filter] ORDER
   BY key LIMIT n)`` as text, and encodes them (keys, their identities, ``r`` events);
4. writes the high watermark H.

Failures come back as :class:`ChunkFailure`: *retry* (a statement or lock timeout, a
deadlock, a lost connection, missing privileges, anything the next attempt may not meet) or
*drop* (the table is gone or no longer captured, it has no usable key, the filter is
refused). The engine (:mod:`cdc.incremental.engine`) decides what to do with either.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc.connection import connect
from cdc.incremental.filters import (
    SAFE_SEARCH_PATH,
    CheckedFilter,
    FilterRefused,
    check_expression,
    check_on_server,
)
from cdc.incremental.merge import KeyId, ReadSnapshot, key_identity
from cdc.incremental.queue import KeyRange, KeyText
from cdc.published_rows import from_item
from pgcdc.core.errors import ConfigError, SchemaError
from pgcdc.core.lsn import Lsn
from pgcdc.core.values import RawValue
from schemas.envelope import EventEncoder
from schemas.model import SourceInfo, TableSchema

WATERMARK_PREFIX = "pgcdc-watermark"
Row = tuple[RawValue, ...]
SchemaLoader = Callable[[psycopg.Connection[Any], str, str], TableSchema]

# SQLSTATE classes the next attempt may not meet: transaction rollback (40), insufficient
# resources (53), object not in prerequisite state, e.g. lock_timeout (55), operator
# intervention, e.g. statement_timeout (57), system errors (58), connection errors (08).
_TRANSIENT_CLASSES = ("08", "40", "53", "55", "57", "58")


@dataclass(frozen=True)
class ChunkRequest:
    """What the engine asks the worker to read."""

    schema: str
    table: str
    where: str | None  # as the engine checked it; checked again here, inside the snapshot
    after: KeyText | None  # read keys after this one (exclusive)
    range: KeyRange | None  # and within this range
    rows: int  # at most this many
    count: bool  # the table has no estimate yet: give one
    low: bytes
    high: bytes
    publication: str
    filter_functions: tuple[str, ...] = ()


@dataclass
class ChunkRead:
    """A chunk as the worker read and encoded it."""

    table: TableSchema
    ids: list[KeyId]  # the rows' key identities, in key order (rows without a key left out)
    keys: list[bytes]  # their record keys
    values: list[bytes]  # their "r" events
    last_key: KeyText | None  # the last row's key columns (None: no row read)
    complete: bool  # fewer rows than asked: the table (or the range) ends with this chunk
    seen: ReadSnapshot
    estimated: int | None  # the table's estimated (or counted) rows, when asked


class ChunkFailure(Exception):
    """A chunk could not be read: ``retry`` it later, or drop the snapshot (the reason
    says which); ``timeout`` when a statement timeout cut it (a smaller chunk may fit)."""

    def __init__(self, reason: str, *, retry: bool, timeout: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry = retry
        self.timeout = timeout


class ChunkReader:
    """Reads chunks on its own connection (see the module docstring)."""

    def __init__(self, dsn: str, load_schema: SchemaLoader, encoder: EventEncoder) -> None:
        self._dsn = dsn
        self._load_schema = load_schema
        # Its own encoder: the streaming thread's plan cache is not shared across threads.
        self._encoder = EventEncoder(
            encoder.settings, encoder.topic_prefix, encoder.database, encoder.format
        )
        self._conn: psycopg.Connection[Any] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-chunk")

    def submit(self, request: ChunkRequest) -> Future[ChunkRead]:
        return self._pool.submit(self.read, request)

    def cancel(self) -> None:
        """Cancel a running query (at close: a long chunk need not run to its end)."""
        conn = self._conn
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                conn.cancel_safe()

    def close(self) -> None:
        self.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._conn is not None:
            self._conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn, application_name="cdc-snapshot-chunks")
        return self._conn

    def read(self, req: ChunkRequest) -> ChunkRead:
        """On the worker thread: L, the rows inside one read-only snapshot, their encoding,
        H. Raises ChunkFailure."""
        name = f"{req.schema}.{req.table}"
        try:
            conn = self._connection()
            low = _emit(conn, req.low)
            table, rows, seen, estimated = self._read_rows(conn, req)
        except FilterRefused as e:
            raise ChunkFailure(f"its filter is refused: {e}", retry=False) from e
        except psycopg.Error as e:
            raise _classify(e, req.where is not None, self._conn) from e
        # Encoded before H: the streaming thread, reaching H, finds the rows ready.
        encoder = self._encoder
        source = SourceInfo(int(time.time() * 1_000_000), "incremental", None, low.value, None)
        names = [c.name for c in table.columns]
        positions = [names.index(k) for k in table.key_columns]
        ids: list[KeyId] = []
        keys: list[bytes] = []
        values: list[bytes] = []
        for row in rows:
            key = encoder.encode_key(table, row)
            if key is None:
                continue
            try:
                values.append(encoder.encode_value(table, "r", None, row, source))
            except SchemaError as e:
                raise SchemaError(
                    f"cannot encode a snapshot row of {name} (key "
                    f"{key.decode(errors='replace')}): {e}"
                ) from e
            keys.append(key)
            ids.append(key_identity(row, positions))
        last = [str(rows[-1][i]) for i in positions] if rows else None
        complete = len(rows) < req.rows
        del rows
        try:
            _emit(self._connection(), req.high)
        except psycopg.Error as e:
            raise _classify(e, False, self._conn) from e
        return ChunkRead(table, ids, keys, values, last, complete, seen, estimated)

    def _read_rows(
        self, conn: psycopg.Connection[Any], req: ChunkRequest
    ) -> tuple[TableSchema, list[Row], ReadSnapshot, int | None]:
        ident = sql.Identifier(req.schema, req.table)
        rows: list[Row] = []
        # The filter is judged again before each chunk, outside the chunk's READ ONLY
        # transaction: the server compiles it in one of its own (check_on_server).
        checked = self._checked_filter(conn, req) if req.where else None
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur.execute(SAFE_SEARCH_PATH)
            try:
                # Before the snapshot: DDL committed before it is in it, none after it.
                cur.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(ident))
            except psycopg.errors.UndefinedTable as e:
                gone = f"table {req.schema}.{req.table} no longer exists"
                raise ChunkFailure(gone, retry=False) from e
            cur.execute(
                "SELECT pg_snapshot_xmax(s)::text::bigint, "
                "ARRAY(SELECT pg_snapshot_xip(s)::text::bigint) FROM pg_current_snapshot() s"
            )
            snap = cur.fetchone()
            assert snap is not None
            running = frozenset(int(x) & 0xFFFFFFFF for x in snap[1])
            seen = ReadSnapshot(running, int(snap[0]) & 0xFFFFFFFF)
            captured = cur.execute(
                "SELECT 1 FROM pg_publication_tables "
                "WHERE pubname = %s AND schemaname = %s AND tablename = %s",
                (req.publication, req.schema, req.table),
            ).fetchone()
            if captured is None:
                left = f"table {req.schema}.{req.table} is not in publication {req.publication}"
                raise ChunkFailure(left, retry=False)
            table = self._table(conn, req)
            if not table.key_columns:
                keyless = "it has no key to read it in chunks by (set it in message_key_columns)"
                raise ChunkFailure(keyless, retry=False)
            where = checked.sql if checked is not None else None
            rows_of = from_item(conn, req.schema, req.table)
            estimated = _estimate(conn, ident, rows_of) if req.count else None
            query = _chunk_query(table, where, req, rows_of)
            with cur.copy(query) as copy:
                copy.set_types(["text"] * len(table.columns))
                for r in copy.rows():
                    rows.append(r)
        return table, rows, seen, estimated

    def _table(self, conn: psycopg.Connection[Any], req: ChunkRequest) -> TableSchema:
        """The table's description; a ChunkFailure (not retried) if it cannot be read."""
        try:
            return self._load_schema(conn, req.schema, req.table)
        except SchemaError as e:
            raise ChunkFailure(str(e), retry=False) from e
        except ConfigError as e:
            raise ChunkFailure(f"it cannot be keyed: {e}", retry=False) from e

    def _checked_filter(self, conn: psycopg.Connection[Any], req: ChunkRequest) -> CheckedFilter:
        assert req.where is not None
        table = self._table(conn, req)
        checked = check_expression(req.where, [c.name for c in table.columns], req.filter_functions)
        check_on_server(conn, checked, req.schema, req.table)
        return checked


def _chunk_query(
    table: TableSchema, where: str | None, req: ChunkRequest, rows_of: sql.Composable
) -> sql.Composed:
    """The chunk's rows of ``rows_of`` (:func:`cdc.published_rows.from_item`), in key order."""
    cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns)
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in table.key_columns)

    def key_cmp(op: str, values: Sequence[str]) -> sql.Composed:
        literal = sql.SQL(", ").join(sql.Literal(v) for v in values)
        return sql.SQL("({}) {} ({})").format(keys, sql.SQL(op), literal)

    conds: list[sql.Composable] = []
    if req.after is not None:
        conds.append(key_cmp(">", req.after))
    elif req.range is not None and req.range.start is not None:
        conds.append(key_cmp(">=", req.range.start))
    if req.range is not None and req.range.end is not None:
        conds.append(key_cmp("<=", req.range.end))
    if where:
        conds.append(sql.SQL("({})").format(sql.SQL(where)))  # checked and deparsed
    cond = sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(conds)) if conds else sql.SQL("")
    return sql.SQL("COPY (SELECT {} FROM {}{} ORDER BY {} LIMIT {}) TO STDOUT").format(
        cols, rows_of, cond, keys, sql.Literal(req.rows)
    )


def _estimate(conn: psycopg.Connection[Any], ident: sql.Identifier, rows_of: sql.Composable) -> int:
    """The planner's estimate, or the rows counted for a table never analyzed (0 when the
    count itself runs into a statement timeout: the bar then shows no percentage)."""
    row = conn.execute(
        "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %s::regclass",
        (ident.as_string(conn),),
    ).fetchone()
    estimate = int(row[0]) if row else 0
    if estimate:
        return estimate
    try:
        with conn.transaction():
            counted = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(rows_of)).fetchone()
    except psycopg.errors.QueryCanceled:
        return 0
    return int(counted[0]) if counted else 0


def _emit(conn: psycopg.Connection[Any], content: bytes) -> Lsn:
    """Write a watermark into the WAL; where its record ends (as pgoutput reports it)."""
    row = conn.execute(
        "SELECT pg_catalog.pg_logical_emit_message(false, %s, %s::bytea)::text",
        (WATERMARK_PREFIX, content),
    ).fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def _classify(
    e: psycopg.Error, filtered: bool, conn: psycopg.Connection[Any] | None
) -> ChunkFailure:
    """What a server error means for the snapshot (see the module docstring)."""
    text = str(e).strip()
    line = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
    state = e.sqlstate or ""
    if isinstance(e, psycopg.errors.QueryCanceled):
        return ChunkFailure(line, retry=True, timeout=True)
    if conn is None or conn.closed or isinstance(e, psycopg.OperationalError):
        return ChunkFailure(line, retry=True)
    if state.startswith(_TRANSIENT_CLASSES):
        return ChunkFailure(line, retry=True)
    if filtered and state.startswith(("22", "42")) and state != "42501":
        return ChunkFailure(f"its filter fails: {line}", retry=False)
    return ChunkFailure(line, retry=True)
