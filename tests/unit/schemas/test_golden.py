"""Golden tests: the JSON of the all-types table's key and value, schema and payload, field by
field against Debezium's output. Each expectation names the section of the Debezium PostgreSQL
connector documentation (debezium.io/documentation/reference/connectors/postgresql.html) it
comes from, and is what Debezium Server 3.6 wrote for the same rows (the fixture's
``debezium`` part: fixtures/all_types.json, regenerated from Debezium's records by
tests/integration/debezium_parity; the rows were rendered by a real PostgreSQL 15).
test_golden_debezium.py compares every row and column with Debezium's, allowing only the
documented departures (docs/debezium.md)."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from pgcdc.core.errors import SchemaError
from pgcdc.core.settings import BinaryHandling, DecimalHandling, IntervalHandling
from pgcdc.core.values import UNCHANGED_TOAST
from schemas.model import TableSchema, TransactionInfo
from tests.unit.schemas.golden_support import (
    PREFIX,
    SOURCE,
    after,
    check,
    encoder,
    field_schema,
    row_with,
    value_json,
)

pytestmark = pytest.mark.unit

# --- "Change event keys" ----------------------------------------------------------------


def test_key_schema_and_payload(all_types: Any) -> None:
    # Section "Change event keys": struct named <prefix>.<schema>.<table>.Key, not optional,
    # one field per primary key column.
    table, rows = all_types
    doc = orjson.loads(encoder().encode_key(table, rows[0]) or b"")
    assert doc["schema"] == {
        "type": "struct",
        "fields": [{"type": "int32", "optional": False, "field": "id"}],
        "optional": False,
        "name": "PostgreSQL_server.public.all_types.Key",
    }
    assert doc["payload"] == {"id": 1}


def test_no_key_without_primary_key(all_types: Any) -> None:
    # Section "Change event keys": "If the table does not have a primary or unique key, then
    # the change event's key is null."
    table, rows = all_types
    keyless = TableSchema(table.schema, table.table, table.columns, (), "d")
    assert encoder().encode_key(keyless, rows[0]) is None


# --- "Change event values" / "create events" ---------------------------------------------


def test_envelope_schema_and_source(all_types: Any) -> None:
    # Section "create events": envelope before/after (<prefix>.<schema>.<table>.Value,
    # optional), source (io.debezium.connector.postgresql.Source), op, ts_ms/ts_us/ts_ns;
    # field order and the snapshot enum as Debezium 3.x writes them (transaction block
    # "event.block" before op).
    table, rows = all_types
    doc = value_json(table, rows[0])
    schema = doc["schema"]
    assert schema["name"] == "PostgreSQL_server.public.all_types.Envelope"
    assert schema["optional"] is False
    assert [f["field"] for f in schema["fields"]] == [
        "before",
        "after",
        "source",
        "transaction",
        "op",
        "ts_ms",
        "ts_us",
        "ts_ns",
    ]
    before, after_s, source, tx = schema["fields"][:4]
    assert before["name"] == after_s["name"] == "PostgreSQL_server.public.all_types.Value"
    assert before["optional"] is after_s["optional"] is True
    assert source["name"] == "io.debezium.connector.postgresql.Source"
    assert [(f["field"], f["type"], f["optional"]) for f in source["fields"]] == [
        ("version", "string", False),
        ("connector", "string", False),
        ("name", "string", False),
        ("ts_ms", "int64", False),
        ("snapshot", "string", True),
        ("db", "string", False),
        ("sequence", "string", True),
        ("ts_us", "int64", True),
        ("ts_ns", "int64", True),
        ("schema", "string", False),
        ("table", "string", False),
        ("txId", "int64", True),
        ("lsn", "int64", True),
        ("xmin", "int64", True),
        ("origin", "string", True),
        ("origin_lsn", "int64", True),
    ]
    snap = source["fields"][4]
    assert snap["name"] == "io.debezium.data.Enum" and snap["default"] == "false"
    assert snap["parameters"]["allowed"].split(",")[:2] == ["true", "first"]
    assert tx["name"] == "event.block" and tx["optional"] is True
    assert [f["field"] for f in tx["fields"]] == ["id", "total_order", "data_collection_order"]
    payload = doc["payload"]
    assert list(payload) == [
        "before",
        "after",
        "source",
        "transaction",
        "op",
        "ts_ms",
        "ts_us",
        "ts_ns",
    ]
    assert payload["before"] is None and payload["op"] == "c" and payload["transaction"] is None
    src = payload["source"]
    assert src["connector"] == "postgresql" and src["name"] == PREFIX and src["db"] == "postgres"
    assert (src["ts_ms"], src["ts_us"], src["ts_ns"]) == (
        1559033904863,
        1559033904863123,
        1559033904863123000,
    )
    assert src["sequence"] == '["24023119","24023128"]'
    assert (src["schema"], src["table"], src["txId"], src["lsn"], src["xmin"]) == (
        "public",
        "all_types",
        555,
        24023128,
        None,
    )
    assert src["snapshot"] == "false"
    assert (
        payload["ts_us"] // 1000 == payload["ts_ms"]
        and payload["ts_ns"] // 1000 == payload["ts_us"]
    )


def test_transaction_block(all_types: Any) -> None:
    # Section "Transaction metadata > Change data event enrichment": id "<txId>:<lsn>",
    # total_order, data_collection_order.
    table, rows = all_types
    tx = TransactionInfo("555:24023128", 3, 1)
    doc = orjson.loads(
        encoder(provide_transaction_metadata=True).encode_value(
            table, "u", rows[0], rows[0], SOURCE, tx
        )
    )
    assert doc["payload"]["transaction"] == {
        "id": "555:24023128",
        "total_order": 3,
        "data_collection_order": 1,
    }
    # Off: the field stays and is null.
    doc = orjson.loads(encoder().encode_value(table, "u", rows[0], rows[0], SOURCE, tx))
    assert doc["payload"]["transaction"] is None


def test_truncate_event(all_types: Any) -> None:
    # Section "truncate events": op "t", source for the table, no row images.
    table, _ = all_types
    doc = orjson.loads(encoder().encode_truncate(table, SOURCE))
    assert doc["payload"]["op"] == "t"
    assert doc["payload"]["before"] is None and doc["payload"]["after"] is None
    assert doc["payload"]["source"]["table"] == "all_types"


def test_schemas_disabled_emits_payload_only(all_types: Any) -> None:
    # JsonConverter with schemas.enable=false writes the payload alone.
    table, rows = all_types
    doc = orjson.loads(
        encoder(schemas_enable=False).encode_value(table, "c", None, rows[0], SOURCE)
    )
    assert "schema" not in doc and doc["op"] == "c" and doc["after"]["id"] == 1
    assert orjson.loads(encoder(schemas_enable=False).encode_key(table, rows[0]) or b"") == {
        "id": 1
    }


# --- "Data type mappings > Basic types" --------------------------------------------------


@pytest.mark.parametrize(
    ("column", "ctype", "value", "n"),
    [
        ("c_bool", "boolean", True, 0),
        ("c_int2", "int16", -32768, 0),
        ("c_int4", "int32", -2147483648, 0),
        ("c_int8", "int64", 9223372036854775807, 1),
        ("c_oid", "int64", 4294967295, 0),  # "BIGINT, BIGSERIAL, OID → INT64"
        # JsonConverter names FLOAT32/FLOAT64 "float"/"double" in a schema.
        ("c_float4", "float", 1.1, 0),
        ("c_float8", "double", 0.1, 0),
        ("c_text", "string", 'hello, "world"\\n', 0),
        ("c_varchar", "string", "abc", 0),
        ("c_char", "string", "ab   ", 0),  # CHAR[(M)]: the padded value PostgreSQL stores
        ("c_name", "string", "pg_class", 0),
        ("c_inet", "string", "192.168.0.1/24", 0),  # "Network address types"
        ("c_cidr", "string", "10.0.0.0/8", 0),
        ("c_macaddr", "string", "08:00:2b:01:02:03", 0),
        ("c_int4range", "string", "[1,10)", 0),  # "INT4RANGE → STRING"
        ("c_tstzrange", "string", '["2020-01-01 00:00:00+00",)', 0),
    ],
)
def test_basic_types(all_types: Any, column: str, ctype: str, value: Any, n: int) -> None:
    # Section "Data type mappings > Basic types".
    check(all_types, column, {"type": ctype, "optional": True}, value, n)


def test_float_special_values(all_types: Any) -> None:
    # Kafka's JsonConverter (Jackson) writes non-finite doubles as the strings "NaN", "Infinity".
    check(all_types, "c_float4", {"type": "float", "optional": True}, "NaN", 2)
    check(all_types, "c_float8", {"type": "double", "optional": True}, "-Infinity", 3)


@pytest.mark.parametrize(
    ("column", "name", "value"),
    [
        ("c_uuid", "io.debezium.data.Uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ("c_json", "io.debezium.data.Json", '{"b": 1,  "a": [true, null]}'),
        ("c_jsonb", "io.debezium.data.Json", '{"a": [true, null], "b": 1}'),
        ("c_xml", "io.debezium.data.Xml", "<a>1</a>"),
        # "TIMESTAMPTZ → io.debezium.time.ZonedTimestamp: ... where the timezone is GMT";
        # fraction as wide as the column's precision (6 by default), DBZ-6163.
        ("c_tstz", "io.debezium.time.ZonedTimestamp", "2018-06-20T13:13:16.940000Z"),
        ("c_tstz3", "io.debezium.time.ZonedTimestamp", "2018-06-20T15:13:16.900Z"),
        # "TIMETZ → io.debezium.time.ZonedTime ... where the timezone is GMT"
        ("c_timetz", "io.debezium.time.ZonedTime", "08:15:30.5Z"),
    ],
)
def test_semantic_string_types(all_types: Any, column: str, name: str, value: str) -> None:
    # Section "Data type mappings > Basic types".
    check(
        all_types, column, {"type": "string", "optional": True, "name": name, "version": 1}, value
    )


def test_enum(all_types: Any) -> None:
    # Section "Basic types": ENUM → io.debezium.data.Enum, allowed values in `allowed`.
    schema = {
        "type": "string",
        "optional": True,
        "name": "io.debezium.data.Enum",
        "version": 1,
        "parameters": {"allowed": "sad,ok,happy"},
    }
    check(all_types, "c_mood", schema, "happy")


def test_point(all_types: Any) -> None:
    # Section "Basic types": POINT → STRUCT io.debezium.data.geometry.Point with x, y.
    table, rows = all_types
    doc = value_json(table, row_with(table, rows, "c_point"))
    s = field_schema(doc, "c_point")
    assert s["name"] == "io.debezium.data.geometry.Point" and s["type"] == "struct"
    assert [(f["field"], f["type"], f["optional"]) for f in s["fields"]] == [
        ("x", "double", False),
        ("y", "double", False),
        ("wkb", "bytes", True),
        ("srid", "int32", True),
    ]
    v = after(doc, "c_point")
    assert (v["x"], v["y"], v["srid"]) == (1.5, -2.0, None)
    assert base64.b64decode(v["wkb"])[:5] == b"\x01\x01\x00\x00\x00"  # WKB point, little endian


@pytest.mark.parametrize(
    ("mode", "ctype", "value"),
    [
        (BinaryHandling.BYTES, "bytes", base64.b64encode(b"\x00\xff\x10").decode()),
        (BinaryHandling.BASE64, "string", base64.b64encode(b"\x00\xff\x10").decode()),
        (BinaryHandling.HEX, "string", "00ff10"),
    ],
)
def test_bytea_modes(all_types: Any, mode: BinaryHandling, ctype: str, value: str) -> None:
    # Section "Basic types": BYTEA → BYTES or STRING by binary.handling.mode; JsonConverter
    # writes BYTES as base64.
    check(all_types, "c_bytea", {"type": ctype, "optional": True}, value, binary_handling_mode=mode)


def test_arrays(all_types: Any) -> None:
    # Arrays map to Connect ARRAY of the element's optional schema (PostgresValueConverter).
    check(
        all_types,
        "c_int4_arr",
        {"type": "array", "items": {"type": "int32", "optional": True}, "optional": True},
        [1, None, 3],
    )
    check(
        all_types,
        "c_text_arr",
        {"type": "array", "items": {"type": "string", "optional": True}, "optional": True},
        ["a b", "c,d", 'e"f', None, "NULL"],
    )
    # Debezium's enum arrays say their items are never null.
    enum_items = {
        "type": "string",
        "optional": False,
        "name": "io.debezium.data.Enum",
        "version": 1,
        "parameters": {"allowed": "sad,ok,happy"},
    }
    check(
        all_types,
        "c_mood_arr",
        {"type": "array", "items": enum_items, "optional": True},
        ["sad", "happy"],
    )


# --- "Data type mappings > Temporal types" (time.precision.mode=adaptive) ----------------


@pytest.mark.parametrize(
    ("column", "ctype", "name", "value", "n"),
    [
        ("c_date", "int32", "io.debezium.time.Date", 19782, 0),  # days since the epoch
        ("c_time3", "int32", "io.debezium.time.Time", 47655123, 0),  # ms past midnight
        ("c_time", "int64", "io.debezium.time.MicroTime", 86399999999, 0),  # µs past midnight
        ("c_ts0", "int64", "io.debezium.time.Timestamp", 1529507596000, 0),  # ms since epoch
        ("c_ts3", "int64", "io.debezium.time.Timestamp", 1529507596945, 0),
        # "TIMESTAMP type": "2018-06-20 15:13:16.945104" → MicroTimestamp 1529507596945104.
        ("c_ts", "int64", "io.debezium.time.MicroTimestamp", 1529507596945104, 0),
    ],
)
def test_temporal_adaptive(
    all_types: Any, column: str, ctype: str, name: str, value: int, n: int
) -> None:
    check(
        all_types, column, {"type": ctype, "optional": True, "name": name, "version": 1}, value, n
    )


def test_timestamp_infinity(all_types: Any) -> None:
    # Section "TIMESTAMP type": +/-infinity → 9223372036825200000 / -9223372036832400000.
    schema = {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroTimestamp",
        "version": 1,
    }
    check(all_types, "c_ts", schema, 9223372036825200000, 1)
    check(all_types, "c_ts", schema, -9223372036832400000, 2)
    # timestamptz infinity is passed through as the string "infinity" (PostgresValueConverter).
    tz = {
        "type": "string",
        "optional": True,
        "name": "io.debezium.time.ZonedTimestamp",
        "version": 1,
    }
    check(all_types, "c_tstz", tz, "infinity", 2)


def test_interval_modes(all_types: Any) -> None:
    # Section "Basic types": INTERVAL → io.debezium.time.MicroDuration with 365.25/12 days per
    # month, or io.debezium.time.Interval "P1Y2M3DT4H5M6.78S" with interval.handling.mode=string.
    micro = {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroDuration",
        "version": 1,
    }
    expected = int((((14 * 365.25 / 12 + 3) * 24 + 4) * 60 + 5) * 60 * 1e6 + 6.78e6)
    check(all_types, "c_interval", micro, expected)
    iso = {"type": "string", "optional": True, "name": "io.debezium.time.Interval", "version": 1}
    check(
        all_types,
        "c_interval",
        iso,
        "P1Y2M3DT4H5M6.78S",
        interval_handling_mode=IntervalHandling.STRING,
    )


# --- "Data type mappings > Decimal types" -------------------------------------------------


def test_decimal_precise(all_types: Any) -> None:
    # Section "Decimal types": NUMERIC(M,D) → BYTES org.apache.kafka.connect.data.Decimal with
    # the `scale` parameter; the value is the unscaled two's-complement integer, base64 in JSON.
    schema = {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
    }
    check(
        all_types, "c_numeric", schema, base64.b64encode((1234567890).to_bytes(4, "big")).decode()
    )
    check(all_types, "c_numeric", schema, base64.b64encode(b"\xff").decode(), 1)  # -0.01


def test_decimal_variable_scale(all_types: Any) -> None:
    # Section "Decimal types": NUMERIC without scale → STRUCT io.debezium.data.VariableScaleDecimal
    # {scale INT32, value BYTES}.
    table, rows = all_types
    doc = value_json(table, row_with(table, rows, "c_numeric_any"))
    s = field_schema(doc, "c_numeric_any")
    assert (s["type"], s["name"], s["version"]) == (
        "struct",
        "io.debezium.data.VariableScaleDecimal",
        1,
    )
    assert [(f["field"], f["type"]) for f in s["fields"]] == [
        ("scale", "int32"),
        ("value", "bytes"),
    ]
    assert after(doc, "c_numeric_any") == {
        "scale": 1,
        "value": base64.b64encode(b"\x0f").decode(),
    }  # 1.5


def test_money(all_types: Any) -> None:
    # Section "Decimal types": MONEY → Decimal, scale from money.fraction.digits (2).
    schema = {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2"},
    }
    check(all_types, "c_money", schema, base64.b64encode((1234).to_bytes(2, "big")).decode())


def test_decimal_string_and_double(all_types: Any) -> None:
    # Section "Decimal types": decimal.handling.mode string → STRING, double → FLOAT64; NaN
    # only in these modes, as the string "NAN" or Double.NaN.
    s = {"type": "string", "optional": True}
    check(all_types, "c_numeric", s, "12345678.90", decimal_handling_mode=DecimalHandling.STRING)
    check(all_types, "c_numeric_any", s, "NAN", 4, decimal_handling_mode=DecimalHandling.STRING)
    check(all_types, "c_money", s, "12.34", decimal_handling_mode=DecimalHandling.STRING)
    d = {"type": "double", "optional": True}
    check(all_types, "c_numeric", d, 12345678.9, decimal_handling_mode=DecimalHandling.DOUBLE)
    check(all_types, "c_numeric_any", d, "NaN", 4, decimal_handling_mode=DecimalHandling.DOUBLE)


def test_decimal_nan_precise_is_a_clear_error(all_types: Any) -> None:
    # Section "Decimal types": NaN cannot be encoded in precise mode (Debezium fails the task).
    table, rows = all_types
    with pytest.raises(SchemaError, match="decimal_handling_mode"):
        value_json(table, row_with(table, rows, "c_numeric_any", 4))


# --- "HSTORE type", "Domain types", toasted values, pass-through --------------------------


def test_hstore_json(all_types: Any) -> None:
    # Section "HSTORE type": hstore.handling.mode=json → io.debezium.data.Json, {"key":"val"}.
    table, rows = all_types
    doc = value_json(table, row_with(table, rows, "c_hstore"))
    assert field_schema(doc, "c_hstore")["name"] == "io.debezium.data.Json"
    assert orjson.loads(after(doc, "c_hstore")) == {"a": "1", "b c": None, "d": 'x"y'}


def test_domain_types(all_types: Any) -> None:
    # Section "Domain types": a domain over a type with length/scale inherits them.
    schema = {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
    }
    check(all_types, "c_price", schema, base64.b64encode((2000).to_bytes(2, "big")).decode())
    check(all_types, "c_short", {"type": "string", "optional": True}, "domain")


def test_unknown_type_passes_through_as_text(all_types: Any) -> None:
    # Not dropped (unlike include.unknown.datatypes=false): text, with the type name.
    schema = {
        "type": "string",
        "optional": True,
        "parameters": {"__debezium.source.column.type": "box"},
    }
    check(all_types, "c_box", schema, "(3,4),(1,2)")


def test_unchanged_toast_placeholder(all_types: Any) -> None:
    # Section "Toasted values": unavailable.value.placeholder "__debezium_unavailable_value";
    # for bytea its bytes.
    table, _ = all_types
    names = [c.name for c in table.columns]
    row: list[Any] = [None] * len(names)
    row[0] = "7"
    for col in ("c_text", "c_bytea", "c_jsonb", "c_text_arr"):
        row[names.index(col)] = UNCHANGED_TOAST
    doc = orjson.loads(encoder().encode_value(table, "u", None, row, SOURCE))
    a = doc["payload"]["after"]
    assert a["c_text"] == a["c_jsonb"] == "__debezium_unavailable_value"
    assert base64.b64decode(a["c_bytea"]) == b"__debezium_unavailable_value"
    assert a["c_text_arr"] == ["__debezium_unavailable_value"]


def test_every_fixture_row_encodes(all_types: Any) -> None:
    # Every value the server rendered becomes JSON, and a NULL stays null.
    table, rows = all_types
    enc = encoder(decimal_handling_mode=DecimalHandling.STRING)
    for row in rows:
        doc = orjson.loads(enc.encode_value(table, "r", None, row, SOURCE))
        values = list(doc["payload"]["after"].values())
        assert [v is None for v in values] == [v is None for v in row]
