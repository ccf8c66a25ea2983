"""Load table and type descriptions from pg_catalog (the only SQL the event format needs).

``load_table`` reads a table by name or relation OID; ``load_types`` resolves type OIDs,
following array element types, domains down to their base and enum labels;
``table_from_relation`` turns a pgoutput Relation message's columns into a TableSchema;
:class:`SchemaCatalog` is what the reader uses: tables by name for the snapshot and by
Relation message for the stream, with one key rule for both (:mod:`cdc.keys`). Stored
generated columns are in only where the publication publishes them (PostgreSQL 18's
``publish_generated_columns = stored``): pgoutput sends them then, and only then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import psycopg

from cdc.keys import KeyFacts, KeylessWarnings, key_columns
from cdc.pgoutput import Relation
from pgcdc.core.errors import SchemaError
from pgcdc.core.key_columns import KeyColumns
from schemas.model import Column, PgType, TableSchema

log = logging.getLogger(__name__)

_TYPES_SQL = """
SELECT t.oid::int8, t.typname, t.typtype, t.typelem::int8, t.typbasetype::int8, t.typtypmod,
       t.typcategory,
       CASE WHEN t.typtype = 'e' THEN
         ARRAY(SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)
       END
FROM pg_type t WHERE t.oid = ANY(%s::oid[])
"""

_RELATION_SQL = """
SELECT c.oid::int8, n.nspname, c.relname, c.relreplident
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE {where}
"""

# Defaults and declared array dimensions feed the value schema (schemas.column_defaults).
# Stored generated columns ('s') only when the publication publishes them (the second
# parameter); virtual ones ('v', PostgreSQL 18) never: they are not in the WAL. A generated
# column's expression is no default.
_COLUMNS_SQL = """
SELECT a.attname, a.atttypid::int8, a.atttypmod, NOT a.attnotnull,
       CASE WHEN a.attgenerated = '' THEN pg_get_expr(d.adbin, d.adrelid) END, a.attndims
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
  AND (a.attgenerated = '' OR (%s AND a.attgenerated = 's'))
ORDER BY a.attnum
"""

# The primary key and the replica identity index, each with its columns in index order.
_KEY_INDEXES_SQL = """
SELECT i.indisprimary, i.indisreplident,
       ARRAY(SELECT a.attname::text
             FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             ORDER BY k.ord)
