"""PostgreSQL's side of ``cdc verify``: a table's rows in one ``REPEATABLE READ`` snapshot,
each as the document the followers are given for it, and the snapshot's fence LSN.

A row goes the way the reader and the jobs take it: read as text (``COPY … TO STDOUT``,
exactly the text pgoutput sends), encoded by the table's :class:`schemas.plan.EncodePlan`
into the Debezium ``after`` JSON and key, then turned into the followers' document by the
converter the caller gives (the jobs' own, :func:`pgcdc.verify.followers.document_converter`)
and keyed by :func:`sinks.base.key_id`-style document ids from the key payload. Tables are
read as the snapshotter reads them (:func:`cdc.published_rows.from_item`, the same catalog
and key rules as the reader).

The fence LSN is ``pg_current_wal_insert_lsn()`` read inside the snapshot's transaction,
after its first statement took the snapshot: every transaction the snapshot sees wrote its
commit record below it (see :mod:`pgcdc.verify`).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

import orjson
import psycopg
from psycopg import sql

from cdc import copy_render
from cdc.catalog import SchemaCatalog
from cdc.connection import connect
from cdc.publication import captured_tables, publishes_generated
from cdc.published_rows import from_item
from cdc.snapshot import each_copy_text_row, parse_copy_line
from pgcdc.core import native
from pgcdc.core.contract import table_id
from pgcdc.core.errors import ConfigError, VerifyError
from pgcdc.core.lsn import Lsn
from pgcdc.core.qualified_names import split_qualified
from pgcdc.core.row_digest import (
    Folds,
    add_folds,
    bucket,
    canonical,
    fold_into,
    folded,
    key_hash,
)
from pgcdc.core.settings import Settings
from schemas.formats import json_default
from schemas.model import TableSchema
from schemas.plan import EncodePlan


class DocumentConverter(Protocol):
    """The followers' document of a row, from its Debezium ``after`` JSON, per table (made
    once from the table's envelope schema JSON)."""

    def __call__(self, after_json: bytes, /) -> dict[str, Any]: ...

    def from_after(self, after: Mapping[str, Any], /) -> dict[str, Any]:
        """The same, given the ``after`` that JSON gives back unchanged (its values are
        text, integers, booleans or nulls)."""
        ...


ConverterFactory = Callable[[bytes], DocumentConverter]
# The types of values that come back from JSON as they went in (a float may not: NaN).
_AS_THEY_ARE = frozenset({str, int, bool, type(None)})
KeyId = Callable[[Mapping[str, Any]], str]
# Unpaced, a table of at least this many pages is folded by FOLD_PROCESSES processes, each
# over its own range of the table's pages (a TID range scan), in one exported snapshot.
FOLD_PROCESSES = 2
_SPLIT_PAGES = 2048  # 16 MB: under it, a second process costs more than it saves

# A range of a table's pages, ``[first, end)``; ``end`` None: to the table's end.
Pages = tuple[int, int | None]

_PACED_STEP = 500  # rows read between two words to the pacer

# Told of the rows each read returned, before the next is read: verify.max_rows_per_second's
# pacer (pgcdc.verify.pacing.RowPacer.take), which waits as long as the rate asks.
RowsRead = Callable[[int], object]


@dataclass(frozen=True)
class LeaderFold:
    """A table's rows in one snapshot folded by bucket, without holding them: the fence
    LSN, the folds, how many rows, and the documents' fields in sorted order."""

    lsn: int
    folds: Folds
    rows: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class Snapshot:
    """A table's rows (document id → document) and the fence LSN of the snapshot."""

    lsn: int
    rows: dict[str, dict[str, Any]]


def tables_to_verify(settings: Settings, asked: Collection[str]) -> list[tuple[str, str]]:
    """The tables to verify: those asked for (``schema.table``, or a bare name: the captured
    table of that name), each of which must be captured; else every table of the
    publication."""
    pg = settings.postgres
    with connect(pg.dsn.get_secret_value()) as conn:
        captured = captured_tables(conn, pg.publication_name)
    if not captured:
        raise ConfigError(
            f"publication {pg.publication_name!r} captures no table (has the reader run?)"
        )
    if not asked:
        return captured
    chosen: list[tuple[str, str]] = []
    for name in asked:
        if "." in name:
            try:
                wanted = [split_qualified(name)]
            except ValueError as e:
                raise ConfigError(str(e)) from e
            found = [t for t in captured if t in wanted]
        else:
            found = [t for t in captured if t[1] == name]
        if len(found) != 1:
            why = "is not captured" if not found else "names several captured tables"
            raise ConfigError(
                f"table {name!r} {why} by publication {pg.publication_name!r} "
                f"(captured: {', '.join(f'{s}.{t}' for s, t in captured)})"
            )
        if found[0] not in chosen:
            chosen.append(found[0])
    return chosen


