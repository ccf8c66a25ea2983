"""Connections to PostgreSQL: open one, name its server without credentials, ask where it is.

Every connection the reader opens goes through :func:`connect`, so

- a DSN is never printed (only :func:`describe_dsn`'s ``host:port/dbname``), a DSN libpq
  cannot parse is one ConfigError that quotes none of it, and the DSN's secrets are scrubbed
  from any error text a failed attempt produces;
- every session runs with the same pinned settings (:data:`SESSION_SETTINGS`), sent in the
  startup packet so they hold before the first query, whatever ``ALTER DATABASE … SET`` or
  ``ALTER ROLE … SET`` chose: the text of dates, intervals, money and floats that pgoutput
  and COPY send is then always in the form :mod:`schemas.pgtext` parses, and text arrives
  as UTF-8 whatever the database's encoding;
- an unreachable server is one clear :class:`~pgcdc.core.errors.ConnectionFailed`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, Final
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgcdc.core.errors import AuthenticationFailed, CdcError, ConfigError, ConnectionFailed
from pgcdc.core.lsn import Lsn

# Maps a failed connection attempt to one of our errors; the default calls it unreachable.
ErrorMapper = Callable[[psycopg.Error], CdcError]

# The session settings of every connection the reader opens (the server's defaults, which
# the parsers of schemas.pgtext and schemas.convert expect). A client's startup options beat
# database and role defaults, so these hold on the replication connection's walsender too.
SESSION_SETTINGS: Final = (
    ("DateStyle", "ISO"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "3"),
    ("lc_monetary", "C"),
    ("TimeZone", "UTC"),
)
# Text in UTF-8 whatever the database's encoding (LATIN1, WIN1252, ...): the decoder and
# the event format read UTF-8. A libpq parameter of its own rather than a -c option.
CLIENT_ENCODING: Final = "UTF8"

# Connection parameters whose values are secrets (libpq's "*" display flag).
SECRET_PARAMETERS: Final = ("password", "sslpassword")
# Shorter values are not scrubbed from text: a placeholder like the local stack's "cdc" would
# blank out every word it occurs in (user, database and topic names).
MIN_SCRUBBED_CHARS: Final = 4


def parse_dsn(dsn: str) -> dict[str, Any]:
    """The DSN's parameters (URL or ``key=value`` form).

    Raises ConfigError when libpq cannot parse it, with libpq's reason stripped of every
    quoted part (which may hold the password) and no chained cause (which would show it in a
    traceback).
    """
    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        reason = redact(first_line(e))
    # Outside the except block, so the message holding the DSN is not chained.
    raise ConfigError(
        f"invalid PostgreSQL DSN (postgres.dsn): {reason}; the DSN is not shown because it "
        "may hold a password"
    )


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
    """Drop everything between the first and the last double quote of libpq's message.

    libpq quotes the parts of a DSN it complains about; a password may itself hold quotes,
    so the whole span is dropped, not each quoted pair.
    """
    return re.sub(r"\".*\"", '"…"', text, flags=re.DOTALL)


def secrets_of(params: dict[str, Any]) -> list[str]:
    """The secret values of parsed DSN parameters, as they may appear in text: raw, and
    percent-encoded as a URL would carry them (values under :data:`MIN_SCRUBBED_CHARS`
    characters are left out)."""
    out: list[str] = []
    for name in SECRET_PARAMETERS:
        value = params.get(name)
        if value and len(str(value)) >= MIN_SCRUBBED_CHARS:
            out += [str(value), quote(str(value), safe=""), quote(str(value))]
    return out


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***``."""
    for s in sorted(set(secrets), key=len, reverse=True):
        if s:
            text = text.replace(s, "***")
    return text


def _scrubbed(error: CdcError, secrets: list[str]) -> CdcError:
    """The same error with the DSN's secrets scrubbed from its message."""
    text = str(error)
    clean = scrub(text, secrets)
    if clean == text:
        return error
    return type(error)(clean)


def session_options(existing: str | None = None) -> str:
    """libpq ``options`` that pin :data:`SESSION_SETTINGS`, after the DSN's own (later wins)."""
    pinned = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS)
    return f"{existing} {pinned}" if existing else pinned


