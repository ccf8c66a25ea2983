"""Debezium's modes beyond the defaults: ``hstore.handling.mode=map``,
``time.precision.mode=adaptive_time_microseconds|connect`` and
``include.unknown.datatypes=false``, on the golden all_types rows.

Each expectation names the section of the Debezium PostgreSQL connector documentation
(debezium.io/documentation/reference/connectors/postgresql.html) it comes from. The values of
the ``connect`` and ``map`` cases are what Debezium Server 3.6 wrote for the same rows in the
parity test's modes capture (tests/integration/debezium_parity, which compares every record
of that capture with Debezium's); ``adaptive_time_microseconds`` is from the documentation
only (one Debezium start covers one time mode).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER as PH
from pgcdc.core.settings import (
    HStoreHandling,
    SchemaSettings,
    TimePrecision,
    ValueFormat,
)
from pgcdc.core.values import UNCHANGED_TOAST
from schemas import avro
from schemas.envelope import EventEncoder
from schemas.typemap import CONNECT_DATE, CONNECT_TIME, CONNECT_TIMESTAMP
from tests.unit.schemas.golden_support import (
    SOURCE,
    after,
    check,
    encoder,
    field_schema,
    row_with,
    value_json,
)

pytestmark = pytest.mark.unit

CONNECT = {"time_precision_mode": TimePrecision.CONNECT}
MICROS = {"time_precision_mode": TimePrecision.ADAPTIVE_TIME_MICROSECONDS}
UNKNOWN = ("c_box", "c_circle", "c_line", "c_lseg", "c_path", "c_polygon", "c_tsquery", "c_pg_lsn")


def _schema(ctype: str, name: str) -> dict[str, Any]:
    return {"type": ctype, "optional": True, "name": name, "version": 1}


# --- "Temporal types" > "Connect temporal types" (time.precision.mode=connect) -------------


@pytest.mark.parametrize(
    ("column", "ctype", "name", "value", "n"),
    [
        ("c_date", "int32", CONNECT_DATE, 19782, 0),  # days since the epoch
        ("c_date", "int32", CONNECT_DATE, -2147472692, 3),  # infinity, as Debezium's stream
        ("c_time3", "int32", CONNECT_TIME, 47655123, 0),  # ms past midnight
        ("c_time", "int32", CONNECT_TIME, 86399999, 0),  # µs are lost: ms past midnight
        ("c_time", "int32", CONNECT_TIME, 86400000, 1),  # 24:00:00
        ("c_ts0", "int64", CONNECT_TIMESTAMP, 1529507596000, 0),  # ms since the epoch
        ("c_ts", "int64", CONNECT_TIMESTAMP, 1529507596945, 0),
        ("c_ts", "int64", CONNECT_TIMESTAMP, 9223372036825200, 1),  # infinity
        ("c_ts", "int64", CONNECT_TIMESTAMP, -9223372036832400, 2),  # -infinity
        ("c_ts_edge", "int64", CONNECT_TIMESTAMP, 9224318015999999, 0),  # no cap in ms
    ],
)
def test_time_precision_connect(
    all_types: Any, column: str, ctype: str, name: str, value: int, n: int
) -> None:
    # "Connect temporal types": DATE → org.apache.kafka.connect.data.Date, TIME →
    # ...Time (ms past midnight), TIMESTAMP → ...Timestamp (ms since the epoch), whatever the
    # column's precision.
    check(all_types, column, _schema(ctype, name), value, n, **CONNECT)


def test_time_precision_connect_leaves_zoned_types_and_arrays_follow(all_types: Any) -> None:
    # timetz and timestamptz keep their ISO strings in every mode; a date array's items are
    # Connect Dates.
    zoned = _schema("string", "io.debezium.time.ZonedTime")
    check(all_types, "c_timetz", zoned, "08:15:30.5Z", 0, **CONNECT)
    table, rows = all_types
    doc = value_json(table, row_with(table, rows, "c_date_arr"), **CONNECT)
    assert field_schema(doc, "c_date_arr")["items"] == {
        "type": "int32",
        "optional": True,
        "name": CONNECT_DATE,
        "version": 1,
    }
    assert after(doc, "c_date_arr") == [18262, 0]


# --- "Temporal types" (time.precision.mode=adaptive_time_microseconds) ----------------------


@pytest.mark.parametrize(
    ("column", "ctype", "name", "value"),
    [
        # "TIME values ... are always captured as microseconds (io.debezium.time.MicroTime)".
        ("c_time3", "int64", "io.debezium.time.MicroTime", 47655123000),
        ("c_time", "int64", "io.debezium.time.MicroTime", 86399999999),
        # The other types as adaptive.
        ("c_date", "int32", "io.debezium.time.Date", 19782),
        ("c_ts3", "int64", "io.debezium.time.Timestamp", 1529507596945),
        ("c_ts", "int64", "io.debezium.time.MicroTimestamp", 1529507596945104),
    ],
)
def test_time_precision_adaptive_time_microseconds(
    all_types: Any, column: str, ctype: str, name: str, value: int
) -> None:
    check(all_types, column, _schema(ctype, name), value, 0, **MICROS)


# --- "HSTORE type" (hstore.handling.mode=map) ----------------------------------------------


def test_hstore_map(all_types: Any) -> None:
    # hstore.handling.mode=map → MAP of string keys to optional string values.
    schema = {
        "type": "map",
        "keys": {"type": "string", "optional": False},
        "values": {"type": "string", "optional": True},
        "optional": True,
    }
    check(
        all_types,
        "c_hstore",
        schema,
        {"a": "1", "b c": None, "d": 'x"y'},
        hstore_handling_mode=HStoreHandling.MAP,
    )


def test_hstore_map_unchanged_toast_placeholder(all_types: Any) -> None:
    # "Toasted values": Debezium's map placeholder is {placeholder: placeholder}
    # (UnchangedToastedPlaceholder's toastPlaceholderHstore).
    table, _ = all_types
    names = [c.name for c in table.columns]
    row: list[Any] = [None] * len(names)
    row[0] = "7"
    row[names.index("c_hstore")] = UNCHANGED_TOAST
    enc = encoder(hstore_handling_mode=HStoreHandling.MAP)
    doc = orjson.loads(enc.encode_value(table, "u", None, row, SOURCE))
    assert doc["payload"]["after"]["c_hstore"] == {PH: PH}


# --- include.unknown.datatypes ---------------------------------------------------------------


def test_unknown_types_left_out_when_not_included(all_types: Any) -> None:
    # include.unknown.datatypes=false (Debezium's default): columns of types without a mapping
    # are not in the schema nor in the row; the others are untouched.
    table, rows = all_types
    row = row_with(table, rows, "c_box")
    doc = value_json(table, row, include_unknown_datatypes=False)
    after_fields = next(f for f in doc["schema"]["fields"] if f["field"] == "after")["fields"]
    names = [f["field"] for f in after_fields]
    assert not set(UNKNOWN) & set(names)
    assert not set(UNKNOWN) & doc["payload"]["after"].keys()
    assert names == [c.name for c in table.columns if c.name not in UNKNOWN]
    assert doc["payload"]["after"]["id"] == int(row[0] or 0)
    # Ours by default: carried as text (design guarantee 6).
    kept = value_json(table, row)
    assert after(kept, "c_box") == "(3,4),(1,2)"


def test_delete_of_a_truncated_key_leaves_unknown_types_out(all_types: Any) -> None:
    table, _ = all_types
    enc = encoder(include_unknown_datatypes=False)
    key = b'{"schema":{},"payload":{"id":5}}'
    doc = orjson.loads(enc.encode_delete_of_key(table, key, SOURCE))
    assert doc["payload"]["before"]["id"] == 5
    assert not set(UNKNOWN) & doc["payload"]["before"].keys()


# --- Avro follows the modes -------------------------------------------------------------------


@pytest.mark.parametrize(
    "modes",
    [
        {"hstore_handling_mode": HStoreHandling.MAP, **CONNECT, "include_unknown_datatypes": False},
        {**MICROS},
    ],
)
def test_avro_follows_the_modes(all_types: Any, modes: dict[str, Any]) -> None:
    table, rows = all_types
    enc = EventEncoder(SchemaSettings(value_format=ValueFormat.AVRO, **modes), "rt", "db")
    plan = enc.plan(table)
    parsed = avro.avro_plan(plan).envelope_parsed
    for row in rows:
        if row[[c.name for c in table.columns].index("c_numeric_any")] == "NaN":
            continue  # not carried under decimal_handling_mode=precise
        payload = enc.value_payload(table, "c", None, row, SOURCE)
        back = avro.decode_value(plan, avro.serialize(parsed, payload))
        assert repr(back["after"]) == repr(payload["after"])  # repr: NaN equals itself
    value = avro.avro_plan(plan).value
    fields = {f["name"]: f["type"] for f in value["fields"]}
    if modes.get("hstore_handling_mode") is HStoreHandling.MAP:
        assert fields["c_hstore"] == ["null", {"type": "map", "values": ["null", "string"]}]
        assert fields["c_date"][1]["connect.name"] == CONNECT_DATE
        assert "c_box" not in fields
    else:
        assert fields["c_time3"][1]["connect.name"] == "io.debezium.time.MicroTime"
