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

Connect's form is not always readable by Connect. ``SimpleHeaderConverter`` reads it back
with ``Values.parseString``, which has no struct: ``{…}`` becomes a map, and a map's value
schema is the one its values share (integers widen to one another, nothing else merges).
Values of different kinds (a text and an integer, a uuid and a date, a text that the parser
takes for a date beside one it does not) leave a map without a value schema, and every
sink that puts the header into a struct (Debezium's JDBC sink does, for every record) fails
with ``No schema defined for value of map field``. Debezium in Kafka Connect writes exactly
that form and meets exactly that failure. So ``simple`` keeps Connect's bytes for keys
whose fields the parser reads as one kind (:func:`reads_back_as_map`), and writes any other
key's Connect form as a JSON string (``"{\\"region\\":\\"us\\",\\"seq\\":1001}"``), which the
parser reads as that string, whatever it holds: a reader decodes it once to get Connect's
form.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import re
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
    """A key struct ``value`` of ``schema`` as ``schema.header_format=simple`` writes it:
    :func:`connect_text` when Connect's header converter reads that back as a map of one
    value schema, else that text as a JSON string (the module docstring says why)."""
    text = connect_text(schema, value)
    if schema.get("type") != "struct" or reads_back_as_map(schema, value):
        return text.encode("utf-8")
    return json.dumps(text, ensure_ascii=False).encode("utf-8")


def connect_text(schema: ConnectSchema, value: Any) -> str:
    """``value`` (a Connect value of ``schema``, bytes for BYTES) as Kafka Connect's
    ``SimpleHeaderConverter`` writes it (``Values.convertToString``)."""
    return _render(schema, value, embedded=False)


def reads_back_as_map(schema: ConnectSchema, value: Any) -> bool:
    """Whether ``Values.parseString`` reads the :func:`connect_text` of a key struct back as
    a map with a key and a value schema (so a sink can put it in a struct).

    Conservative: true for one field whose value is not an array or a map, and for several
    fields that are all integers, all booleans or all texts the parser keeps as texts (field
    names included); false for anything else, which is then written as a JSON string."""
    fields = [
        (f["field"], _render(f, value.get(f["field"]), True)) for f in schema.get("fields") or []
    ]
    if len(fields) == 1:
        return not fields[0][1].startswith(("[", "{")) and fields[0][1] != "null"
    if not fields or not all(_kind(_text(name, True)) == "text" for name, _ in fields):
        return False
    kinds = {_kind(rendered) for _, rendered in fields}
    return len(kinds) == 1 and kinds <= {"int", "bool", "text"}


_INTEGER = re.compile(r"-?[0-9]+")
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
# Values.ValueParser.parseAsTemporal tries a quoted text as a date, a time or a timestamp when
# its length (in UTF-16 units, after "\\:" becomes ":") is that of one of Connect's ISO 8601
# patterns: yyyy-MM-dd, HH:mm:ss.SSS'Z' and yyyy-MM-dd'T'HH:mm:ss.SSS'Z'. The pattern is
# parsed leniently and from the text's start ("1-2-345678" is a date), so any text of those
# lengths counts as one the parser may take for a date.
TEMPORAL_LENGTHS = (10, 13, 24)
_DELIMITERS = frozenset(':,{}[]"')


def _kind(rendered: str) -> str:
    """How ``Values.parseString`` reads one rendered field inside a map: "int" (INT8…INT64,
    which widen to one another), "bool", "text" (a quoted text it keeps as STRING), or
    "other" (anything else, including texts it may read as a date)."""
    if _INTEGER.fullmatch(rendered) and LONG_MIN <= int(rendered) <= LONG_MAX:
        return "int"
    if rendered in ("true", "false"):
        return "bool"
    if rendered.startswith('"') and rendered.endswith('"') and len(rendered) >= 2:
        content = "".join(t for t in _tokens(rendered[1:-1]) if not _java_blank(t))
        units = sum(2 if ord(c) > 0xFFFF else 1 for c in content.replace("\\:", ":"))
        return "other" if units in TEMPORAL_LENGTHS else "text"
    return "other"


def _java_blank(token: str) -> bool:
    """``Utils.isBlank``: empty after Java's ``trim`` (which drops chars up to U+0020)."""
    return all(ord(c) <= 0x20 for c in token)


def _tokens(text: str) -> list[str]:
    """``Values.Parser``'s tokens: runs of text, and each unescaped delimiter alone (a
    backslash escapes the next character). Inside quotes the parser drops blank tokens."""
    out: list[str] = []
    start, escaped = 0, False
    for i, c in enumerate(text):
        if c == "\\":
            escaped = not escaped
            continue
        if c in _DELIMITERS and not escaped:
            if start < i:
                out.append(text[start:i])
            out.append(c)
            start = i + 1
        escaped = False
    if start < len(text):
        out.append(text[start:])
    return out


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
