"""Debezium payload values → natural JSON values for followers.

Debezium encodes many types compactly (decimals as base64 two's-complement bytes, dates as days
since the epoch, timestamps as epoch micros). A search index and a cache want values a person
or a query can use, so followers store:

- Decimal / VariableScaleDecimal → the exact decimal as a string ("12.30", "NaN");
- io.debezium.time.Date → "YYYY-MM-DD";
- Timestamp / MicroTimestamp / NanoTimestamp → ISO-8601 without zone ("2024-01-02T03:04:05.123456");
- Time / MicroTime / NanoTime → "HH:MM:SS.ffffff";
- everything else as it came (ZonedTimestamp is already ISO, Json is a JSON string, bytes are
  base64, arrays element by element).

Pure code: the Spark jobs call it inside partitions; it has no Spark dependency.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER, UNAVAILABLE_VALUE_PLACEHOLDERS

Converter = Callable[[Any], Any]
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)


def _identity(v: Any) -> Any:
    return v


def _decimal_from_bytes(b64: str, scale: int) -> str:
    unscaled = int.from_bytes(base64.b64decode(b64), "big", signed=True)
    return str(Decimal(unscaled).scaleb(-scale))


def _decimal(scale: int) -> Converter:
    def conv(v: Any) -> Any:
        return v if not isinstance(v, str) else _decimal_from_bytes(v, scale)

    return conv


def _variable_decimal(v: Any) -> Any:
    if isinstance(v, Mapping) and "value" in v:
        return _decimal_from_bytes(v["value"], int(v.get("scale", 0)))
    return v


def _date(v: Any) -> Any:
    return (EPOCH_DATE + dt.timedelta(days=v)).isoformat() if isinstance(v, int) else v


def _timestamp(per_second: int) -> Converter:
    def conv(v: Any) -> Any:
        if not isinstance(v, int):
            return v
        secs, frac = divmod(v, per_second)
        micros = frac * 1_000_000 // per_second
        try:
            return (EPOCH + dt.timedelta(seconds=secs, microseconds=micros)).isoformat()
        except OverflowError:  # outside Python's datetime range (e.g. ±infinity sentinels)
            return v

    return conv


def _time(per_second: int) -> Converter:
    def conv(v: Any) -> Any:
        if not isinstance(v, int):
            return v
        micros = v * 1_000_000 // per_second
        secs, us = divmod(micros, 1_000_000)
        h, rem = divmod(secs, 3600)
        m, s = divmod(rem, 60)
        return f"{h:02d}:{m:02d}:{s:02d}.{us:06d}"

    return conv


_BY_NAME: dict[str, Converter] = {
    "io.debezium.data.VariableScaleDecimal": _variable_decimal,
    "io.debezium.time.Date": _date,
    "io.debezium.time.Timestamp": _timestamp(1_000),
    "io.debezium.time.MicroTimestamp": _timestamp(1_000_000),
    "io.debezium.time.NanoTimestamp": _timestamp(1_000_000_000),
    "io.debezium.time.Time": _time(1_000),
    "io.debezium.time.MicroTime": _time(1_000_000),
    "io.debezium.time.NanoTime": _time(1_000_000_000),
}


def field_converter(schema: Mapping[str, Any]) -> Converter:
    """The converter for one Connect field schema (JsonConverter's schema JSON)."""
    name = schema.get("name")
    if name == "org.apache.kafka.connect.data.Decimal":
        return _decimal(int(schema.get("parameters", {}).get("scale", 0)))
    if name in _BY_NAME:
        return _BY_NAME[name]
    if schema.get("type") == "array" and isinstance(schema.get("items"), Mapping):
        inner = field_converter(schema["items"])
        if inner is _identity:
            return _identity
        return lambda v: [inner(x) for x in v] if isinstance(v, list) else v
    return _identity


class RowConverter:
    """Converts a Debezium ``after`` struct into a natural document, noting unchanged TOAST."""

    __slots__ = ("_convs",)

    def __init__(self, row_schema: Mapping[str, Any] | None) -> None:
        self._convs: dict[str, Converter] = {}
        for f in (row_schema or {}).get("fields", ()):
            conv = field_converter(f)
            if conv is not _identity:
                self._convs[f["field"]] = conv

    def __call__(self, row: Mapping[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
        doc: dict[str, Any] = {}
        unchanged: list[str] = []
        convs = self._convs
        for k, v in row.items():
            if v in UNAVAILABLE_VALUE_PLACEHOLDERS or (
                isinstance(v, list) and v == [UNAVAILABLE_VALUE_PLACEHOLDER]
            ):
                unchanged.append(k)
                continue
            if v is None:
                doc[k] = None
                continue
            conv = convs.get(k)
            doc[k] = conv(v) if conv is not None else v
        return doc, frozenset(unchanged)


def after_schema(envelope_schema: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The ``after`` field's struct schema inside a Debezium envelope schema."""
    if not envelope_schema:
        return None
    for f in envelope_schema.get("fields", ()):
        if f.get("field") == "after":
            return f  # type: ignore[no-any-return]
    return None