def connect(
    dsn: str,
    *,
    connect_timeout_s: int = 5,
    on_error: ErrorMapper | None = None,
    **kwargs: Any,
) -> psycopg.Connection[Any]:
    """An autocommit connection with the pinned session settings (``kwargs`` go to
    :func:`psycopg.connect`).

    A DSN libpq cannot parse is a ConfigError that quotes no part of it. A failed attempt
    goes through ``on_error``; without one, an OperationalError becomes one line naming the
    cause in libpq's words (:func:`connect_error`: a refused login, a missing database, or
    "PostgreSQL at host:port/db is unreachable: Connection refused", worth retrying). Either
    way the DSN's secrets are scrubbed from the message.
    """
    params = parse_dsn(dsn)
    secrets = secrets_of(params)
    options = session_options(params.get("options"))
    try:
        return psycopg.connect(
            dsn,
            autocommit=True,
            connect_timeout=connect_timeout_s,
            options=options,
            client_encoding=CLIENT_ENCODING,
            **kwargs,
        )
    except psycopg.Error as e:
        if on_error is not None:
            raise _scrubbed(on_error(e), secrets) from e
        if not isinstance(e, psycopg.OperationalError):
            raise ConfigError(
                scrub(
                    f"cannot connect to PostgreSQL at {describe_dsn(dsn)}: {first_line(e)}", secrets
                )
            ) from e
        raise connect_error(describe_dsn(dsn), str(e), secrets) from e


# libpq's words for a login the server refused (as opposed to a server it did not reach).
_LOGIN_REFUSED = (
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "pg_hba.conf",
    "peer authentication failed",
)
_DSN_VARIABLE = "postgres.dsn (CDC_POSTGRES__DSN)"


def libpq_reason(text: str) -> str:
    """Why libpq could not connect, in its own words, once: ``Connection refused (is the
    server running on that host and accepting TCP/IP connections?)``, ``timeout expired``,
    ``password authentication failed for user "app"``.

    libpq writes one line per address it tried (``connection to server at "h", port p
    failed: <reason>``), and a hint on the next line after a tab; the reasons are kept
    (each once), the addresses dropped (the caller names the server) and the hint put in
    parentheses.
    """
    reasons: list[str] = []
    for line in text.strip().removeprefix("connection failed:").splitlines():
        if line.startswith(("\t", " ")) and reasons:
            hint = line.strip()
            reasons[-1] += f" ({hint[:1].lower()}{hint[1:]})" if hint else ""
            continue
        reason = line.strip()
        if " failed: " in reason and reason.startswith("connection to server"):
            reason = reason.split(" failed: ", 1)[1]
        reason = re.sub(r"^(FATAL|ERROR):\s+", "", reason)
        if reason and reason not in reasons:
            reasons.append(reason)
    return "; ".join(dict.fromkeys(reasons)) or "no reason given"


def connect_error(where: str, text: str, secrets: Iterable[str] = ()) -> CdcError:
    """The error for a connection attempt to ``where`` that libpq refused with ``text``:
    a refused login (AuthenticationFailed), a database that does not exist (ConfigError),
    else an unreachable server (ConnectionFailed, worth retrying); each says what to check."""
    reason = scrub(libpq_reason(text), secrets)
    lowered = reason.lower()
    if any(sign in lowered for sign in _LOGIN_REFUSED):
        return AuthenticationFailed(
            f"PostgreSQL at {where} refused the login: {reason}; check the user and password "
            f"in {_DSN_VARIABLE}, and that the server's pg_hba.conf admits that user from "
            "this host"
        )
    if "certificate verify failed" in lowered or "server certificate" in lowered:
        return ConfigError(
            f"PostgreSQL at {where}: the server's certificate does not verify ({reason}); "
            f"check sslrootcert (the CA file) and the host name in {_DSN_VARIABLE}"
        )
    if "database" in lowered and "does not exist" in lowered:
        return ConfigError(
            f"PostgreSQL at {where}: {reason}; check the database name in {_DSN_VARIABLE}"
        )
    return ConnectionFailed(
        f"PostgreSQL at {where} is unreachable: {reason}; check the host and port in "
        f"{_DSN_VARIABLE} and that the server runs"
    )


def current_database(conn: psycopg.Connection[Any]) -> str:
    """The name of the database ``conn`` is connected to."""
    row = conn.execute("SELECT current_database()").fetchone()
    return str(row[0]) if row else ""


# The WAL position a reader can stream up to: a standby's is what it has replayed.
CURRENT_WAL_LSN: Final = (
    "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END"
)


def current_wal_lsn(conn: psycopg.Connection[Any]) -> Lsn:
    """The server's current WAL write position (on a standby: the position it replayed)."""
    row = conn.execute(f"SELECT ({CURRENT_WAL_LSN})::text").fetchone()
    if row is None or row[0] is None:
        raise ConnectionFailed("the server did not report its WAL position")
    return Lsn.parse(row[0])


def in_recovery(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server is a standby."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])
