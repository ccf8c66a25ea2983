"""Golden tests against Debezium's own records: every all_types row as Debezium Server 3.6
wrote it (the fixture's ``debezium`` part, regenerated from Debezium's output by
tests/integration/debezium_parity), and the edge values and column facts issue 15 added.
Sections named are those of the Debezium PostgreSQL connector documentation
(debezium.io/documentation/reference/connectors/postgresql.html)."""

from __future__ import annotations

import base64
import collections
from typing import Any

import orjson
import pytest

from pgcdc.core.settings import SchemaSettings
from schemas.envelope import EventEncoder
from schemas.model import Column, PgType, TableSchema
from tests.integration.debezium_parity.allowlist import explain
from tests.integration.debezium_parity.compare import Event, diff_pair
from tests.integration.debezium_parity.scenario import UNCARRIED
from tests.unit.schemas.all_types import literal_rows
from tests.unit.schemas.conftest import FIXTURE
from tests.unit.schemas.golden_support import SOURCE, after, check, row_with, value_json

pytestmark = pytest.mark.unit

TABLE = ("public", "all_types")
# What the rows' differences may be explained by: the type departures, nothing else.
ROW_DEPARTURES = {
    "numeric-negative-scale",
    "unknown-types",
    "multi-dimensional-arrays",
    "bit-arrays",
    "timestamp-cap",
}


def _event(system: str, after_schema: dict[str, Any], after_row: dict[str, Any]) -> Event:
    value = {"schema": {"fields": [after_schema]}, "payload": {"after": after_row, "op": "c"}}
    return Event(system, TABLE, None, value, {}, "", 0)


def test_every_row_as_debezium_writes_it(all_types: Any) -> None:
    # Every value and the whole row schema, column by column, against Debezium's records of
    # the same rows; a difference must be one of docs/debezium.md's departures.
    table, rows = all_types
    dbz = orjson.loads(FIXTURE.read_bytes())["debezium"]
    names = [c.name for c in table.columns]
    encoder = EventEncoder(SchemaSettings(), "PREFIX", "db")
    their_schema = {**dbz["value_schema"], "field": "after"}
    uncarried = {i for i, name, lit in literal_rows() if (name, lit) in UNCARRIED}
    compared = fields = 0
    used: collections.Counter[str] = collections.Counter()
    unexplained = []
    for row in rows:
        rid = int(row[0] or 0)
        if rid in uncarried:
            assert str(rid) not in dbz["after"]
            continue
        stored = dbz["after"][str(rid)]
        theirs = {n: stored.get(n) for n in names} | {"id": rid}
        doc = orjson.loads(encoder.encode_value(table, "c", None, row, SOURCE))
        our_schema = next(f for f in doc["schema"]["fields"] if f["field"] == "after")
        n, diffs = diff_pair(
            _event("debezium", their_schema, theirs), _event("ours", our_schema, after_of(doc))
        )
        compared += 1
        fields += n
        for d in diffs:
            dep = explain(d)
            if dep is None:
                unexplained.append(d.describe())
            else:
                used[dep.name] += 1
    assert compared == len(rows) - len(uncarried) == len(dbz["after"])
    assert fields > compared * len(names)  # every column's value and schema
    assert not unexplained, "\n".join(unexplained[:40])
    assert set(used) <= ROW_DEPARTURES, set(used) - ROW_DEPARTURES


