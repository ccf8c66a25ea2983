"""Whether an error from psycopg means the connection to PostgreSQL was lost: worth a reconnect.

Judged the most reliable way first:

1. The SQLSTATE the server sent: class 08 (connection exception), 57P01 admin_shutdown (a
   fast shutdown or ``pg_terminate_backend``), 57P02 crash_shutdown, 57P03 cannot_connect_now
   (starting up, shutting down), 57P05 idle_session_timeout. Any other SQLSTATE is the
   server's verdict on a statement, not on the connection.
2. The connection's own state: once the socket is gone libpq marks it ``CONNECTION_BAD``
   (psycopg: ``conn.closed``), whatever words it chose. Those differ with TLS: a restart
   reads "SSL connection has been closed unexpectedly" or "SSL SYSCALL error: EOF detected"
   instead of "server closed the connection unexpectedly", and a failed COPY comes back as a
   result psycopg cannot class (a plain ``DatabaseError`` without SQLSTATE).
3. libpq's and psycopg's words (:data:`LOST_SIGNS`), for an error seen without its
   connection. Only a fallback: the words change across libpq and OpenSSL versions.

A failed connection attempt also leaves a bad connection behind (a refused password too), so
callers pass the state only of a connection that was established; whether an attempt's
failure is worth retrying is :func:`cdc.connection.connect_error`'s call.
"""

from __future__ import annotations

from typing import Final

import psycopg
from psycopg import pq

LOST_SQLSTATE_CLASS: Final = "08"
LOST_SQLSTATES: Final = frozenset({"57P01", "57P02", "57P03", "57P05"})

# Lower case; each one seen from libpq 15-18 or psycopg 3 when a server went away.
LOST_SIGNS: Final = (
    "server closed the connection unexpectedly",
    "terminating connection due to administrator command",
    "terminating connection due to unexpected postmaster exit",
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "ssl connection has been closed unexpectedly",
    "ssl syscall error",
    "ssl error: unexpected eof",
    "eof detected",
    "could not receive data from server",
    "could not send data to server",
    "consuming input failed",
    "the connection is closed",
    "the connection is lost",
    "no connection to the server",
)


def lost_by_sqlstate(sqlstate: str | None) -> bool:
    """Whether the server's SQLSTATE says the session ended or cannot start now."""
    return sqlstate is not None and (
        sqlstate.startswith(LOST_SQLSTATE_CLASS) or sqlstate in LOST_SQLSTATES
    )


def connection_bad(pgconn: pq.abc.PGconn | None) -> bool:
    """Whether libpq has given up on an established connection."""
    return pgconn is not None and pgconn.status == pq.ConnStatus.BAD


def connection_lost(e: BaseException, pgconn: pq.abc.PGconn | None = None) -> bool:
    """Whether ``e`` (raised using ``pgconn``, when given) means the connection was lost."""
    if not isinstance(e, psycopg.Error):
        return False
    sqlstate = e.sqlstate
    if lost_by_sqlstate(sqlstate) or connection_bad(pgconn):
        return True
    if sqlstate is not None:
        return False
    lowered = str(e).lower()
    return any(sign in lowered for sign in LOST_SIGNS)
