"""PostgreSQL type → Kafka Connect schema and value, the way Debezium's PostgreSQL connector
maps them (decimal.handling.mode, binary.handling.mode, interval.handling.mode,
time.precision.mode=adaptive, hstore.handling.mode=json).

Values arrive as PostgreSQL's text output, so every converter goes by type OID from text.
A value of a type we do not know passes through as its text, with the type name in the
schema: nothing is ever dropped.
"""

from __future__ import annotations

import base64
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER
from pgcdc.core.errors import SchemaError
from pgcdc.core.settings import BinaryHandling, DecimalHandling, IntervalHandling, SchemaSettings
from schemas import oids
from schemas.model import Column, PgType
from schemas.pgtext import (
    days_from_civil,
    format_utc_time,
    format_utc_timestamp,
    parse_array,
    parse_date,
    parse_hstore,
    parse_interval,
    parse_time,
    parse_timestamp,
    parse_timetz,
)

log = logging.getLogger(__name__)

Converter = Callable[[str], Any]
ConnectSchema = dict[str, Any]

# Debezium's money.fraction.digits default.
MONEY_FRACTION_DIGITS = 2
# Debezium's column.propagate.source.type parameter name, used for pass-through types.
SOURCE_TYPE_PARAMETER = "__debezium.source.column.type"

# +/-infinity for TIMESTAMP, as Debezium (and pgjdbc's PGStatement) write them, in µs.
TIMESTAMP_POSITIVE_INFINITY_MICROS = 9223372036825200000
TIMESTAMP_NEGATIVE_INFINITY_MICROS = -9223372036832400000
# +/-infinity for DATE: pgjdbc's LocalDate for infinity is -5877611-06-21 (and -22 for
# -infinity); Debezium passes those through, so the epoch days are these.
DATE_POSITIVE_INFINITY_DAYS = days_from_civil(-5877611, 6, 21)
DATE_NEGATIVE_INFINITY_DAYS = days_from_civil(-5877611, 6, 22)
_DAYS_PER_MONTH_AVG = 365.25 / 12.0
_MICROS_PER_DAY = 86_400_000_000


class NonFiniteFloat(float):
    """NaN or ±Infinity. Kafka's JsonConverter (Jackson) writes them as strings."""

    __slots__ = ()

    def json(self) -> str:
        if self != self:
            return "NaN"
        return "Infinity" if self > 0 else "-Infinity"


def connect_schema(
    type_: str,
    optional: bool,
    *,
    name: str | None = None,
    version: int | None = None,
    doc: str | None = None,
    parameters: dict[str, str] | None = None,
    fields: list[ConnectSchema] | None = None,
    items: ConnectSchema | None = None,
) -> ConnectSchema:
    """A Connect schema as JsonConverter writes it, keys in JsonConverter's order."""
    s: ConnectSchema = {"type": type_}
    if fields is not None:
        s["fields"] = fields
    if items is not None:
        s["items"] = items
    s["optional"] = optional
    if name is not None:
        s["name"] = name
    if version is not None:
        s["version"] = version
    if doc is not None:
        s["doc"] = doc
    if parameters is not None:
        s["parameters"] = parameters
    return s


def with_field(schema: ConnectSchema, field: str) -> ConnectSchema:
    """The schema as a struct member named ``field``."""
    out = dict(schema)
    out["field"] = field
    return out


@dataclass(frozen=True, slots=True)
class Codec:
    """How one column's values become Connect values."""

    schema: ConnectSchema  # without "field"
    convert: Converter | None  # None: the text is the value
    placeholder: Any  # what an unchanged TOAST value becomes


# --- numbers -----------------------------------------------------------------------------


def _float(text: str) -> float:
    v = float(text)
    return v if v - v == 0 else NonFiniteFloat(v)


def _bool(text: str) -> bool:
    if text == "t" or text == "true":  # output function, or a ::text cast
        return True
    if text == "f" or text == "false":
        return False
    raise SchemaError(f"not a boolean: {text!r}")


def unscaled_bytes(unscaled: int) -> bytes:
    """Big-endian two's complement, fewest bytes (java.math.BigInteger.toByteArray)."""
    return unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)


