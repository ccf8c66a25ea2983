"""PostgreSQL as the oracle for the reader's events, and what the reader prints.

:func:`canonical_after` renders a table's rows in a session with PostgreSQL's default output
settings (ISO dates, ``postgres`` intervals, UTC, shortest exact floats, C money) and builds
the ``after`` image the event format gives those texts: what every event must hold whatever
the database's own settings. :func:`leaks` finds a secret in a process's output.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import orjson
import psycopg
from psycopg import sql

from cdc.catalog import load_table
from pgcdc.core.settings import SchemaSettings
from schemas.envelope import EventEncoder
from schemas.model import SourceInfo

# PostgreSQL's defaults, set explicitly (not through the reader's own connection helper).
DEFAULT_OUTPUT_OPTIONS = (
    "-c DateStyle=ISO -c IntervalStyle=postgres -c extra_float_digits=3 "
    "-c lc_monetary=C -c TimeZone=UTC"
)


def default_session(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A connection whose output settings are PostgreSQL's defaults, whatever the database's."""
    return psycopg.connect(
        dsn, autocommit=True, options=DEFAULT_OUTPUT_OPTIONS, client_encoding="UTF8"
    )


def canonical_after(dsn: str, table: str, key: str = "id") -> dict[Any, dict[str, Any]]:
    """``after`` of every row as the JSON event format gives it, by key value."""
    with default_session(dsn) as conn:
        schema = load_table(conn, table)
        cols = sql.SQL(", ").join(
            sql.SQL("{}::text").format(sql.Identifier(c.name)) for c in schema.columns
        )
        rows = conn.execute(
            sql.SQL("SELECT {} FROM {}").format(cols, sql.Identifier(table))
        ).fetchall()
    encoder = EventEncoder(SchemaSettings(schemas_enable=False), "oracle", "db")
    source = SourceInfo(0, "true", None, None, None)
    names = [c.name for c in schema.columns]
    out: dict[Any, dict[str, Any]] = {}
    for row in rows:
        value = orjson.loads(encoder.encode_value(schema, "r", None, row, source))
        out[int(row[names.index(key)])] = value["after"]
    return out


def decimal_of(encoded: str, scale: int) -> Decimal:
    """A Connect Decimal as JSON carries it (base64 of the unscaled two's complement)."""
    raw = base64.b64decode(encoded)
    return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)


_ZONED = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z")


def micros_of_zoned(text: str) -> int:
    """Microseconds since the epoch of an ``io.debezium.time.ZonedTimestamp`` string (any
    year, ISO signed years for BC: ``-0009`` is 10 BC)."""
    m = _ZONED.fullmatch(text)
    assert m is not None, f"not a ZonedTimestamp: {text!r}"
    year = int(m[1])
    # Shift by whole 400-year Gregorian cycles (146,097 days each) into datetime's range.
    cycles = 0 if year >= 1 else (1 - year) // 400 + 1
    date = dt.date(year + 400 * cycles, int(m[2]), int(m[3]))
    days = (date - dt.date(1970, 1, 1)).days - cycles * 146_097
    secs = days * 86_400 + int(m[4]) * 3600 + int(m[5]) * 60 + int(m[6])
    return secs * 1_000_000 + int((m[7] or "0").ljust(6, "0")[:6])


def secret_forms(secret: str) -> list[str]:
    """How a secret may show up in text: raw, percent-encoded, escaped for ``key='value'``,
    and every run of 6 of its characters."""
    forms = {secret, quote(secret, safe=""), secret.replace("\\", "\\\\").replace("'", "\\'")}
    forms |= {secret[i : i + 6] for i in range(len(secret) - 5)}
    return sorted(forms)


def leaks(output: str, secret: str) -> list[str]:
    """The lines of ``output`` that show ``secret`` in any of its forms."""
    forms = secret_forms(secret)
    return [line for line in output.splitlines() if any(f in line for f in forms)]
