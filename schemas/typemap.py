"""PostgreSQL type → Kafka Connect schema and value, the way Debezium's PostgreSQL connector
maps them (decimal.handling.mode, binary.handling.mode, interval.handling.mode,
time.precision.mode, hstore.handling.mode; include.unknown.datatypes in
:mod:`schemas.plan`).

Values arrive as PostgreSQL's text output, so every converter goes by type OID from text
(the converters themselves are in :mod:`schemas.convert`). A value of a type we do not know
passes through as its text, with the type name in the schema: nothing is ever dropped.
"""

from __future__ import annotations

import logging
from typing import Any

from pgcdc.core.contract import (
    UNAVAILABLE_VALUE_PLACEHOLDER,
    UNAVAILABLE_VALUE_PLACEHOLDER_B64,
    UNAVAILABLE_VALUE_PLACEHOLDER_HEX,
)
from pgcdc.core.errors import SchemaError
from pgcdc.core.settings import (
    BinaryHandling,
    DecimalHandling,
    HStoreHandling,
    IntervalHandling,
    SchemaSettings,
    TimePrecision,
)
from schemas import oids
from schemas.connect import (
    DECIMAL_NAME,
    DOUBLE,
    FLOAT,
    Codec,
    ConnectSchema,
    connect_schema,
    with_field,
)
from schemas.convert import (
    bit_flag,
    bits_bytes,
    bytea_base64,
    bytea_bytes,
    bytea_hex,
    hstore_json,
    hstore_map,
    interval_iso,
    interval_micros,
    money_amount,
    numeric_typmod,
    point_struct,
    scaled_integer,
    time_millis,
    timestamp_micros,
    timestamp_millis,
    timestamptz_converter,
    timetz_utc,
    to_bool,
    to_decimal,
    to_epoch_days,
    to_float,
    unscaled_bytes,
    variable_scale_digits,
)
from schemas.model import Column, PgType
from schemas.pgtext import ARRAY_DELIMITER, BOX_ARRAY_DELIMITER, parse_array, parse_time

log = logging.getLogger(__name__)

# The length Debezium gives a bit varying without one (the JDBC driver's column size).
UNBOUNDED_BITS_LENGTH = 2147483647
# Debezium's money.fraction.digits default.
MONEY_FRACTION_DIGITS = 2
# Debezium's column.propagate.source.type parameter name, used for pass-through types.
SOURCE_TYPE_PARAMETER = "__debezium.source.column.type"
# Kafka Connect's own logical types (time.precision.mode=connect).
CONNECT_DATE = "org.apache.kafka.connect.data.Date"
CONNECT_TIME = "org.apache.kafka.connect.data.Time"
CONNECT_TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"

