"""The sync jobs' Avro input: an Avro event read back is the JSON event of the same change.

Rows come from the type fixture captured from a real server (every supported type); the
reader's own encoders write both forms, and the jobs' transcoder must turn the Avro one into
what the JSON one says, so the followers hold the same values whatever the topics carry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.core.settings import DecimalHandling, SchemaSettings, ValueFormat
from schemas import avro
from schemas.envelope import EventEncoder
from schemas.formats import AvroFormat, format_for
from spark_jobs.avro_input import AvroTranscoder
from tests.unit.schemas.test_roundtrip import NAMES, ROW, ROWS, SOURCE, TABLE, json_form

pytestmark = pytest.mark.unit

TOPIC = "srv.public.all_types"


def _json_event(mode: DecimalHandling, op: str, before: Any, after: Any) -> dict[str, Any]:
    enc = EventEncoder(SchemaSettings(decimal_handling_mode=mode), "srv", "db")
    doc: dict[str, Any] = orjson.loads(enc.encode_value(TABLE, op, before, after, SOURCE))
    return doc


def _types(struct: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What the change builder reads of a row schema: each column's type, name, parameters."""
    return [
        (f["field"], f["type"], f.get("name"), f.get("parameters"), f.get("items", {}).get("type"))
        for f in struct["fields"]
    ]