# Key column types whose text in PostgreSQL is the document id (sinks.base.key_id: an int's
# digits, a text as it is; Debezium writes a uuid as PostgreSQL does, lower-case).
_ID_AS_TEXT = frozenset(("int2", "int4", "int8", "text", "varchar", "uuid"))


def _id_column(ts: TableSchema) -> str | None:
    """The key column whose ``::text`` is the document id, if the key is one such column."""
    if len(ts.key_columns) != 1:
        return None
    (name,) = ts.key_columns
    column = next(c for c in ts.columns if c.name == name)
    return name if column.type.name in _ID_AS_TEXT and column.dims == 0 else None


class PostgresLeader:
    """Reads captured tables in fresh snapshots (:meth:`read`)."""

    def __init__(
        self,
        settings: Settings,
        tables: Collection[tuple[str, str]],
        converter_for: ConverterFactory,
        key_id: KeyId,
        rows_read: RowsRead | None = None,
    ) -> None:
        self._settings = settings
        self._rows_read = rows_read
        self._names = {table_id(s, t): (s, t) for s, t in tables}
        self._converter_for = converter_for
        self._key_id = key_id
        self.reads = 0  # snapshots taken

    @property
    def table_ids(self) -> list[str]:
        """The tables' ids (``schema.table``, as the followers name them), in order."""
        return list(self._names)

    def read(
        self,
        table: str,
        keys: Collection[str] | None = None,
        *,
        on_lsn: Callable[[int], None] | None = None,
    ) -> Snapshot:
        """A fresh snapshot of ``table`` (a table id); with ``keys``, only their rows: read
        by key when the key is one integer, text or uuid column, else the whole table is
        read and the rest dropped (a later slice reads by key range). ``on_lsn`` is given
        the snapshot's fence LSN before the rows are read."""
        schema, name = self._names[table]
        pg = self._settings.postgres
        with connect(pg.dsn.get_secret_value()) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                return self._read_in_snapshot(conn, schema, name, keys, on_lsn)
            finally:
                conn.execute("ROLLBACK")

    def fold(
        self, table: str, *, on_start: Callable[[int, Sequence[str]], None] | None = None
    ) -> LeaderFold:
        """A fresh snapshot of ``table`` folded by bucket (:mod:`pgcdc.core.row_digest`),
        each row rendered as :meth:`read` renders it. ``on_start`` is given the snapshot's
        fence LSN and the documents' fields (the columns, sorted) before any row is read.

        Unpaced, the rows are rendered in a process of their own that reads the snapshot
        this one exports: here, reading and rendering would hold the interpreter's lock from
        the threads that drive the followers' folds (each call to Redis waiting its turn
        leaves Redis idle). A plain table of many pages whose rows Python renders (not the
        native module, :mod:`cdc.copy_render`) is split into
        :data:`FOLD_PROCESSES` ranges of pages, a process each, so that rendering, then the
        one long stretch of the pass, takes every core the stores leave idle. Paced
        (``verify.max_rows_per_second``), here: one token bucket serves the whole pass."""
        schema, name = self._names[table]
        pg = self._settings.postgres
        with connect(pg.dsn.get_secret_value()) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                exported = conn.execute("SELECT pg_export_snapshot()").fetchone()
                assert exported is not None
                lsn = self._fence(conn)
                _ts, plan, _query, at = self._copy_query(conn, schema, name, None)
                names = tuple(sorted(plan.names))
                if on_start is not None:
                    on_start(lsn, names)
                if self._rows_read is not None:
                    folds, count = self._fold_rows(conn, schema, name)
                else:
                    # Rows the native module renders cost a tenth of Python's: one process
                    # reads them faster than the stores fold theirs, and a second would
                    # only take CPU from those.
                    parts = 1 if copy_render.renders(plan, at) else FOLD_PROCESSES
                    ranges = _page_ranges(conn, schema, name, parts)
                    folds, count = self._fold_apart(table, str(exported[0]), ranges)
            finally:
                conn.execute("ROLLBACK")
        return LeaderFold(lsn, folds, count, names)

    def _fold_rows(
        self, conn: psycopg.Connection[Any], schema: str, name: str, pages: Pages | None = None
    ) -> tuple[Folds, int]:
        """The table's rows in ``conn``'s snapshot (those in ``pages``, if given) folded by
        bucket, and how many. With the native module, the COPY lines of a table whose
        columns it knows (:mod:`cdc.copy_render`) are rendered and folded there, and
        only the lines it hands back are rendered here."""
        _ts, plan, query, at = self._copy_query(conn, schema, name, None, pages)
        to_doc = self._converter_for(plan.envelope_schema_json)
        render, from_after, plain = plan.json_row, to_doc.from_after, _AS_THEY_ARE.issuperset
        folds: Folds = {}
        mod = native.module()
        folder = None if mod is None else mod.Folder()  # the hashing and adding up in Rust
        count = 0

        def fold(key: str, values: Sequence[Any]) -> None:
            after = render(values)
            if plain(map(type, after.values())):  # JSON would give it back as it is
                doc = from_after(after)
            else:
                doc = to_doc(orjson.dumps(after, default=json_default))
            if folder is not None:
                folder.add(key.encode(), canonical(doc))
            else:
                fold_into(folds, *folded(key, doc))

        lines = copy_render.copy_rows(plan, at)
        if lines is None:
            for key, values in self._copy_rows(conn, plan, query, at, None):
                fold(key, values)
                count += 1
        else:
            for left in self._native_rows(conn, query, lines):
                values = parse_copy_line(left.decode())
                fold(self._key(plan, at, values), values)
                count += 1
            count += lines.rows
            add_folds(folds, lines.folds())
        if folder is not None:
            add_folds(folds, folder.folds())
        return folds, count

    def _native_rows(
        self,
        conn: psycopg.Connection[Any],
        query: sql.Composed,
        lines: Any,
        picked: dict[str, dict[str, Any]] | None = None,
    ) -> Iterator[bytes]:
        """The COPY's lines given to ``lines`` (a ``pgcdc_native.CopyRows``) in batches, to
        fold, or with ``picked``, to put the documents of the rows in its chosen buckets
        there; yields the lines it hands back."""
        step = _PACED_STEP if self._rows_read is not None else 4096
        with conn.cursor() as cur, cur.copy(query) as copy:
            each = iter(copy)
            while batch := list(islice(each, step)):
                data = b"".join(batch)
                if picked is None:
                    yield from lines.add(data)
                else:
                    taken, left = lines.pick(data)
                    for key, text in taken:  # the canonical text is the document's JSON
                        picked[key.decode()] = orjson.loads(text)
                    yield from left
                if self._rows_read is not None:
                    self._rows_read(len(batch))  # the pace holds COPY back: the server waits

    def _fold_apart(
        self, table: str, snapshot: str, ranges: Sequence[Pages | None]
    ) -> tuple[Folds, int]:
        """:meth:`_fold_rows` of each range of pages in a process of its own, in the
        exported ``snapshot``, their folds added up."""
        ctx = multiprocessing.get_context("spawn")
        args = (self._settings, self._names[table], self._converter_for, self._key_id, snapshot)
        children = []
        try:
            for i, pages in enumerate(ranges):
                here, there = ctx.Pipe(duplex=False)
                child = ctx.Process(
                    target=_fold_apart, args=(there, *args, pages), name=f"verify-fold-{i}"
                )
                child.start()
                there.close()
                children.append((here, child))
            folds: Folds = {}
            count = 0
            for here, child in children:
                try:
                    said = here.recv()
                except EOFError:
                    raise VerifyError(
                        f"the process folding {table} ended (exit status {child.exitcode})"
                    ) from None
                if said[0] != "done":
                    raise said[1]
                part, rows = said[1]
                add_folds(folds, part)
                count += rows
            return folds, count
        finally:
            for here, child in children:
                here.close()
                child.join(timeout=5)
                if child.is_alive():
                    child.kill()
                    child.join()

    def read_buckets(self, table: str, buckets: frozenset[int]) -> Snapshot:
        """A fresh snapshot of ``table``'s rows whose ids fall in ``buckets`` (the others
        are read and passed over before they are rendered; with the native module, a line
        it renders is rendered before its id's bucket is known, in Rust)."""
        schema, name = self._names[table]
        pg = self._settings.postgres
        with connect(pg.dsn.get_secret_value()) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                lsn = self._fence(conn)
                _ts, plan, query, at = self._copy_query(conn, schema, name, None)
                to_doc = self._converter_for(plan.envelope_schema_json)

                def doc(values: Sequence[Any]) -> dict[str, Any]:
                    return to_doc(orjson.dumps(plan.json_row(values), default=json_default))

                lines = copy_render.copy_rows(plan, at)
                docs: dict[str, dict[str, Any]] = {}
                if lines is None:
                    for key, values in self._copy_rows(conn, plan, query, at, None):
                        if bucket(key_hash(key)) in buckets:
                            docs[key] = doc(values)
                else:
                    lines.choose(sorted(buckets))
                    for left in self._native_rows(conn, query, lines, docs):
                        values = parse_copy_line(left.decode())
                        key = self._key(plan, at, values)
                        if bucket(key_hash(key)) in buckets:
                            docs[key] = doc(values)
            finally:
                conn.execute("ROLLBACK")
        return Snapshot(lsn, docs)

    def key_values(
        self, table: str, ids: Collection[str]
    ) -> tuple[tuple[str, ...], list[tuple[str | None, ...]]]:
        """The key columns of ``table`` (a table id), and the text PostgreSQL gives now for
        the key of each row whose document id is in ``ids`` (rows gone since are left out)."""
        schema, name = self._names[table]
        with connect(self._settings.postgres.dsn.get_secret_value()) as conn:
            ts, _plan, rows = self._rows(conn, schema, name, ids)
            at = [[c.name for c in ts.columns].index(k) for k in ts.key_columns]
            # COPY's text: each value a str or None.
            found = [tuple(_text(values[i]) for i in at) for _key, values in rows]
        return tuple(ts.key_columns), found

    def _read_in_snapshot(
        self,
        conn: psycopg.Connection[Any],
        schema: str,
        name: str,
        keys: Collection[str] | None,
        on_lsn: Callable[[int], None] | None = None,
    ) -> Snapshot:
        lsn = self._fence(conn)
        if on_lsn is not None:
            on_lsn(lsn)
        self.reads += 1
        _ts, plan, found = self._rows(conn, schema, name, keys)
        to_doc = self._converter_for(plan.envelope_schema_json)
        rows: dict[str, dict[str, Any]] = {}
        for key, values in found:
            after = orjson.dumps(plan.json_row(values), default=json_default)
            rows[key] = to_doc(after)
        return Snapshot(lsn, rows)

    @staticmethod
    def _fence(conn: psycopg.Connection[Any]) -> int:
        """The snapshot's fence LSN, read inside it (see the module doc)."""
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return Lsn.parse(str(row[0])).value

    def _rows(
        self,
        conn: psycopg.Connection[Any],
        schema: str,
        name: str,
        keys: Collection[str] | None,
    ) -> tuple[TableSchema, EncodePlan, list[tuple[str, Sequence[Any]]]]:
        """The table's schema and encode plan, and its rows as ``COPY`` text values with
        their document ids: every row, or with ``keys`` those rows only (read by key when
        the key is one integer, text or uuid column, else the whole table is read and the
        rest dropped)."""
        ts, plan, rows = self._each_row(conn, schema, name, keys)
        return ts, plan, list(rows)

    def _each_row(
        self,
        conn: psycopg.Connection[Any],
        schema: str,
        name: str,
        keys: Collection[str] | None,
    ) -> tuple[TableSchema, EncodePlan, Iterator[tuple[str, Sequence[Any]]]]:
        """:meth:`_rows`, the rows read as they are taken (inside ``conn``'s transaction)."""
        ts, plan, query, at = self._copy_query(conn, schema, name, keys)
        wanted = None if keys is None else set(keys)
        return ts, plan, self._copy_rows(conn, plan, query, at, wanted)

    def _copy_query(
        self,
        conn: psycopg.Connection[Any],
        schema: str,
        name: str,
        keys: Collection[str] | None,
        pages: Pages | None = None,
    ) -> tuple[TableSchema, EncodePlan, sql.Composed, int | None]:
        """The table's schema and encode plan, the COPY of its rows (with ``keys``, of
        those rows when the key allows it; with ``pages``, of the rows in that range of
        the table's pages), and the index of the column whose text is the document id (None:
        the id is made from the key's JSON)."""
        pg = self._settings.postgres
        catalog = SchemaCatalog(
            conn, pg.message_key_columns, generated=publishes_generated(conn, pg.publication_name)
        )
        ts = catalog.load_table_in(conn, schema, name)
        plan = EncodePlan(ts, self._settings.schema_, self._settings.kafka.topic_prefix)
        cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in ts.columns)
        where: sql.Composable = sql.SQL("")
        by_id = _id_column(ts)
        if by_id is not None and keys is not None:
            # The document id is this column's text: only the asked rows are read.
            where = sql.SQL(" WHERE {}::text = ANY({})").format(
                sql.Identifier(by_id), sql.Literal(sorted(keys))
            )
        elif pages is not None:
            first, end = pages
            where = sql.SQL(" WHERE ctid >= {}::tid").format(sql.Literal(f"({first},0)"))
            if end is not None:
                where = sql.SQL("{} AND ctid < {}::tid").format(where, sql.Literal(f"({end},0)"))
        query = sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT").format(
            cols, from_item(conn, schema, name), where
        )
        at = None if by_id is None else [c.name for c in ts.columns].index(by_id)
        return ts, plan, query, at

    def _key(self, plan: EncodePlan, at: int | None, values: Sequence[Any]) -> str:
        """A COPY row's document id: column ``at``'s text, or made from the key's JSON."""
        key = values[at] if at is not None else None
        if not isinstance(key, str):  # a key of several columns, or of others
            key = self._key_id(orjson.loads(orjson.dumps(plan.json_key(values))))
        return key

    def _copy_rows(
        self,
        conn: psycopg.Connection[Any],
        plan: EncodePlan,
        query: sql.Composed,
        at: int | None,
        wanted: Collection[str] | None,
    ) -> Iterator[tuple[str, Sequence[Any]]]:
        """The COPY's rows as text values with their document ids (those in ``wanted``, if
        given), read as they are taken."""
        step, count = _PACED_STEP, 0
        with conn.cursor() as cur, cur.copy(query) as copy:
            for values in each_copy_text_row(copy):
                key = self._key(plan, at, values)
                if wanted is None or key in wanted:
                    yield key, values
                count += 1
                if count == step and self._rows_read is not None:
                    self._rows_read(count)  # the pace holds COPY back: the server waits
                    count = 0
        if count and self._rows_read is not None:
            self._rows_read(count)


