"""What a column holds when a row does not say: its DEFAULT, and Debezium's fallback.

- :func:`schema_default` is the ``default`` of a column's value schema, derived from the
  column's DEFAULT expression the way Debezium's PostgresDefaultValueConverter derives it: a
  literal (``'abc'::text``, ``42``) is converted like a value of the column; a function or
  ``CURRENT_*`` is a placeholder (zero, the epoch, empty); anything else (an expression, a
  type without a mapper: bytea, money, arrays, domains, an unconstrained numeric's struct)
  gives no default.
- :func:`fallback` is what Debezium writes for a NOT NULL column without a default when the
  row does not carry it (the old row of a delete under REPLICA IDENTITY DEFAULT carries only
  the key): the type's zero. A null there would make Kafka Connect refuse the record.
"""

from __future__ import annotations

import re
from typing import Any

from schemas.connect import DECIMAL_NAME, Codec
from schemas.convert import point_struct
from schemas.model import Column

# A default computed by a function call, e.g. nextval('s'::regclass) or now().
_FUNCTION_DEFAULT = re.compile(r"[(]?[A-Za-z0-9_.]+\(.*\)")
_CURRENT_DATE_TIMES = frozenset(
    {"current_timestamp", "current_time", "current_date", "localtime", "localtimestamp"}
)
_LITERAL = re.compile(r"'(.*?)'")
# Types whose default Debezium parses, with the text it uses for a generated default.
_GENERATED_PLACEHOLDER = {
    "bit": "00",
    "varbit": "0",
    "bool": "false",
    "bpchar": "",
    "varchar": "",
    "text": "",
    "numeric": "0.0",
    "float4": "0.0",
    "float8": "0.0",
    "int2": "0",
    "int4": "0",
    "int8": "0",
    "json": "{}",
    "jsonb": "{}",
    "xml": "",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "date": "1970-01-01",
    "time": "00:00:00",
    "timestamp": "1970-01-01 00:00:00",
    "timestamptz": "1970-01-01 00:00:00+00",
    "interval": "00:00:00",
}
_TRIMMED = frozenset(_GENERATED_PLACEHOLDER) - {"bpchar", "varchar", "text", "json", "jsonb", "xml"}
# A literal NULL of these types is no default (the others keep the text "NULL::…").
_NULL_AWARE = frozenset({"bool", "numeric", "float4", "float8", "int2", "int4", "int8"})


def _extract(expr: str, placeholder: str) -> str | None:
    """The default's literal text (Debezium's extractDefault)."""
    if _FUNCTION_DEFAULT.match(expr) or expr.lower() in _CURRENT_DATE_TIMES:
        return placeholder
    if "'" not in expr:
        return None if expr.startswith("NULL::") else expr
    m = _LITERAL.search(expr)
    return m.group(1) if m else None


def _default_text(column: Column) -> str | None:
    """The default as text of the column's type, or None when Debezium gives none."""
    expr = column.default
    t = column.type
    if expr is None:
        return None
    if t.kind == "e":
        suffix = f"::{t.name}"
        if not expr.endswith(suffix):
            return None
        literal = expr[: -len(suffix)]
        if len(literal) >= 2 and literal[0] == literal[-1] == "'":
            return literal[1:-1]
        return None
    placeholder = _GENERATED_PLACEHOLDER.get(t.name)
    if placeholder is None:  # no mapper for the type (bytea, money, arrays, domains...)
        return None
    if t.name in _TRIMMED:
        expr = expr.strip()
    if t.name in _NULL_AWARE and expr.startswith("NULL::"):
        return None
    text = _extract(expr, placeholder)
    if text is not None and t.name == "bool":
        text = "true" if text.lower() == "true" else "false"
    return text


def schema_default(column: Column, codec: Codec) -> tuple[bool, Any]:
    """(whether the value schema has a default, the default as a Connect value)."""
    text = _default_text(column)
    if text is None:
        return False, None
    if column.type.name == "bit" and len(text) > 1 and column.type_modifier == 1:
        text = "1" if "1" in text else "0"  # a generated bit(1) default reads as false/true
    try:
        value = text if codec.convert is None else codec.convert(text)
    except Exception:  # like Debezium: a default it cannot parse is no default
        return False, None
    if value is None or isinstance(value, dict):  # Connect cannot hold a struct default
        return False, None
    return True, value


def fallback(codec: Codec, type_name: str) -> Any:
    """The Connect value Debezium writes for a NOT NULL column the row does not carry."""
    schema = codec.schema
    ctype = schema["type"]
    name = schema.get("name")
    if ctype == "array":
        return []
    if ctype == "map":  # hstore_handling_mode=map
        return {}
    if name == "io.debezium.data.geometry.Point":
        return point_struct("(0,0)")
    if name == "io.debezium.data.VariableScaleDecimal":
        return {"scale": 0, "value": b"\x00"}
    if name == DECIMAL_NAME:
        return b"\x00"
    if name == "io.debezium.time.ZonedTimestamp":
        return "1970-01-01T00:00:00Z"
    if name == "io.debezium.time.ZonedTime":
        return "00:00:00Z"
    if type_name == "hstore":
        return "{}"
    if ctype == "boolean":
        return False
    if ctype == "bytes":
        return b""
    if ctype == "string":
        return ""
    if ctype in ("float", "double"):
        return 0.0
    return 0