FROM pg_index i
WHERE i.indrelid = %s AND (i.indisprimary OR i.indisreplident)
"""


def load_types(conn: psycopg.Connection[Any], type_oids: Iterable[int]) -> dict[int, PgType]:
    """Resolve type OIDs (and every type they refer to) into PgTypes, keyed by OID."""
    rows: dict[int, tuple[Any, ...]] = {}
    wanted = {int(o) for o in type_oids}
    while wanted:
        found = conn.execute(_TYPES_SQL, (sorted(wanted),)).fetchall()
        missing = wanted - {int(r[0]) for r in found}
        if missing:
            raise SchemaError(f"type OIDs {sorted(missing)} are not in pg_type")
        wanted = set()
        for r in found:
            rows[int(r[0])] = r
            for ref in (int(r[3]), int(r[4])):
                if ref and ref not in rows:
                    wanted.add(ref)
    built: dict[int, PgType] = {}

    def build(oid: int) -> PgType:
        t = built.get(oid)
        if t is not None:
            return t
        _, name, kind, elem, base, typmod, category, labels = rows[oid]
        # Arrays are category 'A' with an element type; other types with typelem (point,
        # name) are fixed-length subscriptable, not arrays.
        element = build(int(elem)) if category == "A" and elem else None
        base_t = build(int(base)) if kind == "d" and base else None
        t = PgType(
            oid=oid,
            name=name,
            kind=kind,
            element=element,
            base=base_t,
            enum_values=tuple(labels or ()),
            typmod=int(typmod),
        )
        built[oid] = t
        return t

    for oid in rows:
        build(oid)
    return built


def load_table(
    conn: psycopg.Connection[Any],
    table: str | int,
    schema: str = "public",
    types: dict[int, PgType] | None = None,
    rules: Sequence[KeyColumns] = (),
    generated: bool = False,
) -> TableSchema:
    """A table's columns, key columns (:func:`cdc.keys.key_columns` with ``rules``) and
    replica identity, by name or relation OID; stored generated columns with ``generated``.

    ``types`` is a cache of PgTypes; it is filled with any type loaded here.
    """
    cols, facts = _describe(conn, table, schema, generated)
    keys = key_columns(facts, rules)
    cache = types if types is not None else {}
    need = {int(c[1]) for c in cols} - cache.keys()
    if need:
        cache.update(load_types(conn, need))
    columns = tuple(
        Column(
            name=name,
            type=cache[int(typid)],
            type_modifier=int(typmod),
            optional=bool(nullable) and name not in keys,
            part_of_key=name in keys,
            default=default,
            dims=int(dims),
        )
        for name, typid, typmod, nullable, default, dims in cols
    )
    return TableSchema(facts.schema, facts.table, columns, keys, facts.replica_identity)


def _describe(
    conn: psycopg.Connection[Any], table: str | int, schema: str, generated: bool = False
) -> tuple[list[tuple[Any, ...]], KeyFacts]:
    """The table's columns (name, type OID, typmod, nullable) and its key facts."""
    if isinstance(table, int):
        rel = conn.execute(_RELATION_SQL.format(where="c.oid = %s"), (table,)).fetchone()
    else:
        rel = conn.execute(
            _RELATION_SQL.format(where="n.nspname = %s AND c.relname = %s"), (schema, table)
        ).fetchone()
    if rel is None:
        raise SchemaError(
            f"table {table if isinstance(table, int) else f'{schema}.{table}'} not found"
        )
    relid, nsp, relname, replident = rel
    cols = conn.execute(_COLUMNS_SQL, (relid, generated)).fetchall()
    primary: tuple[str, ...] = ()
    index: tuple[str, ...] = ()
    for is_primary, is_identity, names in conn.execute(_KEY_INDEXES_SQL, (relid,)).fetchall():
        if is_primary:
            primary = tuple(names)
        if is_identity:
            index = tuple(names)
    names = tuple(c[0] for c in cols)
    identity = {"d": primary, "i": index, "f": names}.get(str(replident), ())
    facts = KeyFacts(
        schema=nsp,
        table=relname,
        replica_identity=str(replident),
        primary_key=primary,
        identity=identity,
        columns=names,
        not_null=frozenset(c[0] for c in cols if not c[3]),
    )
    return cols, facts


def table_from_relation(
    schema: str,
    table: str,
    replica_identity: str,
    columns: Sequence[tuple[int, str, int, int]],
    types: Mapping[int, PgType],
    not_null: frozenset[str] = frozenset(),
    key_order: Sequence[str] | None = None,
) -> TableSchema:
    """A TableSchema from a pgoutput Relation message.

    ``columns`` holds (flags, name, type OID, typmod) per column; flag 1 marks a key column.
    Relation messages do not say which columns are NOT NULL: pass ``not_null`` (e.g. from
    :func:`load_table`) to make them required, otherwise non-key columns are optional.
    ``key_order`` orders the key columns (default: column order).
    """
    cols = []
    keys = []
    for flags, name, type_oid, typmod in columns:
        t = types.get(type_oid)
        if t is None:
            raise SchemaError(
                f"table {schema}.{table} column {name}: type OID {type_oid} not loaded; "
                "call load_types first"
            )
        key = bool(flags & 1)
        if key:
            keys.append(name)
        cols.append(
            Column(name, t, typmod, optional=not key and name not in not_null, part_of_key=key)
        )
    if key_order is not None:
        keys = [k for k in key_order if k in keys]
    return TableSchema(schema, table, tuple(cols), tuple(keys), replica_identity)


def _with_defaults(table: TableSchema, cols: Sequence[tuple[Any, ...]]) -> TableSchema:
    """``table`` with each column's DEFAULT and declared dimensions from ``cols``
    (:data:`_COLUMNS_SQL` rows), where a column of that name is there."""
    extra = {c[0]: (c[4], int(c[5])) for c in cols}
    columns = tuple(
        replace(c, default=extra[c.name][0], dims=extra[c.name][1]) if c.name in extra else c
        for c in table.columns
    )
    return replace(table, columns=columns)


# Relation OID -> the primary key of a REPLICA IDENTITY FULL table, as the reader keyed it.
KnownKeys = dict[int, tuple[str, ...]]


