"""The publication the slot streams: what the reader may create or change, and what it captures.

``postgres.publication_autocreate_mode`` is Debezium's ``publication.autocreate.mode``:

- ``all_tables``: create it ``FOR ALL TABLES`` if missing (a superuser's right); an existing
  one is used as it is.
- ``disabled``: never create or alter it. It must exist, made beforehand by its owner, so
  the reader's role needs no ownership at all; with ``postgres.tables`` listed, it must
  cover exactly those tables.
- ``filtered``: create it for exactly ``postgres.tables``, or set an existing one's tables
  to them, only when they differ (a publication a DBA already made right is left alone).
- ``no_tables``: create it without tables if missing; its owner adds tables later.

Unset, the mode is ``filtered`` when ``postgres.tables`` lists tables, else ``all_tables``,
and a publication that disagrees with the list stops the start. The reader streams what the
publication covers: it does not filter tables itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgcdc.core.errors import ConfigError
from pgcdc.core.qualified_names import quote_table
from pgcdc.core.settings import PublicationAutocreate

log = logging.getLogger(__name__)

SETTING = "postgres.publication_autocreate_mode"
Mode = PublicationAutocreate


def captured_tables(conn: psycopg.Connection[Any], publication: str) -> list[tuple[str, str]]:
    """The tables the publication covers, sorted."""
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
        (publication,),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def _check_listed_tables_exist(
    conn: psycopg.Connection[Any], tables: Sequence[tuple[str, str]]
) -> None:
    for schema, table in tables:
        found = conn.execute(
            "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = %s", (schema, table)
        ).fetchone()
        if found is None:
            raise ConfigError(
                f"table {quote_table((schema, table))} listed in postgres.tables does not exist"
            )


def _table_list(tables: Sequence[tuple[str, str]]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(*t) for t in tables)


# PostgreSQL 18's publish_generated_columns: stored generated columns in the stream.
GENERATED_COLUMNS_SINCE = 180000


def _create(
    name: str,
    tables: Sequence[tuple[str, str]],
    mode: PublicationAutocreate,
    generated: bool = False,
) -> sql.Composed:
    """The CREATE PUBLICATION that ``mode`` makes (disabled: the one its owner should run);
    ``generated``: with ``publish_generated_columns = stored``."""
    head = sql.SQL("CREATE PUBLICATION {}").format(sql.Identifier(name))
    what: sql.Composable
    if mode is Mode.NO_TABLES:
        what = sql.SQL("")
    elif tables:
        what = sql.SQL(" FOR TABLE ") + _table_list(tables)
    else:
        what = sql.SQL(" FOR ALL TABLES")
    options = sql.SQL(" WITH (publish_generated_columns = stored)" if generated else "")
    return head + what + options


def publishes_generated(conn: psycopg.Connection[Any], name: str) -> bool:
    """Whether the publication carries stored generated columns (PostgreSQL 18+'s
    ``publish_generated_columns = stored``; never before 18)."""
    row = conn.execute(
        "SELECT to_jsonb(p) ->> 'pubgencols' FROM pg_publication p WHERE pubname = %s", (name,)
    ).fetchone()
    return row is not None and row[0] == "s"


def generated_columns(
    conn: psycopg.Connection[Any], tables: Sequence[tuple[str, str]]
) -> list[str]:
    """``schema.table.column`` of every stored generated column of ``tables``."""
    if not tables:
        return []
    rows = conn.execute(
        "SELECT n.nspname || '.' || c.relname || '.' || a.attname FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE a.attgenerated = 's' AND NOT a.attisdropped AND (n.nspname, c.relname) IN "
        "(SELECT * FROM unnest(%s::text[], %s::text[])) ORDER BY 1",
        ([s for s, _ in tables], [t for _, t in tables]),
    ).fetchall()
    return [str(r[0]) for r in rows]


def warn_generated_left_out(
    conn: psycopg.Connection[Any], name: str, tables: Sequence[tuple[str, str]]
) -> list[str]:
    """The stored generated columns the publication leaves out, logged once with the way to
    carry them (PostgreSQL 18+) or the way before 18 (docs/own-postgres.md)."""
    if publishes_generated(conn, name):
        return []
    columns = generated_columns(conn, tables)
    if not columns:
        return []
    if conn.info.server_version >= GENERATED_COLUMNS_SINCE:
        how = (
            f"run `ALTER PUBLICATION {name} SET (publish_generated_columns = stored)`, then "
            "`cdc snapshot <table>` for their current values"
        )
    else:
        how = (
            "PostgreSQL 18 publishes them (publish_generated_columns); before 18 make each a "
            "plain column kept by a trigger (docs/own-postgres.md#generated-columns)"
        )
    log.warning(
        "stored generated columns %s are not published by %s, so no record carries them: %s",
        ", ".join(columns),
        name,
        how,
        extra={"publication": name},
    )
    return columns


def _alter(name: str, tables: Sequence[tuple[str, str]]) -> sql.Composed:
    head = sql.SQL("ALTER PUBLICATION {} SET TABLE ").format(sql.Identifier(name))
    return head + _table_list(tables)


# What the log says a CREATE or ALTER PUBLICATION did.
_DONE = {"create": "created", "alter": "altered"}


def _run(conn: psycopg.Connection[Any], name: str, statement: sql.Composed, what: str) -> None:
    """Run a CREATE/ALTER PUBLICATION; a role without the right gets the way past it."""
    text = statement.as_string(conn)
    try:
        conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege as e:
        raise ConfigError(
            f"the role may not {what} publication {name} ({e.diag.message_primary}); have a "
            f"superuser or the tables' owner run `{text}` and set {SETTING}=disabled"
        ) from e
    log.info("%s publication", _DONE[what], extra={"publication": name})


def ensure_publication(
    conn: psycopg.Connection[Any],
    name: str,
    tables: Sequence[tuple[str, str]],
    mode: PublicationAutocreate | None = None,
    generated: bool = False,
) -> list[tuple[str, str]]:
    """Create or align the publication for ``tables`` (``postgres.tables`` as (schema, table))
    as ``mode`` allows (see the module docstring); return the captured tables likewise.
    ``generated`` (``postgres.publish_generated_columns``) creates it with stored generated
    columns on PostgreSQL 18+; an existing publication keeps its own choice."""
    generated = generated and conn.info.server_version >= GENERATED_COLUMNS_SINCE
    _check_listed_tables_exist(conn, tables)
    explicit = mode is not None
    mode = mode or (Mode.FILTERED if tables else Mode.ALL_TABLES)
    if mode in (Mode.ALL_TABLES, Mode.NO_TABLES) and tables:
        raise ConfigError(
            f"{SETTING}={mode.value} leaves the tables to the publication, but postgres.tables "
            "lists some: empty postgres.tables, or use filtered"
        )
    if mode is Mode.FILTERED and not tables:
        raise ConfigError(f"{SETTING}=filtered needs postgres.tables (schema.table,...)")
    row = conn.execute(
        "SELECT puballtables FROM pg_publication WHERE pubname = %s", (name,)
    ).fetchone()
    if row is None:
        create = _create(name, tables, mode, generated)
        if mode is Mode.DISABLED:
            raise ConfigError(
                f"publication {name} does not exist and {SETTING}=disabled: have a superuser "
                f"or the tables' owner run `{create.as_string(conn)}` first"
            )
        _run(conn, name, create, "create")
        return captured_tables(conn, name)
    all_tables = bool(row[0])
    if tables and all_tables:
        raise ConfigError(
            f"publication {name} exists FOR ALL TABLES but postgres.tables lists "
            f"{len(tables)} tables; drop the publication or use another publication_name"
        )
    if not tables and not all_tables and not explicit:
        raise ConfigError(
            f"publication {name} exists for a list of tables but postgres.tables is empty "
            f"(meaning all tables); drop the publication, list the tables, or set {SETTING}="
            "disabled to stream what it covers"
        )
    if tables:
        have, want = set(captured_tables(conn, name)), set(tables)
        if have != want:
            if mode is Mode.DISABLED:
                missing = ", ".join(quote_table(t) for t in sorted(want - have)) or "none"
                extra = ", ".join(quote_table(t) for t in sorted(have - want)) or "none"
                raise ConfigError(
                    f"publication {name} does not cover exactly postgres.tables (missing: "
                    f"{missing}; not listed: {extra})"
                    f" and {SETTING}=disabled: have its owner run "
                    f"`{_alter(name, tables).as_string(conn)}`, or list its tables"
                )
            _run(conn, name, _alter(name, tables), "alter")
    return captured_tables(conn, name)
