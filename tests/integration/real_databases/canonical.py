"""One comparable form per PostgreSQL type for a value as PostgreSQL writes it in JSON
(``to_jsonb``) and as a follower holds it (the sync jobs' natural values, from Debezium's
encodings): equal forms mean the follower holds the value exactly.

PostgreSQL is the oracle: the leader's side is read as ``to_jsonb(row)::text`` with exact
decimals, in a session with ``TimeZone=UTC`` and the default ``IntervalStyle``.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg

from schemas.convert import interval_micros
from schemas.pgtext import days_from_civil


@dataclass(frozen=True)
class ColumnType:
    """A column's type as the comparison needs it: the base type (domains resolved) and,
    for arrays, the element's."""

    name: str
    element: str | None = None


def column_types(conn: psycopg.Connection[Any], schema: str, table: str) -> dict[str, ColumnType]:
    """Each column's :class:`ColumnType`."""
    rows = conn.execute(
        """
        SELECT a.attname, bt.typname, et.typname
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_type t ON t.oid = a.atttypid
        JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
        LEFT JOIN pg_type et ON et.oid = bt.typelem AND bt.typcategory = 'A'
        WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
        """,
        (schema, table),
    ).fetchall()
    return {name: ColumnType(typ, elem) for name, typ, elem in rows}


def loads_exact(text: str | bytes) -> Any:
    """JSON with exact decimals (PostgreSQL's numbers are not doubles)."""
    return json.loads(text, parse_float=Decimal)


def canonical(value: Any, t: ColumnType, side: str) -> Any:
    """The comparable form of ``value`` of type ``t``; ``side`` is ``"pg"`` or ``"follower"``."""
    if value is None:
        return None
    if t.element is not None:
        return _array(value, t.element, side)
    return _scalar(value, t.name, side)


def _array(value: Any, element: str, side: str) -> Any:
    if isinstance(value, list):
        return [_array(v, element, side) for v in value]
    return None if value is None else _scalar(value, element, side)


def _scalar(value: Any, typ: str, side: str) -> Any:
    f = _BY_TYPE.get(typ)
    return f(value, side) if f is not None else value


# -- per type ------------------------------------------------------------------------------


def _int(v: Any, side: str) -> Any:
    return int(v)


def _float(v: Any, side: str) -> Any:
    # NaN and ±Infinity are strings on both sides ("NaN" != NaN would never compare equal).
    return v if isinstance(v, str) else float(v)


def _numeric(v: Any, side: str) -> Any:
    d = Decimal(str(v))
    return "NaN" if d.is_nan() else d


def _money(v: Any, side: str) -> Any:
    return Decimal(str(v).replace("$", "").replace(",", ""))


def _bytes(v: Any, side: str) -> bytes:
    if side == "pg":
        assert v.startswith("\\x"), v
        return bytes.fromhex(v[2:])
    return base64.b64decode(v)


def _json(v: Any, side: str) -> Any:
    # PostgreSQL embeds the document; the follower holds its text.
    return loads_exact(v) if side == "follower" else v


_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d(?::?\d\d)?)?$")


def _micros_of_day(text: str) -> tuple[int, int]:
    m = _TIME.match(text)
    assert m, text
    h, mi, s, frac, zone = m.groups()
    micros = ((int(h) * 60 + int(mi)) * 60 + int(s)) * 1_000_000 + int((frac or "").ljust(6, "0"))
    offset = 0
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 3600 + int(digits[2:4] or 0) * 60)
    return micros, offset


def _time(v: Any, side: str) -> int:
    return _micros_of_day(v)[0]


def _timetz(v: Any, side: str) -> int:
    micros, offset = _micros_of_day(v)
    if micros == 86_400_000_000:
        return micros
    return (micros - offset * 1_000_000) % 86_400_000_000


_TS = re.compile(
    r"([+-]?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?( BC)?$"
)


def _timestamp(v: Any, side: str) -> Any:
    """UTC microseconds since the epoch on a proleptic calendar, any year."""
    if v in ("infinity", "-infinity"):
        return v
    m = _TS.match(v)
    assert m, v
    y, mo, d, h, mi, s, frac, zone, bc = m.groups()
    year = int(y)
    if bc:
        year = 1 - year  # 1 BC is year 0
    days = days_from_civil(year, int(mo), int(d))
    secs = days * 86_400 + (int(h) * 60 + int(mi)) * 60 + int(s)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        secs -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return secs * 1_000_000 + int((frac or "").ljust(6, "0"))


def _interval(v: Any, side: str) -> Any:
    # Debezium's MicroDuration (months of 30.4375 days): the follower holds that number.
    return interval_micros(v) if side == "pg" else int(v)


def _point(v: Any, side: str) -> Any:
    if side == "pg":
        x, y = v.strip("()").split(",")
        return (float(x), float(y))
    return (float(v["x"]), float(v["y"]))


def _bits(v: Any, side: str) -> int:
    if isinstance(v, bool):  # bit(1) is a Connect boolean
        return int(v)
    if side == "pg" or re.fullmatch(r"[01]*", v):
        return int(v, 2) if v else 0
    return int.from_bytes(base64.b64decode(v), "little")


def _uuid(v: Any, side: str) -> str:
    return str(v).lower()


_BY_TYPE: dict[str, Callable[[Any, str], Any]] = {
    "int2": _int,
    "int4": _int,
    "int8": _int,
    "oid": _int,
    "float4": _float,
    "float8": _float,
    "numeric": _numeric,
    "money": _money,
    "bytea": _bytes,
    "json": _json,
    "jsonb": _json,
    "hstore": _json,
    "time": _time,
    "timetz": _timetz,
    "timestamp": _timestamp,
    "timestamptz": _timestamp,
    "interval": _interval,
    "point": _point,
    "bit": _bits,
    "varbit": _bits,
    "uuid": _uuid,
}