def bytes_to_unscaled(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _decimal(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation as e:
        raise SchemaError(f"not a numeric: {text!r}") from e


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric type modifier, None when unconstrained."""
    if typmod < 4:
        return None
    t = typmod - 4
    scale = ((t & 0x7FF) ^ 1024) - 1024  # 11-bit signed since PostgreSQL 15
    return (t >> 16) & 0xFFFF, scale


_SPECIAL_NUMERIC = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}


def _special_precise(column: str) -> SchemaError:
    return SchemaError(
        f"column {column}: a special numeric value (NaN/Infinity) cannot be encoded with "
        "decimal_handling_mode=precise; set CDC_SCHEMA__DECIMAL_HANDLING_MODE=string or double"
    )


def _numeric_codec(col: str, typmod: int, mode: DecimalHandling, optional: bool) -> Codec:
    pm = numeric_typmod(typmod)
    if mode is DecimalHandling.STRING:

        def to_string(text: str) -> str:
            special = _SPECIAL_NUMERIC.get(text)
            return special if special is not None else str(_decimal(text))

        return Codec(connect_schema("string", optional), to_string, None)
    if mode is DecimalHandling.DOUBLE:
        return Codec(connect_schema("float64", optional), _float, None)
    if pm is None:
        # Unconstrained numeric: io.debezium.data.VariableScaleDecimal, scale stripped of
        # trailing zeros and never negative.
        def to_vsd(text: str) -> dict[str, Any]:
            if text in _SPECIAL_NUMERIC:
                raise _special_precise(col)
            sign, digits, exp = _digits(text)
            # Trailing zeros are stripped and the scale is never negative (Debezium).
            while exp < 0 and len(digits) > 1 and digits[-1] == "0":
                digits = digits[:-1]
                exp += 1
            unscaled = int(digits) * int(10**exp) if exp > 0 else int(digits)
            return {"scale": max(0, -exp), "value": unscaled_bytes(-unscaled if sign else unscaled)}

        schema = connect_schema(
            "struct",
            optional,
            name="io.debezium.data.VariableScaleDecimal",
            version=1,
            doc="Variable scaled decimal",
            fields=[
                with_field(connect_schema("int32", False), "scale"),
                with_field(connect_schema("bytes", False), "value"),
            ],
        )
        return Codec(schema, to_vsd, None)
    precision, scale = pm

    def to_decimal(text: str) -> bytes:
        # Fast path of scaled_integer (PostgreSQL renders exactly `scale` digits), inlined
        # with unscaled_bytes: this runs for every numeric value. Specials have no dot.
        dot = text.find(".")
        if scale > 0 and dot > 0 and len(text) - dot - 1 == scale and "e" not in text:
            u = int(text.replace(".", "", 1))
            return u.to_bytes(u.bit_length() // 8 + 1, "big", signed=True)
        if text in _SPECIAL_NUMERIC:
            raise _special_precise(col)
        return unscaled_bytes(scaled_integer(text, scale))

    schema = connect_schema(
        "bytes",
        optional,
        name="org.apache.kafka.connect.data.Decimal",
        version=1,
        parameters={"scale": str(scale), "connect.decimal.precision": str(precision)},
    )
    return Codec(schema, to_decimal, None)


def _digits(text: str) -> tuple[int, str, int]:
    """(sign, digit string, exponent) of a decimal's text, exactly (no context rounding)."""
    t = _decimal(text).as_tuple()
    if not isinstance(t.exponent, int):
        raise SchemaError(f"not a finite numeric: {text!r}")
    return t.sign, "".join(map(str, t.digits)) or "0", t.exponent


def scaled_integer(text: str, scale: int) -> int:
    """The unscaled integer of a decimal's text at ``scale``, rounding half up if needed."""
    dot = text.find(".")
    if scale > 0 and dot > 0 and len(text) - dot - 1 == scale and "e" not in text:
        return int(text[:dot] + text[dot + 1 :])  # PostgreSQL renders exactly `scale` digits
    if scale == 0 and dot < 0 and "e" not in text:
        return int(text)
    sign, digits, exp = _digits(text)
    shift = exp + scale
    if shift >= 0:
        unscaled = int(digits) * int(10**shift)
    else:  # more fraction digits than the scale: round half up, like BigDecimal.setScale
        q, r = divmod(int(digits), 10**-shift)
        unscaled = q + (1 if 2 * r >= 10**-shift else 0)
    return -unscaled if sign else unscaled


def _money_amount(text: str) -> Decimal:
    # lc_monetary=C renders "$1,234.56" and "-$1,234.56".
    neg = text.startswith("-") or text.startswith("(")
    digits = "".join(c for c in text if c.isdigit() or c == ".")
    d = _decimal(digits)
    return -d if neg else d


def _money_codec(mode: DecimalHandling, optional: bool) -> Codec:
    if mode is DecimalHandling.STRING:
        return Codec(
            connect_schema("string", optional), lambda t: format(_money_amount(t), "f"), None
        )
    if mode is DecimalHandling.DOUBLE:
        return Codec(connect_schema("float64", optional), lambda t: float(_money_amount(t)), None)

    def to_decimal(text: str) -> bytes:
        return unscaled_bytes(scaled_integer(str(_money_amount(text)), MONEY_FRACTION_DIGITS))

    schema = connect_schema(
        "bytes",
        optional,
        name="org.apache.kafka.connect.data.Decimal",
        version=1,
        parameters={"scale": str(MONEY_FRACTION_DIGITS)},
    )
    return Codec(schema, to_decimal, None)


# --- binary ------------------------------------------------------------------------------


def _bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    raise SchemaError("bytea must be rendered with bytea_output=hex (as Debezium requires)")


def _binary_codec(mode: BinaryHandling, optional: bool) -> Codec:
    ph = UNAVAILABLE_VALUE_PLACEHOLDER.encode()
    if mode is BinaryHandling.BASE64:
        return Codec(
            connect_schema("string", optional),
            lambda t: base64.b64encode(_bytea(t)).decode("ascii"),
            base64.b64encode(ph).decode("ascii"),
        )
    if mode is BinaryHandling.HEX:
        return Codec(connect_schema("string", optional), lambda t: _bytea(t).hex(), ph.hex())
    return Codec(connect_schema("bytes", optional), _bytea, ph)


# --- time --------------------------------------------------------------------------------


def _time_precision(typmod: int) -> int:
    return 6 if typmod < 0 else typmod


_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def _date(text: str) -> int:
    if len(text) == 10 and text[4] == "-" and text[7] == "-":
        try:  # the common case, in C; anything it refuses takes the exact parser below
            return date.fromisoformat(text).toordinal() - _EPOCH_ORDINAL
        except ValueError:
            pass
    if text == "infinity":
        return DATE_POSITIVE_INFINITY_DAYS
    if text == "-infinity":
        return DATE_NEGATIVE_INFINITY_DAYS
    return parse_date(text)


_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _timestamp_micros(text: str) -> int:
    if text == "infinity":
        return TIMESTAMP_POSITIVE_INFINITY_MICROS
    if text == "-infinity":
        return TIMESTAMP_NEGATIVE_INFINITY_MICROS
    if len(text) < 27 and text[4] == "-":  # common case: the C parser
        try:
            return (datetime.fromisoformat(text) - _EPOCH) // _MICROSECOND
        except ValueError:
            pass
    return parse_timestamp(text)


def _timestamp_millis(text: str) -> int:
    return _timestamp_micros(text) // 1000


def _timestamptz(width: int) -> Converter:
    def convert(text: str) -> str:
        n = len(text)
        # Microseconds in full, already UTC: the most common layout, sliced in one go.
        if (
            n == 29
            and width == 6
            and text[19] == "."
            and text.endswith("+00")
            and text[4] == "-"
            and text[10] == " "
        ):
            return f"{text[:10]}T{text[11:26]}Z"
        if text.endswith("+00") and n >= 22 and text[4] == "-" and text[10] == " ":
            # Already UTC (the session's TimeZone): only the layout changes.
            frac = text[20:-3] if n > 22 else ""
            if width > 0:
                frac = "." + (frac + "000000")[:width]
            elif frac:
                frac = "." + frac
            return f"{text[:10]}T{text[11:19]}{frac}Z"
        if text == "infinity" or text == "-infinity":
            return text
        return format_utc_timestamp(parse_timestamp(text), width)

    return convert


def _timetz(text: str) -> str:
    micros, offset = parse_timetz(text)
    if micros == _MICROS_PER_DAY and offset == 0:
        return "24:00:00Z"
    return format_utc_time((micros - offset * 1_000_000) % _MICROS_PER_DAY)


def _interval_micros(text: str) -> int:
    y, mo, d, h, mi, s = parse_interval(text)
    days = (y * 12 + mo) * _DAYS_PER_MONTH_AVG + d
    secs = ((days * 24.0 + h) * 60.0 + mi) * 60.0 + float(s)
    return int(secs * 1_000_000.0)  # truncates toward zero like Java's (long) cast


def _interval_iso(text: str) -> str:
    y, mo, d, h, mi, s = parse_interval(text)
    secs = format(s.normalize(), "f") if s else "0"
    return f"P{y}Y{mo}M{d}DT{h}H{mi}M{secs}S"


# --- other types -------------------------------------------------------------------------

_POINT_SCHEMA_FIELDS = [
    with_field(connect_schema("float64", False), "x"),
    with_field(connect_schema("float64", False), "y"),
    with_field(connect_schema("bytes", True), "wkb"),
    with_field(connect_schema("int32", True), "srid"),
]


def _point(text: str) -> dict[str, Any]:
    if not (text.startswith("(") and text.endswith(")")):
        raise SchemaError(f"not a point: {text!r}")
    xs, ys = text[1:-1].split(",")
    x, y = float(xs), float(ys)
    # Debezium's Point carries the OGC WKB of the point too (little endian, type 1).
    return {"x": x, "y": y, "wkb": struct.pack("<BIdd", 1, 1, x, y), "srid": None}


def _hstore_json(text: str) -> str:
    return orjson.dumps(dict(parse_hstore(text))).decode()


def _named_string(
    name: str, optional: bool, parameters: dict[str, str] | None = None
) -> ConnectSchema:
    return connect_schema("string", optional, name=name, version=1, parameters=parameters)


def resolve_domain(pg_type: PgType, typmod: int) -> tuple[PgType, int]:
    """A domain's base type; the domain's own modifier applies when the column has none."""
    t = pg_type
    while t.kind == "d" and t.base is not None:
        if typmod < 0:
            typmod = t.typmod
        t = t.base
    return t, typmod


def codec_for(column: Column, settings: SchemaSettings) -> Codec:
    """The Connect schema and the converter for one column."""
    return type_codec(column.name, column.type, column.type_modifier, column.optional, settings)


def type_codec(
    col: str, pg_type: PgType, typmod: int, optional: bool, settings: SchemaSettings
) -> Codec:
    """The codec of a value of ``pg_type`` (a column, or an array's element)."""
    t, typmod = resolve_domain(pg_type, typmod)
    ph = UNAVAILABLE_VALUE_PLACEHOLDER
    oid = t.oid
    if oid == oids.BOOL:
        return Codec(connect_schema("boolean", optional), _bool, None)
    if oid == oids.INT2:
        return Codec(connect_schema("int16", optional), int, None)
    if oid == oids.INT4:
        return Codec(connect_schema("int32", optional), int, None)
    if oid in (oids.INT8, oids.OID):
        return Codec(connect_schema("int64", optional), int, None)
    if oid == oids.FLOAT4:
        return Codec(connect_schema("float32", optional), _float, None)
    if oid == oids.FLOAT8:
        return Codec(connect_schema("float64", optional), _float, None)
    if oid == oids.NUMERIC:
        return _numeric_codec(col, typmod, settings.decimal_handling_mode, optional)
    if oid == oids.MONEY:
        return _money_codec(settings.decimal_handling_mode, optional)
    if (
        oid
        in (
            oids.TEXT,
            oids.VARCHAR,
            oids.BPCHAR,
            oids.NAME,
            oids.CHAR,
            oids.INET,
            oids.CIDR,
            oids.MACADDR,
            oids.MACADDR8,
        )
        or t.kind == "r"
        or t.name == "citext"
    ):
        return Codec(connect_schema("string", optional), None, ph)
    if oid == oids.BYTEA:
        return _binary_codec(settings.binary_handling_mode, optional)
    if oid == oids.UUID:
        return Codec(_named_string("io.debezium.data.Uuid", optional), None, ph)
    if oid in (oids.JSON, oids.JSONB):
        return Codec(_named_string("io.debezium.data.Json", optional), None, ph)
    if oid == oids.XML:
        return Codec(_named_string("io.debezium.data.Xml", optional), None, ph)
    if oid == oids.DATE:
        return Codec(
            connect_schema("int32", optional, name="io.debezium.time.Date", version=1), _date, None
        )
    if oid == oids.TIME:
        if _time_precision(typmod) <= 3:
            schema = connect_schema("int32", optional, name="io.debezium.time.Time", version=1)
            return Codec(schema, lambda s: parse_time(s) // 1000, None)
        schema = connect_schema("int64", optional, name="io.debezium.time.MicroTime", version=1)
        return Codec(schema, parse_time, None)
    if oid == oids.TIMETZ:
        return Codec(_named_string("io.debezium.time.ZonedTime", optional), _timetz, None)
    if oid == oids.TIMESTAMP:
        if _time_precision(typmod) <= 3:
            schema = connect_schema("int64", optional, name="io.debezium.time.Timestamp", version=1)
            return Codec(schema, _timestamp_millis, None)
        schema = connect_schema(
            "int64", optional, name="io.debezium.time.MicroTimestamp", version=1
        )
        return Codec(schema, _timestamp_micros, None)
    if oid == oids.TIMESTAMPTZ:
        schema = _named_string("io.debezium.time.ZonedTimestamp", optional)
        return Codec(schema, _timestamptz(_time_precision(typmod)), None)
    if oid == oids.INTERVAL:
        if settings.interval_handling_mode is IntervalHandling.STRING:
            return Codec(_named_string("io.debezium.time.Interval", optional), _interval_iso, None)
        schema = connect_schema("int64", optional, name="io.debezium.time.MicroDuration", version=1)
        return Codec(schema, _interval_micros, None)
    if oid == oids.POINT:
        schema = connect_schema(
            "struct",
            optional,
            name="io.debezium.data.geometry.Point",
            version=1,
            doc="Geometry (POINT)",
            fields=_POINT_SCHEMA_FIELDS,
        )
        return Codec(schema, _point, None)
    if t.kind == "e":
        schema = _named_string(
            "io.debezium.data.Enum", optional, {"allowed": ",".join(t.enum_values)}
        )
        return Codec(schema, None, ph)
    if t.name == "hstore":
        return Codec(_named_string("io.debezium.data.Json", optional), _hstore_json, ph)
    if t.name == "ltree":
        return Codec(_named_string("io.debezium.data.Ltree", optional), None, ph)
    if t.name == "tsvector":
        return Codec(_named_string("io.debezium.data.TsVector", optional), None, ph)
    if t.element is not None:
        return _array_codec(col, t.element, typmod, optional, settings)
    # Anything else passes through as its text, with the type's name in the schema.
    schema = connect_schema("string", optional, parameters={SOURCE_TYPE_PARAMETER: t.name})
    return Codec(schema, None, ph)


def _array_codec(
    col: str, element: PgType, typmod: int, optional: bool, settings: SchemaSettings
) -> Codec:
    el = type_codec(col, element, typmod, True, settings)
    conv = el.convert

    def convert_items(items: list[Any]) -> list[Any]:
        out: list[Any] = []
        for v in items:
            if v is None:
                out.append(None)
            elif isinstance(v, list):
                out.append(convert_items(v))
            elif conv is None:
                out.append(v)
            else:
                out.append(conv(v))
        return out

    def convert(text: str) -> list[Any]:
        return convert_items(parse_array(text))

    placeholder = None if el.placeholder is None else [el.placeholder]
    return Codec(connect_schema("array", optional, items=el.schema), convert, placeholder)