class SchemaCatalog:
    """TableSchemas for the reader, with loaded types cached across tables.

    Keys follow :mod:`cdc.keys` with ``rules`` (``postgres.message_key_columns``); a keyless
    table is reported once (:class:`cdc.keys.KeylessWarnings`).

    A REPLICA IDENTITY FULL table is keyed by its primary key, which only pg_catalog knows
    (its Relation messages flag every column). Once the table is dropped, a replay of its
    changes would find it keyless and its compacted topic refused, at the same place on
    every restart. So the primary key of each such table is remembered by relation OID
    (``known_keys``, kept durable by the caller through ``on_learned``, before any change of
    the table is acknowledged) and a dropped table is keyed as its topic was.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        rules: Sequence[KeyColumns] = (),
        known_keys: KnownKeys | None = None,
        on_learned: Callable[[KnownKeys], None] | None = None,
        *,
        generated: bool = False,
    ) -> None:
        self.conn = conn
        self.rules = tuple(rules)
        # Whether the publication publishes stored generated columns (the snapshot reads
        # exactly the columns the stream carries).
        self.generated = generated
        self._types: dict[int, PgType] = {}
        self._keyless = KeylessWarnings()
        self.known_keys: KnownKeys = dict(known_keys or {})
        self._on_learned = on_learned

    def load_table_in(self, conn: psycopg.Connection[Any], schema: str, table: str) -> TableSchema:
        """The table as ``conn`` sees it (e.g. inside the snapshot's transaction)."""
        loaded = load_table(conn, table, schema, rules=self.rules, generated=self.generated)
        if not loaded.key_columns:
            self._keyless.note(loaded.schema, loaded.table)
        elif loaded.replica_identity == "f" and conn is self.conn:
            row = conn.execute(
                "SELECT c.oid::int8 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (loaded.schema, loaded.table),
            ).fetchone()
            if row is not None:
                self._learn(int(row[0]), loaded.key_columns)
        return loaded

    def _learn(self, relid: int, keys: tuple[str, ...]) -> None:
        if self.known_keys.get(relid) == keys:
            return
        self.known_keys[relid] = keys
        if self._on_learned is not None:
            self._on_learned(dict(self.known_keys))

    def from_relation(self, rel: Relation) -> TableSchema:
        """Schema for a Relation message (sent again after DDL, so called for each one).

        Columns, types and the replica identity come from the message, as they were when the
        change was made; so do the identity's columns (the message flags them), which are
        what an old row carries. pg_catalog adds NOT NULL, the primary key of a FULL table
        (the message flags every column then) and the index order of the key columns; for a
        table dropped since, the message alone decides.
        """
        need = {c.type_oid for c in rel.columns} - self._types.keys()
        if need:
            self._types.update(load_types(self.conn, need))
        flagged = tuple(c.name for c in rel.columns if c.is_key)
        names = tuple(c.name for c in rel.columns)
        ri = rel.replica_identity
        now_cols: list[tuple[Any, ...]] = []
        try:
            now_cols, now = _describe(self.conn, rel.relation_id, rel.namespace, self.generated)
        except SchemaError:
            log.warning(
                "table of a Relation message no longer exists",
                extra={"table": f"{rel.namespace}.{rel.name}"},
            )
            now = None
        identity = flagged if ri != "n" else ()
        if now is not None and set(now.identity) == set(identity):
            identity = now.identity  # the index's column order, as the snapshot keys it
        if now is not None:
            primary = now.primary_key if ri == "f" else identity if ri == "d" else ()
            not_null = now.not_null & set(names)
        elif ri == "f":
            # Dropped since: keyed as before (its topic was), or by a message_key_columns
            # entry, whose NOT NULL the catalog can no longer tell.
            primary = tuple(c for c in self.known_keys.get(rel.relation_id, ()) if c in names)
            not_null = frozenset(names)
        else:
            primary = identity if ri == "d" else ()
            not_null = frozenset(identity) if ri == "i" or ri == "d" else frozenset()
        facts = KeyFacts(rel.namespace, rel.name, ri, primary, identity, names, not_null)
        keys = key_columns(facts, self.rules)
        if now is not None and ri == "f" and keys and keys == now.primary_key:
            self._learn(rel.relation_id, keys)
        if not keys:
            self._keyless.note(rel.namespace, rel.name)
        key_set = set(keys)
        table = table_from_relation(
            rel.namespace,
            rel.name,
            ri,
            [
                (1 if c.name in key_set else 0, c.name, c.type_oid, c.type_modifier)
                for c in rel.columns
            ],
            self._types,
            not_null,
            key_order=keys,
        )
        return _with_defaults(table, now_cols)
