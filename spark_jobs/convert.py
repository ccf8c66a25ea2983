"""Debezium payload values → natural JSON values for followers.

Debezium encodes many types compactly (decimals as base64 two's-complement bytes, dates as days
since the epoch, timestamps as epoch micros). A search index and a cache want values a person
or a query can use, so followers store:

- Decimal / VariableScaleDecimal → the exact decimal as a string ("12.30", "NaN");
- io.debezium.time.Date (and Kafka Connect's Date) → "YYYY-MM-DD";
- Timestamp / MicroTimestamp / NanoTimestamp (and Connect's Timestamp) → ISO-8601 without
  zone ("2024-01-02T03:04:05.123456");
- dates and timestamps outside years 1..9999 as PostgreSQL writes them in JSON: "infinity",
  "-infinity", "10000-01-01", "0044-03-15 BC", "0001-01-01T00:00:00 BC" (Debezium's infinity
  sentinels are recognised), so every value PostgreSQL accepts has an exact follower form;
- Time / MicroTime / NanoTime (and Connect's Time) → "HH:MM:SS.ffffff";
- everything else as it came (ZonedTimestamp is already ISO, Json is a JSON string, bytes are
  base64, arrays element by element).

Pure code: the Spark jobs call it inside partitions; it has no Spark dependency.
"""

from __future__ import annotations

import binascii
import datetime as dt
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from pgcdc.core.contract import PLACEHOLDER_TEXTS
from schemas.convert import (
    DATE_NEGATIVE_INFINITY_DAYS,
    DATE_POSITIVE_INFINITY_DAYS,
    TIMESTAMP_NEGATIVE_INFINITY_MICROS,
    TIMESTAMP_POSITIVE_INFINITY_MICROS,
)
from schemas.pgtext import civil_from_days
from sinks.base import is_placeholder

Converter = Callable[[Any], Any]
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH_ORDINAL = EPOCH_DATE.toordinal()
_from_ordinal = dt.date.fromordinal


def _identity(v: Any) -> Any:
    return v


def _decimal_from_bytes(b64: str, scale: int) -> str:
    # binascii's decoder is what base64.b64decode calls, without its Python wrapper.
    unscaled = int.from_bytes(binascii.a2b_base64(b64), "big", signed=True)
    # Built from text: exact at any precision (scaleb rounds to the context's 28 digits).
    return str(Decimal(f"{unscaled}E{-scale}"))


def _decimal(scale: int) -> Converter:
    def conv(v: Any) -> Any:
        return v if not isinstance(v, str) else _decimal_from_bytes(v, scale)

    return conv


def _variable_decimal(v: Any) -> Any:
    if isinstance(v, Mapping) and "value" in v:
        return _decimal_from_bytes(v["value"], int(v.get("scale", 0)))
    return v


def _civil_date(days: int) -> str:
    """Days since the epoch as PostgreSQL writes the date in JSON, for any year."""
    y, m, d = civil_from_days(days)
    if y <= 0:  # astronomical year 0 is 1 BC
        return f"{1 - y:04d}-{m:02d}-{d:02d} BC"
    return f"{y:04d}-{m:02d}-{d:02d}"


def _date(v: Any) -> Any:
    if not isinstance(v, int):
        return v
    if v == DATE_POSITIVE_INFINITY_DAYS:
        return "infinity"
    if v == DATE_NEGATIVE_INFINITY_DAYS:
        return "-infinity"
    if -719_162 <= v <= 2_932_896:  # 0001-01-01 .. 9999-12-31: Python's own, in C
        return _from_ordinal(v + _EPOCH_ORDINAL).isoformat()
    return _civil_date(v)


_INT64_BOUNDS = frozenset({(1 << 63) - 1, -(1 << 63)})


def _timestamp(per_second: int) -> Converter:
    # Debezium's ±infinity sentinels are microseconds; other units hold them scaled.
    positive = TIMESTAMP_POSITIVE_INFINITY_MICROS * per_second // 1_000_000
    negative = TIMESTAMP_NEGATIVE_INFINITY_MICROS * per_second // 1_000_000

    def conv(v: Any) -> Any:
        if not isinstance(v, int):
            return v
        if v == positive:
            return "infinity"
        if v == negative:
            return "-infinity"
        if v in _INT64_BOUNDS:
            # The reader caps what an int64 cannot hold (after 294247-01-10 in µs), as
            # Debezium does: the true value is lost, so no follower may claim to hold it.
            raise ValueError(f"timestamp {v} is capped at the int64 range: its value is unknown")
        secs, frac = divmod(v, per_second)
        micros = frac * 1_000_000 // per_second
        try:
            return (EPOCH + dt.timedelta(seconds=secs, microseconds=micros)).isoformat()
        except OverflowError:  # outside years 1..9999: PostgreSQL's form
            days, sec_of_day = divmod(secs, 86_400)
            date = _civil_date(days)
            bc = date.endswith(" BC")
            h, rem = divmod(sec_of_day, 3600)
            mi, s = divmod(rem, 60)
            fraction = f".{micros:06d}" if micros else ""
            text = f"{date.removesuffix(' BC')}T{h:02d}:{mi:02d}:{s:02d}{fraction}"
            return text + " BC" if bc else text

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
    # time.precision.mode=connect: Kafka Connect's own logical types (days, milliseconds).
    "org.apache.kafka.connect.data.Date": _date,
    "org.apache.kafka.connect.data.Timestamp": _timestamp(1_000),
    "org.apache.kafka.connect.data.Time": _time(1_000),
}