def _after_schema(doc: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(f for f in doc["schema"]["fields"] if f["field"] == "after")
    return found


@settings(max_examples=120, deadline=None)
@given(ROW, ROW, st.sampled_from(list(DecimalHandling)))
def test_schemaless_avro_reads_as_the_json_event(
    tmp_path_factory: pytest.TempPathFactory, before: Any, after: Any, mode: DecimalHandling
) -> None:
    folder = tmp_path_factory.mktemp("avsc")
    schema = SchemaSettings(
        value_format=ValueFormat.AVRO, decimal_handling_mode=mode, avro_schema_dir=str(folder)
    )
    enc = EventEncoder(schema, "srv", "db", event_format=format_for(schema))
    value = enc.encode_value(TABLE, "u", before, after, SOURCE)
    key = enc.encode_key(TABLE, after)
    names = {p.name for p in folder.iterdir()}
    assert {f"{TOPIC}-key.avsc", f"{TOPIC}-value.avsc"} <= names and len(names) == 4
    assert value[:2] == key[:2] == avro.SINGLE_OBJECT_MARKER
    assert f"{TOPIC}-value.{value[2:10].hex()}.avsc" in names

    key_json, value_json, error = AvroTranscoder(schema).transcode(TOPIC, key, value)
    assert error is None and key_json is not None and value_json is not None
    got = orjson.loads(value_json)
    want = _json_event(mode, "u", before, after)
    for ts in ("ts_ms", "ts_us", "ts_ns"):  # processing time differs between the two encodes
        got["payload"][ts] = want["payload"][ts]
    assert got["payload"] == want["payload"]
    assert _types(_after_schema(got)) == _types(_after_schema(want))
    assert [f["field"] for f in _after_schema(got)["fields"]] == NAMES
    assert orjson.loads(key_json)["payload"] == json_form(enc.key_payload(TABLE, after))


def test_registry_framed_avro_reads_with_the_schema_of_its_id() -> None:
    # The registry's HTTP side is covered by tests/integration/registry; here an object
    # that keeps the schemas it was given hands them back by id.
    class Registry:
        def __init__(self) -> None:
            self.schemas: list[Any] = []

        def register(self, subject: str, schema: Any) -> int:
            self.schemas.append(schema)
            return len(self.schemas)

        def schema_by_id(self, schema_id: int) -> Any:
            return self.schemas[schema_id - 1]

    registry = Registry()
    # String decimals: the fixture holds a NaN numeric, which precise mode refuses.
    schema = SchemaSettings(
        value_format=ValueFormat.AVRO,
        registry_url="http://registry.invalid",
        decimal_handling_mode=DecimalHandling.STRING,
    )
    enc = EventEncoder(schema, "srv", "db", event_format=AvroFormat(registry))
    transcoder = AvroTranscoder(schema)
    transcoder._registry = registry
    for row in ROWS:
        value = enc.encode_value(TABLE, "c", None, row, SOURCE)
        key_json, value_json, error = transcoder.transcode(TOPIC, enc.encode_key(TABLE, row), value)
        assert error is None and value_json is not None and key_json is not None
        got = orjson.loads(value_json)["payload"]
        want = _json_event(DecimalHandling.STRING, "c", None, row)["payload"]
        got["ts_ms"], got["ts_us"], got["ts_ns"] = (want[t] for t in ("ts_ms", "ts_us", "ts_ns"))
        assert got == want
    assert len(registry.schemas) == 2  # one envelope and one key schema, read by id


def test_json_records_pass_and_unreadable_ones_say_why(tmp_path: Path) -> None:
    schema = SchemaSettings(value_format=ValueFormat.AVRO, avro_schema_dir=str(tmp_path))
    transcoder = AvroTranscoder(schema)
    heartbeat = b'{"ts_ms":1,"lsn":42}'
    assert transcoder.transcode("srv.__heartbeats", b'{"server":"srv"}', heartbeat) == (
        b'{"server":"srv"}',
        heartbeat,
        None,
    )
    assert transcoder.transcode(TOPIC, b"\x02", None)[2] is not None  # no schema file yet
    assert "no writer schema" in (transcoder.transcode(TOPIC, None, b"\x00\x02")[2] or "")
    unknown = avro.SINGLE_OBJECT_MARKER + bytes(8) + b"\x00"
    assert "fingerprint 0000000000000000" in (transcoder.transcode(TOPIC, None, unknown)[2] or "")

    enc = EventEncoder(schema, "srv", "db", event_format=format_for(schema))
    value = enc.encode_value(TABLE, "c", None, ROWS[0], SOURCE)
    assert transcoder.transcode(TOPIC, None, value)[2] is None
    # Bytes that do not fit the schema they name (here: one more byte) are refused.
    _key, bad, error = transcoder.transcode(TOPIC, None, value + b"\x00")
    assert bad == value + b"\x00" and error is not None and "bytes more" in error
    # Framing expected (a registry is set) but absent: no magic byte.
    framed = AvroTranscoder(schema.model_copy(update={"registry_url": "http://r.invalid"}))
    assert "wire format" in (framed.transcode(TOPIC, None, b"\x02" + value)[2] or "")


def test_connect_from_avro_inverts_to_avro() -> None:
    enc = EventEncoder(SchemaSettings(value_format=ValueFormat.AVRO), "srv", "db")
    plan = avro.avro_plan(enc.plan(TABLE))
    back = avro.connect_from_avro(plan.envelope)
    assert back["name"] == plan.envelope_connect["name"]
    assert _types(_after_schema({"schema": back})) == _types(
        _after_schema({"schema": plan.envelope_connect})
    )


def test_schemaless_records_written_before_a_column_change_still_read(tmp_path: Path) -> None:
    """A column added and one dropped: each record names its writer schema's fingerprint, so
    records of every table version read with their own schema, whichever is current (tables
    one column apart can read each other's bytes: a guess would be wrong silently)."""
    from dataclasses import replace

    schema = SchemaSettings(
        value_format=ValueFormat.AVRO,
        avro_schema_dir=str(tmp_path),
        decimal_handling_mode=DecimalHandling.STRING,
    )
    # v1 lacks the last column; v2 is the whole table (the column added); v3 lacks the
    # second-to-last (that column dropped).
    v1 = replace(TABLE, columns=TABLE.columns[:-1])
    v3 = replace(TABLE, columns=TABLE.columns[:-2] + TABLE.columns[-1:])
    rows = {
        "v1": (v1, ROWS[0][:-1]),
        "v2": (TABLE, ROWS[0]),
        "v3": (v3, ROWS[0][:-2] + ROWS[0][-1:]),
    }
    written: dict[str, bytes] = {}
    for version, (table, row) in rows.items():  # each version's reader in turn
        enc = EventEncoder(schema, "srv", "db", event_format=format_for(schema))
        written[version] = enc.encode_value(table, "c", None, row, SOURCE)
    transcoder = AvroTranscoder(schema)
    for version, (table, row) in rows.items():
        _, value_json, error = transcoder.transcode(TOPIC, None, written[version])
        assert error is None, (version, error)
        assert value_json is not None
        after = orjson.loads(value_json)["payload"]["after"]
        assert list(after) == [c.name for c in table.columns], version
        want = orjson.loads(
            EventEncoder(
                schema.model_copy(update={"value_format": ValueFormat.JSON}), "srv", "db"
            ).encode_value(table, "c", None, row, SOURCE)
        )["payload"]["after"]
        assert after == want, version
    assert len(list(tmp_path.glob(f"{TOPIC}-value.*.avsc"))) == 3
    # A plain schemaless record (no marker) reads with the current schema, v3's.
    plain = written["v3"][avro.SINGLE_OBJECT_HEADER :]
    assert transcoder.transcode(TOPIC, None, plain)[2] is None