def _page_ranges(
    conn: psycopg.Connection[Any], schema: str, name: str, parts: int
) -> list[Pages | None]:
    """``parts`` ranges of the table's pages, as it is in ``conn``'s snapshot (the last one
    open, for pages added since its size was read); ``[None]`` (the whole table, one
    process) for a small table, or for one that is not a plain table (a partitioned one's
    rows are in its partitions, each with pages of its own)."""
    row = conn.execute(
        "SELECT c.relkind, pg_catalog.pg_relation_size(c.oid)"
        " / pg_catalog.current_setting('block_size')::bigint"
        " FROM pg_catalog.pg_class c WHERE c.oid = %s::regclass",
        (sql.Identifier(schema, name).as_string(conn),),
    ).fetchone()
    if row is None or row[0] != "r" or parts < 2 or int(row[1]) < _SPLIT_PAGES:
        return [None]
    size = int(row[1])
    cuts = [size * i // parts for i in range(parts + 1)]
    return [(cuts[i], cuts[i + 1] if i + 1 < parts else None) for i in range(parts)]


def _fold_apart(
    out: Any,
    settings: Settings,
    names: tuple[str, str],
    converter_for: ConverterFactory,
    key_id: KeyId,
    snapshot: str,
    pages: Pages | None,
) -> None:
    """:meth:`PostgresLeader._fold_rows` (of ``pages``, if given) in a process of its own,
    in the exported ``snapshot``: ``("done", (folds, rows))`` or ``("error", exception)``
    goes to ``out``."""
    try:
        leader = PostgresLeader(settings, [names], converter_for, key_id)
        with connect(settings.postgres.dsn.get_secret_value()) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
                out.send(("done", leader._fold_rows(conn, *names, pages)))
            finally:
                conn.execute("ROLLBACK")
    except BaseException as e:  # said to the parent, which raises it
        try:
            out.send(("error", e))
        except Exception:  # an exception that does not pickle: its text
            out.send(("error", VerifyError(f"{type(e).__name__}: {e}")))
    finally:
        out.close()


def _text(value: object) -> str | None:
    """A key value of a ``COPY`` text row as it is (text, or None for NULL)."""
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"a key column's COPY value is {type(value).__name__}, not text")