def after_of(doc: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = doc["payload"]["after"]
    return result


# --- column defaults and NOT NULL columns a row does not carry -----------------------------

INT4 = PgType(23, "int4", "b")
TEXT = PgType(25, "text", "b")
NUMERIC = PgType(1700, "numeric", "b")
TSTZ = PgType(1184, "timestamptz", "b")
BYTEA = PgType(17, "bytea", "b")
MOOD = PgType(90001, "mood", "e", enum_values=("sad", "ok"))
NUMERIC_6_2 = ((6 << 16) | 2) + 4

DEFAULTS = TableSchema(
    "public",
    "defaults",
    (
        Column("id", INT4, -1, False, True),
        Column("d_int", INT4, -1, False, False, "42"),
        Column("d_int2", INT4, -1, True, False, "'-7'::integer"),
        Column("d_text", TEXT, -1, True, False, "'hello'::text"),
        Column("d_num", NUMERIC, NUMERIC_6_2, True, False, "1.5"),
        Column("d_num_any", NUMERIC, -1, True, False, "2.25"),
        Column("d_now", TSTZ, -1, True, False, "now()"),
        Column("d_serial", INT4, -1, False, False, "nextval('s'::regclass)"),
        Column("d_mood", MOOD, -1, True, False, "'ok'::mood"),
        Column("d_bytea", BYTEA, -1, True, False, "'\\x01'::bytea"),
        Column("d_expr", INT4, -1, False, False, "(1 + 2)"),
        Column("n_text", TEXT, -1, False, False),
        Column("n_num", NUMERIC, NUMERIC_6_2, False, False),
        Column("n_tstz", TSTZ, -1, False, False),
        Column("n_mood", MOOD, -1, False, False),
        Column("n_bytea", BYTEA, -1, False, False),
    ),
    ("id",),
    "d",
)


def _delete_doc() -> dict[str, Any]:
    enc = EventEncoder(SchemaSettings(), "p", "db")
    old = ["1", *([None] * (len(DEFAULTS.columns) - 1))]  # a key-only old row
    doc: dict[str, Any] = orjson.loads(enc.encode_value(DEFAULTS, "d", old, None, SOURCE))
    return doc


def test_column_defaults_in_the_value_schema() -> None:
    # Debezium's PostgresDefaultValueConverter: literals converted like values, functions and
    # CURRENT_* as the type's zero, no default for expressions, bytea, structs.
    doc = _delete_doc()
    before = next(f for f in doc["schema"]["fields"] if f["field"] == "before")
    defaults = {f["field"]: f.get("default", "none") for f in before["fields"]}
    assert defaults == {
        "id": "none",
        "d_int": 42,
        "d_int2": -7,
        "d_text": "hello",
        "d_num": base64.b64encode(b"\x00\x96").decode(),  # 1.50: 150, with its sign bit
        "d_num_any": "none",
        "d_now": "1970-01-01T00:00:00.000000Z",
        "d_serial": 0,
        "d_mood": "ok",
        "d_bytea": "none",
        "d_expr": "none",
        "n_text": "none",
        "n_num": "none",
        "n_tstz": "none",
        "n_mood": "none",
        "n_bytea": "none",
    }
    assert list(before["fields"][1]) == ["type", "optional", "default", "field"]


def test_not_null_columns_a_delete_does_not_carry() -> None:
    # REPLICA IDENTITY DEFAULT: the old row holds the key only. NOT NULL columns get their
    # default, else their type's zero, as Debezium writes them (Kafka Connect refuses a null
    # in a required field); nullable ones stay null.
    before = _delete_doc()["payload"]["before"]
    assert before == {
        "id": 1,
        "d_int": 42,
        "d_int2": None,
        "d_text": None,
        "d_num": None,
        "d_num_any": None,
        "d_now": None,
        "d_serial": 0,
        "d_mood": None,
        "d_bytea": None,
        "d_expr": 0,
        "n_text": "",
        "n_num": base64.b64encode(b"\x00").decode(),
        "n_tstz": "1970-01-01T00:00:00Z",
        "n_mood": "",
        "n_bytea": "",
    }


def test_a_null_key_is_still_an_error() -> None:
    enc = EventEncoder(SchemaSettings(), "p", "db")
    row: list[str | None] = [None] * len(DEFAULTS.columns)
    with pytest.raises(Exception, match="key"):
        enc.encode_change(DEFAULTS, "d", row, None, SOURCE)


# --- edge values ---------------------------------------------------------------------------


def test_bits(all_types: Any) -> None:
    # Section "Basic types": BIT(1) → BOOLEAN; BIT(>1) and BIT VARYING → BYTES
    # io.debezium.data.Bits with the declared length, the bits little endian in the fewest
    # bytes (none when no bit is set).
    check(all_types, "c_bit1", {"type": "boolean", "optional": True}, True)
    check(all_types, "c_bit1", {"type": "boolean", "optional": True}, False, 1)

    def bits(length: str) -> dict[str, Any]:
        return {
            "type": "bytes",
            "optional": True,
            "name": "io.debezium.data.Bits",
            "version": 1,
            "parameters": {"length": length},
        }

    check(all_types, "c_bit", bits("3"), base64.b64encode(b"\x05").decode())
    check(all_types, "c_bit10", bits("10"), base64.b64encode(b"\x83\x02").decode())
    check(all_types, "c_varbit", bits("20"), base64.b64encode(b"\x16").decode())
    check(all_types, "c_varbit", bits("20"), "", 1)
    check(all_types, "c_varbit_any", bits("2147483647"), base64.b64encode(b"\x0d").decode())


def test_tsvector(all_types: Any) -> None:
    # io.debezium.data.Tsvector (DBZ-7234), the text PostgreSQL renders.
    schema = {"type": "string", "optional": True, "name": "io.debezium.data.Tsvector", "version": 1}
    check(all_types, "c_tsvector", schema, "'a' 'cat' 'fat'")


def test_numeric_bytes_are_javas_fewest(all_types: Any) -> None:
    # Section "Decimal types": the unscaled value as BigInteger.toByteArray writes it, so
    # -1.28 is one byte (0x80) and zero in a VariableScaleDecimal has scale 0.
    schema = {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
    }
    check(all_types, "c_numeric", schema, base64.b64encode(b"\x80").decode(), 3)
    table, rows = all_types
    doc = value_json(table, row_with(table, rows, "c_numeric_any", 5))  # 0.0
    assert after(doc, "c_numeric_any") == {"scale": 0, "value": base64.b64encode(b"\x00").decode()}


def test_time_edges(all_types: Any) -> None:
    # "TIMETZ": 24:00:00+00 is a time of day like any other to java.time (00:00:00Z);
    # an interval or a timestamp beyond int64 microseconds is capped.
    zoned = {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTime", "version": 1}
    check(all_types, "c_timetz", zoned, "00:00:00Z", 2)
    micro = {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroDuration",
        "version": 1,
    }
    check(all_types, "c_interval_edge", micro, 2**63 - 1)
    check(all_types, "c_interval_edge", micro, -(2**63), 1)
    ts = {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroTimestamp",
        "version": 1,
    }
    check(all_types, "c_ts_edge", ts, 2**63 - 1)
    tz = {
        "type": "string",
        "optional": True,
        "name": "io.debezium.time.ZonedTimestamp",
        "version": 1,
    }
    check(all_types, "c_tstz_edge", tz, "+294276-12-31T23:59:59.999999Z")


def test_two_dimensional_arrays(all_types: Any) -> None:
    # Arrays declared with two dimensions nest their schema (Debezium's flat one loses the
    # values: docs/debezium.md).
    schema = {
        "type": "array",
        "items": {"type": "array", "items": {"type": "int32", "optional": True}, "optional": True},
        "optional": True,
    }
    check(all_types, "c_int4_2d", schema, [[1, 2], [3, None]])