# Each converter of _BY_NAME as the native path names it (pgcdc_native.FastChanges): kind and
# units a second. VariableScaleDecimal has none: a table with one is converted here.
_NATIVE_BY_NAME: dict[str, tuple[str, int]] = {
    "io.debezium.time.Date": ("date", 0),
    "io.debezium.time.Timestamp": ("timestamp", 1_000),
    "io.debezium.time.MicroTimestamp": ("timestamp", 1_000_000),
    "io.debezium.time.NanoTimestamp": ("timestamp", 1_000_000_000),
    "io.debezium.time.Time": ("time", 1_000),
    "io.debezium.time.MicroTime": ("time", 1_000_000),
    "io.debezium.time.NanoTime": ("time", 1_000_000_000),
    "org.apache.kafka.connect.data.Date": ("date", 0),
    "org.apache.kafka.connect.data.Timestamp": ("timestamp", 1_000),
    "org.apache.kafka.connect.data.Time": ("time", 1_000),
}


def native_kinds(row_schema: Mapping[str, Any] | None) -> list[tuple[str, str, int]] | None:
    """(column, kind, argument) of each column, as ``pgcdc_native.FastChanges`` takes them
    (kind ``""`` for a column :class:`RowConverter` leaves as it is); None when a column has
    no native kind (a VariableScaleDecimal, an array of converted values) or there is no
    schema."""
    if not row_schema:
        return None
    kinds = []
    for f in row_schema.get("fields", ()):
        name = f.get("name")
        if name == "org.apache.kafka.connect.data.Decimal":
            scale = int(f.get("parameters", {}).get("scale", 0))
            if scale < 0:
                return None
            kinds.append((f["field"], "decimal", scale))
        elif name in _NATIVE_BY_NAME:
            kinds.append((f["field"], *_NATIVE_BY_NAME[name]))
        elif field_converter(f) is _identity:
            kinds.append((f["field"], "", 0))
        else:
            return None
    return kinds


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

    __slots__ = ("_conv_items", "_convs")

    def __init__(self, row_schema: Mapping[str, Any] | None) -> None:
        self._convs: dict[str, Converter] = {}
        for f in (row_schema or {}).get("fields", ()):
            conv = field_converter(f)
            if conv is not _identity:
                self._convs[f["field"]] = conv
        self._conv_items = tuple(self._convs.items())

    def __call__(
        self, row: Mapping[str, Any], unchanged_columns: frozenset[str] = frozenset()
    ) -> tuple[dict[str, Any], frozenset[str]]:
        """The document and the columns left unchanged: those ``unchanged_columns`` names
        (the record's ``cdc.unchanged`` header, whatever their value and type), then any
        holding the placeholder in one of its forms (records from elsewhere)."""
        if not unchanged_columns:
            # Nearly every row: no column unchanged and no placeholder among the values
            # (set membership in C; a list or an object among them is not hashable, and is
            # looked at below): the row as it is, with only the typed columns converted.
            try:
                clean = PLACEHOLDER_TEXTS.isdisjoint(row.values())
            except TypeError:
                clean = False
            if clean:
                doc = dict(row)
                for k, conv in self._conv_items:
                    v = doc.get(k)
                    if v is not None:
                        doc[k] = conv(v)
                return doc, frozenset()
        return self.each_column(row, unchanged_columns)

    def each_column(
        self, row: Mapping[str, Any], unchanged_columns: frozenset[str] = frozenset()
    ) -> tuple[dict[str, Any], frozenset[str]]:
        """What :meth:`__call__` gives, each column looked at in turn (its way for a row
        with unchanged columns or a value that may be a placeholder)."""
        doc: dict[str, Any] = {}
        unchanged: list[str] = []
        convs = self._convs
        for k, v in row.items():
            if k in unchanged_columns:
                unchanged.append(k)
                continue
            if v is None:
                doc[k] = None
                continue
            # is_placeholder, inline: this runs for every column of every change.
            if isinstance(v, str):
                if v in PLACEHOLDER_TEXTS:
                    unchanged.append(k)
                    continue
            elif isinstance(v, list) and is_placeholder(v):
                unchanged.append(k)
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
