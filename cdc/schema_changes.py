"""A captured table's shape as the followers see it, and what changed between two shapes.

pgoutput sends a table's Relation message before its first change in a session and again
after DDL. The reader keeps each captured table's last shape in its state record
(:class:`cdc.incremental.queue.SnapshotsState` ``relations``), so a change of shape is seen
whether it happened while the reader ran or while it was stopped. Log-based change capture
carries no event for DDL: a row that does not change after ``ALTER TABLE … DROP COLUMN``,
``RENAME COLUMN``, ``ALTER COLUMN … TYPE … USING …`` or ``ADD COLUMN … DEFAULT …`` keeps
its old shape in every follower, and only PostgreSQL knows its new values (a ``USING``
expression can compute anything). So a change of shape snapshots the table again,
incrementally (:meth:`cdc.incremental.requests.Requests.schema_changed`): every row is
published again in its new shape, and a follower that replaces whole rows ends equal.

A table altered and not written since sends no Relation message, so the engine also reads the
published tables' shapes from the catalog (:func:`published_shapes`) every few seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from pgcdc.core.qualified_names import quote_table
from schemas.model import TableSchema

# [[column, type name, type modifier], ...] in column order, as JSON keeps it.
Shape = list[list[Any]]


def shape(schema: TableSchema) -> Shape:
    """The columns, their types and modifiers, in order: what a follower's rows hold."""
    return [[c.name, c.type.name, c.type_modifier] for c in schema.columns]


def describe(before: Sequence[Sequence[Any]], after: Sequence[Sequence[Any]]) -> str:
    """What changed, for a log line: ``qty int4 -> text; name dropped; tags added``."""
    old = {c[0]: _type(c) for c in before}
    new = {c[0]: _type(c) for c in after}
    parts = [
        f"{name} {old[name]} -> {t}" for name, t in new.items() if name in old and old[name] != t
    ]
    parts += [f"{name} dropped" for name in old if name not in new]
    parts += [f"{name} added" for name in new if name not in old]
    if not parts:
        parts.append("columns reordered")
    return "; ".join(parts)


def _type(column: Sequence[Any]) -> str:
    _name, type_name, typmod = column
    return str(type_name) if typmod == -1 else f"{type_name}({typmod})"


# The published tables' columns as pgoutput describes them in a Relation message: in column
# order, dropped ones out, a publication's column list applied (PostgreSQL 15+), stored
# generated columns only when the publication publishes them (the second parameter).
_SHAPES_SQL = """
SELECT p.schemaname, p.tablename, a.attname, t.typname, a.atttypmod
FROM pg_catalog.pg_publication_tables p
JOIN pg_catalog.pg_namespace n ON n.nspname = p.schemaname
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
WHERE p.pubname = %s AND a.attnum > 0 AND NOT a.attisdropped
  AND (p.attnames IS NULL OR a.attname = ANY (p.attnames))
  AND (a.attgenerated = '' OR (%s AND a.attgenerated = 's'))
ORDER BY p.schemaname, p.tablename, a.attnum
"""


def published_shapes(
    conn: psycopg.Connection[Any], publication: str, generated: bool
) -> dict[str, Shape]:
    """Every published table's shape, by ``schema.table`` (:func:`quote_table`, the key of
    ``relations``), from the catalog in one query: a table altered and not written since has
    sent no Relation message yet."""
    out: dict[str, Shape] = {}
    for schema, table, column, type_name, typmod in conn.execute(
        _SHAPES_SQL, (publication, generated)
    ).fetchall():
        out.setdefault(quote_table((schema, table)), []).append([column, type_name, int(typmod)])
    return out