_SPECIAL_NUMERIC = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}
# Types whose text is the Connect string as it is.
_PLAIN_STRING_OIDS = (
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
            return special if special is not None else str(to_decimal(text))

        # numeric is a varlena: a large one is TOASTed, so it has a placeholder.
        return Codec(connect_schema("string", optional), to_string, UNAVAILABLE_VALUE_PLACEHOLDER)
    if mode is DecimalHandling.DOUBLE:
        return Codec(connect_schema(DOUBLE, optional), to_float, None)  # no room: null
    if pm is None:
        # Unconstrained numeric: io.debezium.data.VariableScaleDecimal, scale stripped of
        # trailing zeros and never negative.
        def to_vsd(text: str) -> dict[str, Any]:
            if text in _SPECIAL_NUMERIC:
                raise _special_precise(col)
            unscaled, scale = variable_scale_digits(text)
            return {"scale": scale, "value": unscaled_bytes(unscaled)}

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
        return Codec(schema, to_vsd, None)  # a struct has no room for a placeholder: null
    precision, scale = pm

    def to_decimal_bytes(text: str) -> bytes:
        # Fast path of scaled_integer (PostgreSQL renders exactly `scale` digits), inlined
        # with unscaled_bytes: this runs for every numeric value. Specials have no dot.
        dot = text.find(".")
        if scale > 0 and dot > 0 and len(text) - dot - 1 == scale and "e" not in text:
            u = int(text.replace(".", "", 1))
            # unscaled_bytes inlined: Java's fewest bytes (a negative's bits without its sign).
            bits = u.bit_length() if u >= 0 else (~u).bit_length()
            return u.to_bytes(bits // 8 + 1, "big", signed=True)
        if text in _SPECIAL_NUMERIC:
            raise _special_precise(col)
        return unscaled_bytes(scaled_integer(text, scale))

    schema = connect_schema(
        "bytes",
        optional,
        name=DECIMAL_NAME,
        version=1,
        parameters={"scale": str(scale), "connect.decimal.precision": str(precision)},
    )
    # Connect's Decimal is bytes: the placeholder's bytes, as in a bytea column.
    return Codec(schema, to_decimal_bytes, UNAVAILABLE_VALUE_PLACEHOLDER.encode())


def _money_codec(mode: DecimalHandling, optional: bool) -> Codec:
    if mode is DecimalHandling.STRING:
        return Codec(
            connect_schema("string", optional), lambda t: format(money_amount(t), "f"), None
        )
    if mode is DecimalHandling.DOUBLE:
        return Codec(connect_schema(DOUBLE, optional), lambda t: float(money_amount(t)), None)

    def to_decimal_bytes(text: str) -> bytes:
        return unscaled_bytes(scaled_integer(str(money_amount(text)), MONEY_FRACTION_DIGITS))

    schema = connect_schema(
        "bytes",
        optional,
        name=DECIMAL_NAME,
        version=1,
        parameters={"scale": str(MONEY_FRACTION_DIGITS)},
    )
    return Codec(schema, to_decimal_bytes, None)


def _bits_codec(typmod: int, optional: bool) -> Codec:
    """bit(n) / bit varying(n): a boolean when n is 1, else io.debezium.data.Bits."""
    if typmod == 1:
        return Codec(connect_schema("boolean", optional), bit_flag, None)
    length = str(typmod) if typmod > 0 else str(UNBOUNDED_BITS_LENGTH)
    schema = connect_schema(
        "bytes", optional, name="io.debezium.data.Bits", version=1, parameters={"length": length}
    )
    return Codec(schema, bits_bytes, None)


def _binary_codec(mode: BinaryHandling, optional: bool) -> Codec:
    # The placeholder's bytes in the binary mode in force, as Debezium writes them.
    if mode is BinaryHandling.BASE64:
        schema = connect_schema("string", optional)
        return Codec(schema, bytea_base64, UNAVAILABLE_VALUE_PLACEHOLDER_B64)
    if mode is BinaryHandling.HEX:
        schema = connect_schema("string", optional)
        return Codec(schema, bytea_hex, UNAVAILABLE_VALUE_PLACEHOLDER_HEX)
    return Codec(
        connect_schema("bytes", optional), bytea_bytes, UNAVAILABLE_VALUE_PLACEHOLDER.encode()
    )


def _time_precision(typmod: int) -> int:
    return 6 if typmod < 0 else typmod


def _time_codec(typmod: int, mode: TimePrecision, optional: bool) -> Codec:
    """time: milliseconds up to time(3) and micros above (adaptive), micros always
    (adaptive_time_microseconds), Connect's Time in milliseconds (connect)."""
    if mode is TimePrecision.CONNECT:
        schema = connect_schema("int32", optional, name=CONNECT_TIME, version=1)
        return Codec(schema, time_millis, None)
    if mode is TimePrecision.ADAPTIVE and _time_precision(typmod) <= 3:
        schema = connect_schema("int32", optional, name="io.debezium.time.Time", version=1)
        return Codec(schema, time_millis, None)
    schema = connect_schema("int64", optional, name="io.debezium.time.MicroTime", version=1)
    return Codec(schema, parse_time, None)


def _timestamp_codec(typmod: int, mode: TimePrecision, optional: bool) -> Codec:
    """timestamp: milliseconds up to timestamp(3) and micros above (both adaptive modes),
    Connect's Timestamp in milliseconds (connect)."""
    if mode is TimePrecision.CONNECT:
        schema = connect_schema("int64", optional, name=CONNECT_TIMESTAMP, version=1)
        return Codec(schema, timestamp_millis, None)
    if _time_precision(typmod) <= 3:
        schema = connect_schema("int64", optional, name="io.debezium.time.Timestamp", version=1)
        return Codec(schema, timestamp_millis, None)
    schema = connect_schema("int64", optional, name="io.debezium.time.MicroTimestamp", version=1)
    return Codec(schema, timestamp_micros, None)


_POINT_SCHEMA_FIELDS = [
    with_field(connect_schema(DOUBLE, False), "x"),
    with_field(connect_schema(DOUBLE, False), "y"),
    with_field(connect_schema("bytes", True), "wkb"),
    with_field(connect_schema("int32", True), "srid"),
]


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


def codec_for(column: Column, settings: SchemaSettings, table: str = "") -> Codec:
    """The Connect schema and the converter for one column (of ``table``, for messages)."""
    return type_codec(
        column.name,
        column.type,
        column.type_modifier,
        column.optional,
        settings,
        column.dims,
        table=table,
    )


def type_codec(
    col: str,
    pg_type: PgType,
    typmod: int,
    optional: bool,
    settings: SchemaSettings,
    dims: int = 0,
    table: str = "",
) -> Codec:
    """The codec of a value of ``pg_type`` (a column, or an array's element); ``dims`` is
    an array column's declared number of dimensions."""
    t, typmod = resolve_domain(pg_type, typmod)
    ph = UNAVAILABLE_VALUE_PLACEHOLDER
    oid = t.oid
    if oid == oids.BOOL:
        return Codec(connect_schema("boolean", optional), to_bool, None)
    if oid == oids.INT2:
        return Codec(connect_schema("int16", optional), int, None)
    if oid == oids.INT4:
        return Codec(connect_schema("int32", optional), int, None)
    if oid in (oids.INT8, oids.OID):
        return Codec(connect_schema("int64", optional), int, None)
    if oid == oids.FLOAT4:
        return Codec(connect_schema(FLOAT, optional), to_float, None)
    if oid == oids.FLOAT8:
        return Codec(connect_schema(DOUBLE, optional), to_float, None)
    if oid in (oids.BIT, oids.VARBIT):
        return _bits_codec(typmod, optional)
    if oid == oids.NUMERIC:
        return _numeric_codec(col, typmod, settings.decimal_handling_mode, optional)
    if oid == oids.MONEY:
        return _money_codec(settings.decimal_handling_mode, optional)
    if oid in _PLAIN_STRING_OIDS or t.kind == "r" or t.name == "citext":
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
        name = "io.debezium.time.Date"
        if settings.time_precision_mode is TimePrecision.CONNECT:
            name = CONNECT_DATE
        return Codec(connect_schema("int32", optional, name=name, version=1), to_epoch_days, None)
    if oid == oids.TIME:
        return _time_codec(typmod, settings.time_precision_mode, optional)
    if oid == oids.TIMETZ:
        return Codec(_named_string("io.debezium.time.ZonedTime", optional), timetz_utc, None)
    if oid == oids.TIMESTAMP:
        return _timestamp_codec(typmod, settings.time_precision_mode, optional)
    if oid == oids.TIMESTAMPTZ:
        schema = _named_string("io.debezium.time.ZonedTimestamp", optional)
        return Codec(schema, timestamptz_converter(_time_precision(typmod)), None)
    if oid == oids.INTERVAL:
        if settings.interval_handling_mode is IntervalHandling.STRING:
            return Codec(_named_string("io.debezium.time.Interval", optional), interval_iso, None)
        schema = connect_schema("int64", optional, name="io.debezium.time.MicroDuration", version=1)
        return Codec(schema, interval_micros, None)
    if oid == oids.POINT:
        schema = connect_schema(
            "struct",
            optional,
            name="io.debezium.data.geometry.Point",
            version=1,
            doc="Geometry (POINT)",
            fields=_POINT_SCHEMA_FIELDS,
        )
        return Codec(schema, point_struct, None)
    if t.kind == "e":
        schema = _named_string(
            "io.debezium.data.Enum", optional, {"allowed": ",".join(t.enum_values)}
        )
        return Codec(schema, None, ph)
    if t.name == "hstore":
        if settings.hstore_handling_mode is HStoreHandling.MAP:
            schema = connect_schema(
                "map",
                optional,
                keys=connect_schema("string", False),
                values=connect_schema("string", True),
            )
            # Debezium's placeholder for an unchanged TOASTed hstore map: {ph: ph}.
            return Codec(schema, hstore_map, {ph: ph})
        return Codec(_named_string("io.debezium.data.Json", optional), hstore_json, ph)
    if t.name == "ltree":
        return Codec(_named_string("io.debezium.data.Ltree", optional), None, ph)
    if t.name == "tsvector":
        return Codec(_named_string("io.debezium.data.Tsvector", optional), None, ph)
    if t.element is not None:
        where = f"{table}.{col}" if table else col
        return _array_codec(col, t.element, typmod, optional, settings, max(1, dims), where)
    # Anything else passes through as its text, with the type's name in the schema.
    schema = connect_schema("string", optional, parameters={SOURCE_TYPE_PARAMETER: t.name})
    return Codec(schema, None, ph)


def is_unknown(schema: ConnectSchema) -> bool:
    """A schema of a type without a mapping (text passed through), or an array of one."""
    while schema.get("type") == "array":
        schema = schema["items"]
    return SOURCE_TYPE_PARAMETER in (schema.get("parameters") or {})


def array_delimiter(element: PgType) -> str:
    """The delimiter between the elements of an array of ``element`` (its typdelim)."""
    while element.base is not None:  # a domain's arrays use its base type's delimiter
        element = element.base
    return BOX_ARRAY_DELIMITER if element.name == "box" else ARRAY_DELIMITER


def array_ndims(items: list[Any]) -> int:
    """The dimensions of a parsed array value (PostgreSQL's are rectangular, so the first
    element of each level says; ``{}`` has none)."""
    n = 0
    while isinstance(items, list):
        if not items:
            return n + 1 if n else 0
        n += 1
        items = items[0]
    return n


def fit_dims(items: list[Any], have: int, depth: int) -> list[Any]:
    """THE RULE for an array whose dimensions differ from its column's declaration (which
    PostgreSQL does not enforce): the value is written at the declared depth, its innermost
    dimensions kept. A value with more dimensions has its outer ones merged, in PostgreSQL's
    (row-major) element order; one with fewer gets outer dimensions of length 1. ``{}``
    stays empty. So a value keeps its shape exactly when the column declares it."""
    if not items:
        return items
    while have > depth:
        items = [v for sub in items for v in sub]
        have -= 1
    while have < depth:
        items = [items]
        have += 1
    return items


_reshaped_warned: set[tuple[str, int, int]] = set()


def _warn_reshaped(where: str, have: int, depth: int) -> None:
    if (where, have, depth) in _reshaped_warned:
        return
    _reshaped_warned.add((where, have, depth))
    log.warning(
        "column %s is declared with %d array dimension(s) but holds a %d-dimensional value: "
        "it is written with %d dimension(s) (%s); to keep the shape, declare the column's "
        "dimensions (ALTER TABLE … ALTER COLUMN … TYPE <type>%s, which rewrites nothing)",
        where,
        depth,
        have,
        depth,
        "outer dimensions merged" if have > depth else "outer dimensions of length 1 added",
        "[]" * have,
        extra={"column": where},
    )


def _array_codec(
    col: str,
    element: PgType,
    typmod: int,
    optional: bool,
    settings: SchemaSettings,
    depth: int,
    where: str = "",
) -> Codec:
    """An array column: ``depth`` nested Connect arrays (its declared dimensions); a value
    of other dimensions is fitted to them by :func:`fit_dims`."""
    # Debezium's enum arrays say their items are never null; every other array's may be.
    items_optional = resolve_domain(element, typmod)[0].kind != "e"
    el = type_codec(col, element, typmod, items_optional, settings)
    conv = el.convert

    def leaves(items: list[Any], level: int) -> list[Any]:
        if level == 1:
            return items if conv is None else [v if v is None else conv(v) for v in items]
        return [leaves(v, level - 1) for v in items]

    delimiter = array_delimiter(element)

    def convert(text: str) -> list[Any]:
        items = parse_array(text, delimiter)
        have = array_ndims(items)
        if have != depth and have:
            _warn_reshaped(where or col, have, depth)
            items = fit_dims(items, have, depth)
        return leaves(items, depth) if items else items

    # Debezium's one-element array where the element is text; elsewhere (numbers, bytes,
    # structs) an array of the placeholder would read as a value: null, named by the
    # cdc.unchanged header like every unchanged column.
    placeholder: Any = [el.placeholder] if isinstance(el.placeholder, str) else None
    items = el.schema
    for _ in range(depth - 1):
        items = connect_schema("array", True, items=items)
        placeholder = None if placeholder is None else [placeholder]
    return Codec(connect_schema("array", optional, items=items), convert, placeholder)
