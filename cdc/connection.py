"""Connections to PostgreSQL: open one, name its server without credentials, ask where it is.

Every connection the reader opens goes through :func:`connect`, so a DSN is never printed
(only :func:`describe_dsn`'s ``host:port/dbname``) and an unreachable server is one clear
:class:`~pgcdc.core.errors.ConnectionFailed`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgcdc.core.errors import CdcError, ConfigError, ConnectionFailed
from pgcdc.core.lsn import Lsn

# Maps a failed connection attempt to one of our errors; the default calls it unreachable.
ErrorMapper = Callable[[psycopg.Error], CdcError]


def describe_dsn(dsn: str) -> str:
    """``host:port/dbname`` of a DSN (URL or ``key=value`` form), never its password."""
    try:
        d = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    return f"{d.get('host', 'localhost')}:{d.get('port', 5432)}/{d.get('dbname', '')}"


def first_line(e: BaseException) -> str:
    """The first line of an error's message (libpq adds hints below it)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def redact(text: str) -> str:
    """Drop quoted fragments, which may hold parts of a DSN (and so a password)."""
    return re.sub(r"\"[^\"]*\"", '"…"', text)


def connect(
    dsn: str,
    *,
    connect_timeout_s: int = 5,
    on_error: ErrorMapper | None = None,
    **kwargs: Any,
) -> psycopg.Connection[Any]:
    """An autocommit connection (``kwargs`` go to :func:`psycopg.connect`).

    A DSN libpq cannot parse is a ConfigError whose text holds no quoted part of it. A failed
    attempt goes through ``on_error``; without one, an OperationalError becomes
    "PostgreSQL at host:port/db is unreachable" (ConnectionFailed, worth retrying).
    """
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=connect_timeout_s, **kwargs)
    except psycopg.ProgrammingError as e:
        # libpq could not parse the DSN; its message may quote parts of it, so redact.
        raise ConfigError(f"invalid PostgreSQL DSN: {redact(first_line(e))}") from e
    except psycopg.Error as e:
        if on_error is not None:
            raise on_error(e) from e
        if not isinstance(e, psycopg.OperationalError):
            raise
        text = str(e).strip()
        # libpq's last line says why ("Connection refused", "timeout expired", ...).
        why = text.splitlines()[-1] if text else type(e).__name__
        raise ConnectionFailed(f"PostgreSQL at {describe_dsn(dsn)} is unreachable: {why}") from e


def current_database(conn: psycopg.Connection[Any]) -> str:
    """The name of the database ``conn`` is connected to."""
    row = conn.execute("SELECT current_database()").fetchone()
    return str(row[0]) if row else ""


def current_wal_lsn(conn: psycopg.Connection[Any]) -> Lsn:
    """The server's current WAL write position."""
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    if row is None:
        raise ConnectionFailed("the server did not report its WAL position")
    return Lsn.parse(row[0])
