"""The key-change headers (``__debezium.newkey``, ``__debezium.oldkey``) in the encoding a
reader of them expects.

A Kafka Connect source connector hands Connect a header as a Connect value; the worker's
``header.converter`` turns it into bytes. Kafka Connect's default, ``SimpleHeaderConverter``,
writes ``Values.convertToString`` of the value: a key struct becomes ``{"id":5,"k":"a"}``
(field names and strings quoted, with ``\\`` and ``"`` escaped; numbers as Java prints them;
bytes as base64 in quotes; decimals as Java's ``BigDecimal.toString``; Connect dates, times
and timestamps as ISO 8601 in UTC, unquoted). That is what Debezium in Kafka Connect writes
with Connect's defaults, and what a sink connector reads back with them (a Map). Debezium
Server writes its headers with JsonConverter instead (``{"schema": …, "payload": …}``), which
``SimpleHeaderConverter`` reads as a map of ``schema`` and ``payload``: Debezium's JDBC sink
then fails at the first key change. :func:`simple_header` renders the first form from a key's
Connect schema and value; the second is the record key itself.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import struct
from decimal import Decimal
from typing import Any

from schemas.connect import ConnectSchema

DECIMAL = "org.apache.kafka.connect.data.Decimal"
DATE = "org.apache.kafka.connect.data.Date"
TIME = "org.apache.kafka.connect.data.Time"
TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"
MILLIS_PER_DAY = 86_400_000


def simple_header(schema: ConnectSchema, value: Any) -> bytes:
    """``value`` (a Connect value of ``schema``, bytes for BYTES) as Kafka Connect's
    ``SimpleHeaderConverter`` writes it."""
    return _render(schema, value, embedded=False).encode("utf-8")


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _text(text: str, embedded: bool) -> str:
    return f'"{_escape(text)}"' if embedded else text


def _render(schema: ConnectSchema | None, value: Any, embedded: bool) -> str:
    if value is None:
        return "null"
    kind = schema.get("type") if schema else None
    name = schema.get("name") if schema else None
    if name == DECIMAL:
        return java_big_decimal(_decimal(value, schema or {}))
    if name in (DATE, TIME, TIMESTAMP):
        return _java_date(_millis(name, value))
    if kind == "struct":
        fields = (schema or {}).get("fields") or []
        parts = [
            f"{_text(f['field'], True)}:{_render(f, value.get(f['field']), True)}" for f in fields
        ]
        return "{" + ",".join(parts) + "}"
    if kind == "array":
        items = (schema or {}).get("items")
        return "[" + ",".join(_render(items, v, True) for v in value) + "]"
    if kind == "map":
        keys, values = (schema or {}).get("keys"), (schema or {}).get("values")
        return (
            "{"
            + ",".join(
                f"{_render(keys, k, True)}:{_render(values, v, True)}" for k, v in value.items()
            )
            + "}"
        )
    if kind == "bytes" or isinstance(value, bytes | bytearray | memoryview):
        raw = value if not isinstance(value, str) else base64.b64decode(value)
        return _text(base64.b64encode(bytes(raw)).decode("ascii"), embedded)
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind in ("float", "float32"):  # JsonConverter's names, then Connect's
        return java_float(_number(value))
    if kind in ("double", "float64") or isinstance(value, float):
        return java_double(_number(value))
    if isinstance(value, int):
        return str(value)
    return _text(str(value), embedded)


def _number(value: Any) -> float:
    """A float, or JsonConverter's text of a non-finite one ("NaN", "Infinity")."""
    return float(value)


def _decimal(value: Any, schema: ConnectSchema) -> Decimal:
    """A Connect Decimal: the unscaled two's-complement bytes (or their base64) and the scale
    parameter; a Decimal or number as it is."""
    if isinstance(value, Decimal):
        return value
    if isinstance(value, str):
        value = base64.b64decode(value)
    if isinstance(value, bytes | bytearray | memoryview):
        unscaled = int.from_bytes(bytes(value), "big", signed=True)
        scale = int((schema.get("parameters") or {}).get("scale", 0))
        return Decimal(f"{unscaled}E{-scale}")  # exact: no context rounding
    return Decimal(value)


