"""Every intended departure from Debezium's records, with its reason.

A difference the comparison finds must match one of these entries or the parity test fails.
docs/debezium.md lists the same entries for users. Each entry is narrow: it names the field
it covers and, where it can, checks that our side holds what we mean it to hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgcdc.core.contract import HEADER_COMMIT_LSN, HEADER_ORDER, HEADER_UNCHANGED
from schemas.convert import (
    DATE_NEGATIVE_INFINITY_DAYS,
    DATE_POSITIVE_INFINITY_DAYS,
    INT64_MAX,
    INT64_MIN,
)
from schemas.debezium import SNAPSHOT_VALUES
from schemas.pgtext import days_from_civil
from schemas.typemap import CONNECT_DATE
from tests.integration.debezium_parity.compare import MISSING, Difference, field_schema

# Where a payload or schema path names a column: value/payload/<image>/<column>/… and
# value/schema/<image>/<column>/… (schema struct members are written <name>).
_IMAGES = ("before", "after")
SOURCE_TYPE = "__debezium.source.column.type"
# The Gregorian calendar's first day: Debezium's snapshot reads older dates through
# java.sql.Date (the Julian calendar), so they differ from its own stream.
GREGORIAN_START_DAYS = days_from_civil(1582, 10, 15)
# A date column's schema name: time.precision.mode adaptive, and connect.
_DATE_NAMES = ("io.debezium.time.Date", CONNECT_DATE)


def column_of(path: tuple[str, ...]) -> tuple[str, str] | None:
    """(image, column) a payload or schema path is about, if any."""
    if len(path) >= 4 and path[0] == "value" and path[1] == "payload" and path[2] in _IMAGES:
        return path[2], path[3]
    if len(path) >= 4 and path[0] == "value" and path[1] == "schema":
        image, col = path[2], path[3]
        if image.strip("<>") in _IMAGES and col.startswith("<") and col.endswith(">"):
            return image.strip("<>"), col[1:-1]
    return None


def _our_column_schema(d: Difference) -> dict[str, Any] | None:
    where = column_of(d.path)
    if where is None:
        return None
    return field_schema(d.our_event, *where)


def _their_column_schema(d: Difference) -> dict[str, Any] | None:
    where = column_of(d.path)
    if where is None:
        return None
    return field_schema(d.debezium_event, *where)


def _source(d: Difference, name: str) -> bool:
    return d.path == ("value", "payload", "source", name)


@dataclass(frozen=True)
class Departure:
    """One intended difference from Debezium."""

    name: str
    reason: str
    matches: Callable[[Difference], bool]


# --- the predicates ------------------------------------------------------------------------


def _debezium_server_headers(d: Difference) -> bool:
    return d.path[:1] == ("header",) and d.path[1].startswith("__debezium.context.")


def _our_headers(d: Difference) -> bool:
    return (
        d.path[:1] == ("header",)
        and d.path[1] in (HEADER_COMMIT_LSN, HEADER_ORDER, HEADER_UNCHANGED)
        and d.debezium == MISSING
    )


def _processing_time(d: Difference) -> bool:
    return d.path in {("value", "payload", f) for f in ("ts_ms", "ts_us", "ts_ns")}


def _snapshot_position(d: Difference) -> bool:
    if not d.snapshot:
        return False
    if any(_source(d, f) for f in ("ts_ms", "ts_us", "ts_ns")):
        return isinstance(d.ours, int)
    if _source(d, "lsn") or _source(d, "txId"):
        return isinstance(d.ours, int)  # never null: ours says where its snapshot stands
    if _source(d, "sequence"):
        return isinstance(d.ours, str) and re.fullmatch(r'\[null,"\d+"\]', d.ours) is not None
    return False


def _snapshot_markers(d: Difference) -> bool:
    return (
        d.snapshot
        and _source(d, "snapshot")
        and d.ours in SNAPSHOT_VALUES
        and d.debezium in SNAPSHOT_VALUES
        and "false" not in (d.ours, d.debezium)
    )


def _truncate_as_deletes(d: Difference) -> bool:
    e = d.our_event
    return d.path == ("record",) and d.debezium_event is None and e is not None and e.truncated_row


def _truncate_topic(d: Difference) -> bool:
    # Debezium's key is null; ours is the Connect string "schema.table" (schema and payload).
    if d.op != "t" or d.path[:1] != ("key",):
        return False
    if d.path == ("key",):
        return d.debezium is None
    return d.debezium == MISSING and (d.path != ("key", "payload") or d.ours == ".".join(d.table))


def _negative_scale(d: Difference) -> bool:
    ours = _our_column_schema(d)
    if ours is None:
        return False
    scale = (ours.get("parameters") or {}).get("scale")
    return scale is not None and int(scale) < 0


def _snapshot_dates(d: Difference) -> bool:
    schema = _our_column_schema(d)
    if not d.snapshot or schema is None or schema.get("name") not in _DATE_NAMES:
        return False
    return isinstance(d.ours, int) and (
        d.ours < GREGORIAN_START_DAYS
        or d.ours in (DATE_POSITIVE_INFINITY_DAYS, DATE_NEGATIVE_INFINITY_DAYS)
    )


def _null_with_default(d: Difference) -> bool:
    schema = _their_column_schema(d)
    return (
        column_of(d.path) is not None
        and d.ours is None
        and schema is not None
        and "default" in schema
        and schema["default"] == d.debezium
    )


def _unknown_types(d: Difference) -> bool:
    schema = _our_column_schema(d)
    return schema is not None and SOURCE_TYPE in (schema.get("parameters") or {})


def _schema_names(d: Difference) -> bool:
    return (
        d.path[-1] == "name"
        and isinstance(d.debezium, str)
        and isinstance(d.ours, str)
        and re.sub(r"[^A-Za-z0-9_.]", "_", d.debezium) == d.ours
    )


def _multi_dim_arrays(d: Difference) -> bool:
    schema = _our_column_schema(d)
    return (
        schema is not None
        and schema.get("type") == "array"
        and schema.get("items", {}).get("type") == "array"
    )


# What Java's Object.toString gives for an array: Debezium writes it for each inner array of
# a value with more dimensions than its column declares.
_JAVA_ARRAY_IDENTITY = re.compile(r"^\[+L[\w.$]+;@[0-9a-f]+$")


def _arrays_beyond_declared_dimensions(d: Difference) -> bool:
    schema = _our_column_schema(d)
    where = column_of(d.path)
    if schema is None or where is None or d.debezium_event is None:
        return False
    if schema.get("type") != "array" or schema.get("items", {}).get("type") == "array":
        return False
    image = d.debezium_event.payload.get(where[0]) if d.debezium_event.payload else None
    theirs = image.get(where[1]) if isinstance(image, dict) else None
    # Debezium's value holds Java array identities instead of elements; ours, the elements
    # of the merged outer dimensions (docs/debezium.md#arrays-and-their-dimensions).
    return (
        isinstance(theirs, list)
        and any(isinstance(v, str) and _JAVA_ARRAY_IDENTITY.match(v) for v in theirs)
        and len(d.path) == 5
        and d.path[-1].startswith("[")
    )


def _bit_arrays(d: Difference) -> bool:
    schema = _our_column_schema(d)
    return (
        schema is not None
        and schema.get("type") == "array"
        and schema.get("items", {}).get("name") == "io.debezium.data.Bits"
    )


def _timestamp_cap(d: Difference) -> bool:
    schema = _our_column_schema(d)
    return (
        schema is not None
        and schema.get("name") == "io.debezium.time.MicroTimestamp"
        and d.ours in (INT64_MAX, INT64_MIN)
    )


ALLOWED: tuple[Departure, ...] = (
    Departure(
        "debezium-server-headers",
        "Debezium Server adds __debezium.context.* headers (connector and task names, run id); "
        "the Kafka Connect connector does not write them, and neither do we.",
        _debezium_server_headers,
    ),
    Departure(
        "our-headers",
        "cdc.commit_lsn and cdc.order (every record's version, for the followers) and "
        "cdc.unchanged (the columns an UPDATE left as unchanged TOAST) are our contract.",
        _our_headers,
    ),
    Departure(
        "version",
        "source.version is the version of the software that wrote the event.",
        lambda d: _source(d, "version"),
    ),
    Departure(
        "processing-time",
        "ts_ms/ts_us/ts_ns of the envelope say when each system processed the event.",
        _processing_time,
    ),
    Departure(
        "snapshot-position",
        "Each system snapshots in its own transaction on its own slot: source.lsn and "
        "sequence are its slot's consistent point, txId its snapshot's transaction id "
        "(ours: the snapshot's xmax), ts_* when it read the table.",
        _snapshot_position,
    ),
    Departure(
        "snapshot-markers",
        "Which snapshot record is first/last (of all, or of a table) depends on the order "
        "the tables are read; ours reads them in parallel.",
        _snapshot_markers,
    ),
    Departure(
        "truncate-as-deletes",
        "A TRUNCATE also becomes a delete and a tombstone for every live key, so a follower "
        "and a rebuild from the compacted topic drop the rows; Debezium writes the t event "
        "only.",
        _truncate_as_deletes,
    ),
    Departure(
        "truncate-topic",
        "A keyed table's t event goes to <prefix>.__cdc_truncates keyed by schema.table: a "
        "compacted table topic refuses Debezium's null key. Keyless tables' stay in their "
        "topic with a null key, like Debezium's.",
        _truncate_topic,
    ),
    Departure(
        "numeric-negative-scale",
        "numeric(p,-s): Debezium reads the 11-bit scale as unsigned (scale 2046 for -2) and "
        "writes a value 10^2048 times too large; ours has scale -2 and the exact value.",
        _negative_scale,
    ),
    Departure(
        "debezium-snapshot-dates",
        "Debezium's snapshot reads dates through java.sql.Date: BC and pre-Gregorian dates "
        "shift to the Julian calendar and ±infinity become odd dates, unlike its own stream. "
        "Ours are the stream's values in the snapshot too.",
        _snapshot_dates,
    ),
    Departure(
        "null-with-default",
        "A null in a column with a DEFAULT: Kafka's JsonConverter (replace.null.with.default) "
        "writes the default instead; ours writes the null the row holds, so the followers "
        "match the table. Connect reads our null as the default too.",
        _null_with_default,
    ),
    Departure(
        "unknown-types",
        "Types the map does not know (box, circle, line, lseg, path, polygon, tsquery, "
        "pg_lsn...): Debezium drops them by default, or with include.unknown.datatypes=true "
        "writes bytes of its driver's text; ours are PostgreSQL's text as a string, with "
        "the type name in the __debezium.source.column.type parameter.",
        _unknown_types,
    ),
    Departure(
        "schema-names",
        "Key/Value/Envelope names of tables whose names hold characters other than "
        "[A-Za-z0-9_]: Debezium keeps its topic name's '-' (schema.name.adjustment.mode=none); "
        "ours are valid Avro names in every format.",
        _schema_names,
    ),
    Departure(
        "multi-dimensional-arrays",
        "int[][] and other arrays declared with 2+ dimensions: Debezium writes a flat array "
        "schema and nulls (the values are lost); ours nests the schema and keeps the values.",
        _multi_dim_arrays,
    ),
    Departure(
        "arrays-beyond-declared-dimensions",
        "A value with more dimensions than its column declares (PostgreSQL does not enforce "
        "the declaration), e.g. {{a,b},{c,d}} in a text[] column: Debezium writes the Java "
        "identity of each inner array ('[Ljava.lang.String;@…'), the values are lost; ours "
        "merges the outer dimensions: [a, b, c, d].",
        _arrays_beyond_declared_dimensions,
    ),
    Departure(
        "bit-arrays",
        "bit(n)[]: Debezium describes the column as one Bits value and writes null; ours is an "
        "array of Bits.",
        _bit_arrays,
    ),
    Departure(
        "timestamp-cap",
        "A timestamp past 294247-01-10 does not fit int64 microseconds: Debezium caps the "
        "seconds, then adds the fraction and overflows to a large negative number; ours is "
        "capped at the int64 maximum (minimum for the past).",
        _timestamp_cap,
    ),
)


def explain(d: Difference) -> Departure | None:
    """The departure that explains ``d``, None when nothing does."""
    for departure in ALLOWED:
        if departure.matches(d):
            return departure
    return None
