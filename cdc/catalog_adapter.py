"""Table schemas for the reader: a thin cache over pg_catalog.

These are the reader's own small queries, written while ``cdc.catalog`` was being written in
parallel; the pipeline should move to ``cdc.catalog`` once both agree. Keys follow one rule in both
the snapshot and the stream: the primary key, else the replica identity index columns, else
no key (null Kafka key).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from cdc import pgoutput
from schemas.model import Column, PgType, TableSchema

log = logging.getLogger(__name__)

_TYPES_SQL = """
SELECT t.oid, t.typname, t.typtype, t.typelem, t.typbasetype, t.typtypmod,
       coalesce((SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder)
                 FROM pg_enum e WHERE e.enumtypid = t.oid), '{}')
FROM pg_type t WHERE t.oid = ANY(%s)
"""

_KEY_SQL = """
SELECT c.relreplident,
       coalesce((SELECT array_agg(a.attname ORDER BY array_position(i.indkey::int2[], a.attnum))
                 FROM pg_index i JOIN pg_attribute a
                   ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                 WHERE i.indrelid = c.oid AND i.indisprimary), '{}'),
       coalesce((SELECT array_agg(a.attname ORDER BY array_position(i.indkey::int2[], a.attnum))
                 FROM pg_index i JOIN pg_attribute a
                   ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                 WHERE i.indrelid = c.oid AND i.indisreplident), '{}')
FROM pg_class c WHERE c.oid = %s
"""

_COLUMNS_SQL = """
SELECT a.attname, a.atttypid, a.atttypmod, NOT a.attnotnull
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""


def load_types(conn: psycopg.Connection[Any], oids: set[int]) -> dict[int, PgType]:
    """Resolve type oids (with array elements and domain bases) to PgType values."""
    rows: dict[int, tuple[Any, ...]] = {}
    todo = set(oids)
    while todo:
        found = conn.execute(_TYPES_SQL, (list(todo),)).fetchall()
        todo = set()
        for r in found:
            rows[r[0]] = r
            for dep in (r[3], r[4]):
                if dep and dep not in rows:
                    todo.add(dep)
    built: dict[int, PgType] = {}

    def build(oid: int) -> PgType:
        if oid in built:
            return built[oid]
        r = rows.get(oid)
        if r is None:  # unknown to the catalog: passed through as text
            t = PgType(oid, "unknown", "b")
        else:
            elem = build(r[3]) if r[3] and r[1].startswith("_") else None
            base = build(r[4]) if r[4] else None
            t = PgType(oid, r[1], r[2], elem, base, tuple(r[6] or ()), r[5])
        built[oid] = t
        return t

    return {oid: build(oid) for oid in oids}


class SchemaCatalog:
    """TableSchema by name (for the snapshot) or from a Relation message (for the stream)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def _keys(self, conn: psycopg.Connection[Any], oid: int) -> tuple[str, tuple[str, ...]]:
        row = conn.execute(_KEY_SQL, (oid,)).fetchone()
        if row is None:
            return "d", ()
        ident, pk, ri = row
        return str(ident), tuple(pk or ri or ())

    def load_table_in(self, conn: psycopg.Connection[Any], schema: str, table: str) -> TableSchema:
        """The table's schema as seen by ``conn`` (inside the snapshot's transaction)."""
        row = conn.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (schema, table),
        ).fetchone()
        if row is None:
            raise psycopg.errors.UndefinedTable(f"table {schema}.{table} does not exist")
        oid = int(row[0])
        cols = conn.execute(_COLUMNS_SQL, (oid,)).fetchall()
        types = load_types(conn, {int(c[1]) for c in cols})
        ident, keys = self._keys(conn, oid)
        return TableSchema(
            schema,
            table,
            tuple(
                Column(c[0], types[int(c[1])], int(c[2]), bool(c[3]), c[0] in keys) for c in cols
            ),
            keys,
            ident,
        )

    def from_relation(self, rel: pgoutput.Relation) -> TableSchema:
        """Schema for a Relation message: its columns, with keys and nullability from pg_catalog.

        A Relation message arrives again after DDL, so this is called for every one of them.
        """
        types = load_types(self.conn, {c.type_oid for c in rel.columns})
        _ident, keys = self._keys(self.conn, rel.relation_id)
        nullable = {
            r[0]: bool(r[3]) for r in self.conn.execute(_COLUMNS_SQL, (rel.relation_id,)).fetchall()
        }
        if not keys and rel.replica_identity == "f":
            keys = ()  # FULL without a primary key: every column is "key" in pgoutput; no key
        return TableSchema(
            rel.namespace,
            rel.name,
            tuple(
                Column(
                    c.name,
                    types[c.type_oid],
                    c.type_modifier,
                    nullable.get(c.name, True),
                    c.name in keys,
                )
                for c in rel.columns
            ),
            keys,
            rel.replica_identity,
        )