def java_big_decimal(d: Decimal) -> str:
    """``java.math.BigDecimal.toString()``: plain unless the exponent is positive or the
    adjusted exponent is below -6, then scientific with ``E+n``/``E-n``."""
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    coeff = "".join(map(str, digits)) or "0"
    scale = -exponent
    adjusted = len(coeff) - 1 - scale
    neg = "-" if sign else ""
    if scale >= 0 and adjusted >= -6:
        if scale == 0:
            return neg + coeff
        if len(coeff) > scale:
            return f"{neg}{coeff[:-scale]}.{coeff[-scale:]}"
        return f"{neg}0.{'0' * (scale - len(coeff))}{coeff}"
    mantissa = coeff[0] + ("." + coeff[1:] if len(coeff) > 1 else "")
    return f"{neg}{mantissa}E{'+' if adjusted >= 0 else ''}{adjusted}"


def _java_floating(x: float, digits: str, exp10: int) -> str:
    """Java's Double/Float.toString layout of the shortest ``digits`` with decimal exponent
    ``exp10`` (x = 0.d1d2… × 10^exp10)."""
    neg = "-" if math.copysign(1.0, x) < 0 else ""
    if 1e-3 <= abs(x) < 1e7:
        point = exp10  # digits before the decimal point
        if point <= 0:
            return f"{neg}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return f"{neg}{digits}{'0' * (point - len(digits))}.0"
        return f"{neg}{digits[:point]}.{digits[point:]}"
    frac = digits[1:] or "0"
    return f"{neg}{digits[0]}.{frac}E{exp10 - 1}"


def _shortest(exact: Decimal, repr_text: str) -> tuple[str, int]:
    """The significant digits of ``repr_text`` (the shortest decimal that reads back as the
    number, whose exact binary value is ``exact``) and where the decimal point goes.

    Java never prints one digit when two are closer to the number: of the two-digit
    decimals, the nearest is taken then (``Double.MIN_VALUE`` is ``4.9E-324``, not ``5``)."""
    _, digits_t, exponent = Decimal(repr_text).as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digits_t)).rstrip("0") or "0"
    exp10 = len("".join(map(str, digits_t))) + exponent
    if len(digits) == 1:
        two = f"{abs(exact):.1E}"  # d.dE±n, rounded from the exact value
        if two[2] != "0":
            return two[0] + two[2], int(two[4:]) + 1
    return digits, exp10


def _special(x: float) -> str | None:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0.0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    return None


def java_double(x: float) -> str:
    """``Double.toString`` (Java 19+: the shortest digits that read back as ``x``)."""
    special = _special(x)
    if special is not None:
        return special
    return _java_floating(x, *_shortest(Decimal(x), repr(abs(x))))


def java_float(x: float) -> str:
    """``Float.toString`` of the float32 nearest ``x`` (shortest digits for float32)."""
    special = _special(x)
    if special is not None:
        return special
    packed = struct.pack(">f", x)
    exact = Decimal(struct.unpack(">f", packed)[0])
    for precision in range(1, 10):
        text = f"{abs(x):.{precision}g}"
        if struct.pack(">f", float(text) * (1 if x > 0 else -1)) == packed:
            return _java_floating(x, *_shortest(exact, text))
    return _java_floating(x, *_shortest(exact, repr(abs(x))))


def _millis(name: str, value: Any) -> int:
    """A Connect Date (days), Time (ms of the day) or Timestamp (ms) as epoch milliseconds."""
    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days * MILLIS_PER_DAY
    return int(value) * MILLIS_PER_DAY if name == DATE else int(value)


def _java_date(millis: int) -> str:
    """``Values.dateFormatFor``: below one day's milliseconds (negative ones too, so any
    instant before 1970) as a time ``HH:mm:ss.SSS'Z'``, whole days as ``yyyy-MM-dd``, else
    ``yyyy-MM-dd'T'HH:mm:ss.SSS'Z'`` (UTC)."""
    at = dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=millis)
    if millis < MILLIS_PER_DAY:
        return at.strftime("%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
    if millis % MILLIS_PER_DAY == 0:
        return f"{at.year:04d}-{at.month:02d}-{at.day:02d}"
    return (
        f"{at.year:04d}-{at.month:02d}-{at.day:02d}T"
        + at.strftime("%H:%M:%S.")
        + f"{at.microsecond // 1000:03d}Z"
    )
