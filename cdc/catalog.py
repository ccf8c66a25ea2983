"""Load table and type descriptions from pg_catalog (the only SQL the event format needs).

``load_table`` reads a table by name or relation OID; ``load_types`` resolves type OIDs,
following array element types, domains down to their base and enum labels;
``table_from_relation`` turns a pgoutput Relation message's columns into a TableSchema;
:class:`SchemaCatalog` is what the reader uses: tables by name for the snapshot and by
Relation message for the stream, with one key rule for both (the primary key, else the replica
identity index, else no key). Generated columns are left out: pgoutput does not send them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg

from cdc.pgoutput import Relation
from pgcdc.core.errors import SchemaError
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

_COLUMNS_SQL = """
SELECT a.attname, a.atttypid::int8, a.atttypmod, NOT a.attnotnull
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""

# Primary key first, else the replica identity index; columns in index order.
_KEY_SQL = """
SELECT a.attname
FROM pg_index i
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indexrelid = (
  SELECT i2.indexrelid FROM pg_index i2
  WHERE i2.indrelid = %s AND (i2.indisprimary OR i2.indisreplident)
  ORDER BY i2.indisprimary DESC LIMIT 1)
ORDER BY k.ord
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
) -> TableSchema:
    """A table's columns, key columns and replica identity, by name or relation OID.

    ``types`` is a cache of PgTypes; it is filled with any type loaded here.
    """
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
    cols = conn.execute(_COLUMNS_SQL, (relid,)).fetchall()
    keys = tuple(r[0] for r in conn.execute(_KEY_SQL, (relid, relid)).fetchall())
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
        )
        for name, typid, typmod, nullable in cols
    )
    return TableSchema(nsp, relname, columns, keys, str(replident))


def table_from_relation(
    schema: str,
    table: str,
    replica_identity: str,
    columns: Sequence[tuple[int, str, int, int]],
    types: Mapping[int, PgType],
    not_null: frozenset[str] = frozenset(),
) -> TableSchema:
    """A TableSchema from a pgoutput Relation message.

    ``columns`` holds (flags, name, type OID, typmod) per column; flag 1 marks a key column.
    Relation messages do not say which columns are NOT NULL: pass ``not_null`` (e.g. from
    :func:`load_table`) to make them required, otherwise non-key columns are optional.
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
    return TableSchema(schema, table, tuple(cols), tuple(keys), replica_identity)


class SchemaCatalog:
    """TableSchemas for the reader, with loaded types cached across tables."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._types: dict[int, PgType] = {}

    def load_table_in(self, conn: psycopg.Connection[Any], schema: str, table: str) -> TableSchema:
        """The table as ``conn`` sees it (e.g. inside the snapshot's transaction)."""
        return load_table(conn, table, schema)

    def from_relation(self, rel: Relation) -> TableSchema:
        """Schema for a Relation message (sent again after DDL, so called for each one).

        Columns and types come from the message; keys and NOT NULL from pg_catalog, because the
        message's key flags mark every column under REPLICA IDENTITY FULL, while the Kafka key
        must be the primary key in the snapshot and the stream alike.
        """
        need = {c.type_oid for c in rel.columns} - self._types.keys()
        if need:
            self._types.update(load_types(self.conn, need))
        try:
            current = load_table(self.conn, rel.relation_id, types=self._types)
            key_order = current.key_columns
            not_null = frozenset(c.name for c in current.columns if not c.optional)
        except SchemaError:
            # Dropped since (a replay of its old changes): the message's flags are all we
            # have; under REPLICA IDENTITY FULL they mark every column, which is no key.
            log.warning(
                "table of a Relation message no longer exists",
                extra={"table": f"{rel.namespace}.{rel.name}"},
            )
            full = rel.replica_identity == "f"
            key_order = () if full else tuple(c.name for c in rel.columns if c.is_key)
            not_null = frozenset()
        keys = set(key_order)
        table = table_from_relation(
            rel.namespace,
            rel.name,
            rel.replica_identity,
            [
                (1 if c.name in keys else 0, c.name, c.type_oid, c.type_modifier)
                for c in rel.columns
            ],
            self._types,
            not_null,
        )
        # Key columns in index order (the Relation lists them in column order).
        order = tuple(k for k in key_order if any(c.name == k for c in table.columns))
        return TableSchema(table.schema, table.table, table.columns, order, table.replica_identity)
