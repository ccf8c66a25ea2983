"""``cdc snapshot``: check the request against the database, then write it signed into the WAL.

It acts only on what it checked: every table exists and is in the publication (a bare name
is looked for among the captured tables, never silently read as ``public.<name>``), can be
keyed, and ``--where`` passes the filter checks (:mod:`cdc.incremental.filters`) against
that table's columns. Anything else ends with one line (a :class:`ConfigError`) and
nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc.catalog import load_table
from cdc.connection import connect, current_database
from cdc.incremental.auth import SET_A_KEY, key_of, sign
from cdc.incremental.filters import FilterRefused, check_expression, check_on_server
from cdc.incremental.queue import Table
from cdc.incremental.signals import (
    SIGNAL_PREFIX,
    execute_document,
    quote_table,
    split_name,
    stop_document,
)
from cdc.publication import captured_tables
from pgcdc.core.errors import ConfigError, SchemaError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import PostgresSettings


@dataclass(frozen=True)
class Sent:
    """What ``cdc snapshot`` wrote."""

    signal_id: str
    kind: str  # execute-snapshot | stop-snapshot
    tables: list[Table]
    lsn: Lsn


def emit_signed(
    conn: psycopg.Connection[Any], key: bytes, document: dict[str, Any], slot: str
) -> Lsn:
    """Write ``document``, signed with ``key`` for the reader of this database and ``slot``,
    into the WAL as a transactional logical message; its LSN."""
    signed = sign(key, document, database=current_database(conn), slot=slot)
    row = conn.execute(
        "SELECT pg_catalog.pg_logical_emit_message(true, %s, %s::bytea)::text",
        (SIGNAL_PREFIX, signed),
    ).fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def send_snapshot_signal(
    pg: PostgresSettings, names: Sequence[str], where: str | None, stop: bool
) -> Sent:
    """Check the request (see the module docstring), then write it; ConfigError if any
    check fails."""
    found = key_of(pg)
    if found.key is None:
        raise ConfigError(f"cdc snapshot signs its signal, and {found.source}: {SET_A_KEY}")
    key = found.key
    if not names and not stop:
        raise ConfigError("name at least one table to snapshot (schema.table)")
    with connect(pg.dsn.get_secret_value(), application_name="cdc-snapshot-cli") as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = %s", (pg.publication_name,)
        ).fetchone()
        if exists is None:
            raise ConfigError(
                f"publication {pg.publication_name} does not exist: start the reader once "
                "(cdc run) so it captures the tables, then ask for a snapshot"
            )
        captured = captured_tables(conn, pg.publication_name)
        tables = [resolve_table(conn, n, captured, pg.publication_name) for n in names]
        if where and not stop:
            for table in tables:
                _check_where(conn, pg, table, where)
        elif not stop:
            for table in tables:
                _load(conn, pg, table)
        document = stop_document(tables) if stop else execute_document(tables, where)
        lsn = emit_signed(conn, key, document, pg.slot_name)
    return Sent(document["id"], document["type"], tables, lsn)


def resolve_table(
    conn: psycopg.Connection[Any], name: str, captured: Sequence[Table], publication: str
) -> Table:
    """The captured table ``name`` means (see the module docstring); ConfigError if none."""
    try:
        parts = split_name(name.strip())
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if len(parts) > 2:
        raise ConfigError(f"table {name!r} must be written as schema.table")
    if len(parts) == 2:
        table = (parts[0], parts[1])
        if table in captured:
            return table
        found = [table] if _exists(conn, table) else []
    else:
        matches = [t for t in captured if t[1] == parts[0]]
        if ("public", parts[0]) in matches:
            return ("public", parts[0])
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            listed = ", ".join(quote_table(t) for t in matches)
            raise ConfigError(f"table {name!r} is ambiguous: write one of {listed}")
        found = _named(conn, parts[0])
    if found:
        listed = ", ".join(quote_table(t) for t in found)
        raise ConfigError(
            f"table {listed} is not in publication {publication}, so the reader does not "
            "capture it: add it to the publication (or postgres.tables) first"
        )
    if len(parts) == 1:
        raise ConfigError(
            f"table {name!r} does not exist: no captured table and no public.{parts[0]} has "
            "that name (write it as schema.table)"
        )
    raise ConfigError(f"table {name!r} does not exist")


def _exists(conn: psycopg.Connection[Any], table: Table) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
        "AND c.relkind IN ('r', 'p')",
        table,
    ).fetchone()
    return row is not None


def _named(conn: psycopg.Connection[Any], name: str) -> list[Table]:
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.relname = %s AND c.relkind IN ('r', 'p') ORDER BY 1",
        (name,),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def _load(conn: psycopg.Connection[Any], pg: PostgresSettings, table: Table) -> list[str]:
    """The table's columns; ConfigError unless it can be read in chunks (it has a key)."""
    name = quote_table(table)
    try:
        loaded = load_table(conn, table[1], table[0], rules=pg.message_key_columns)
    except SchemaError as e:
        raise ConfigError(f"table {name}: {e}") from e
    if not loaded.key_columns:
        raise ConfigError(
            f"table {name} has no key to read it in chunks by: give it a primary key, or "
            "set CDC_POSTGRES__MESSAGE_KEY_COLUMNS for it"
        )
    return [c.name for c in loaded.columns]


def _check_where(
    conn: psycopg.Connection[Any], pg: PostgresSettings, table: Table, where: str
) -> None:
    columns = _load(conn, pg, table)
    try:
        checked = check_expression(where, columns, pg.signal_filter_functions)
        check_on_server(conn, checked, *table)
    except FilterRefused as e:
        raise ConfigError(f"--where is refused for {quote_table(table)}: {e}") from e
