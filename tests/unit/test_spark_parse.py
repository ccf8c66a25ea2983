"""The parse in the Python task (``spark.parse = "python"``, :mod:`spark_jobs.parse`): one
test per rule of its docstring, on records as the reader writes them (its own encoder, Connect
JSON with schemas on and off, Avro) and on the poison corpus. No Spark, no servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.envelope import rows as table_rows
from benchmarks.envelope import sources, table
from pgcdc.core.contract import (
    HEADER_COMMIT_LSN,
    HEADER_ORDER,
    HEADER_UNCHANGED,
    UNAVAILABLE_VALUE_PLACEHOLDER,
    VersionOrder,
    encode_unchanged_header,
)
from pgcdc.core.settings import SchemaSettings, ValueFormat
from schemas.envelope import EventEncoder
from schemas.formats import format_for
from spark_jobs.avro_input import AvroTranscoder
from spark_jobs.changes import ChangeBuilder
from spark_jobs.parse import (
    BAD_COMMIT_LSN,
    BAD_ORDER,
    NOT_DEBEZIUM,
    KafkaRecord,
    RecordParser,
)
from spark_jobs.reduce import latest_per_key

pytestmark = pytest.mark.unit

PREFIX = "srv"
TOPIC = "srv.public.customers"
BEATS = "__cdc-heartbeat.srv"
TABLE = table()  # the benchmarks' 10-column table, values as pgoutput sends them
(SOURCE,) = sources(1)


def _row(key: str, name: str = "a") -> tuple[str | None, ...]:
    (row,) = table_rows(1)
    return (key, name, *row[2:])


def _encoder(schemas: bool = True) -> EventEncoder:
    return EventEncoder(SchemaSettings(schemas_enable=schemas), PREFIX, "db")


def _record(
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]] | None = None,
    topic: str = TOPIC,
    offset: int = 0,
) -> KafkaRecord:
    return KafkaRecord(topic, 0, offset, key, value, headers)


def _headers(lsn: int, order: int) -> list[tuple[str, bytes | None]]:
    return [
        (k, v if isinstance(v, bytes | None) else v.encode())
        for k, v in VersionOrder(lsn, order).headers()
    ]


def _parse(*records: KafkaRecord, parser: RecordParser | None = None) -> list[dict[str, Any]]:
    return list((parser or RecordParser(PREFIX, BEATS)).rows(records))


@pytest.mark.parametrize("schemas", [True, False], ids=["schemas-on", "schemas-off"])
def test_the_readers_own_records_become_changes(schemas: bool) -> None:
    """Rules 1, 4, 5, 6, 10, 11: table, envelope with and without schemas, key, version."""
    enc = _encoder(schemas)
    row = _row("7", "x")
    key, value = enc.encode_key(TABLE, row), enc.encode_value(TABLE, "u", None, row, SOURCE)
    (got,) = _parse(_record(key, value, _headers(900, 3)))
    event = orjson.loads(value)
    payload = event["payload"] if schemas else event
    assert got["kind"] == "change" and got["table"] == "public.customers"
    assert orjson.loads(got["key_json"]) == (
        orjson.loads(key)["payload"] if schemas else orjson.loads(key)
    )
    assert got["op"] == "u" and got["is_delete"] is False
    assert got["after"] == payload["after"] and got["after_json"] is None  # parsed once
    assert (got["commit_lsn"], got["tx_order"]) == (900, 3)
    assert got["source_ts_ms"] == payload["source"]["ts_ms"]
    if schemas:
        assert orjson.loads(got["value_schema_json"]) == event["schema"]
        assert got["schema_id"] is not None
    else:
        assert (got["value_schema_json"], got["schema_id"]) == (None, None)
    # The change builder reads it as it reads the JVM path's rows.
    change = ChangeBuilder({got["schema_id"]: got["value_schema_json"]})({**got, "history": None})
    assert change.key == "7" and (change.commit_lsn, change.order) == (900, 3)


def test_without_version_headers_the_events_own_lsn_orders_it() -> None:
    """Rule 6: headers absent (events written by others) → source.lsn, order 0; no
    source.lsn either → 0."""
    enc = _encoder()
    row = _row("1")
    value = enc.encode_value(TABLE, "c", None, row, SOURCE)
    bare = orjson.dumps({"op": "c", "after": {"id": 1}})
    a, b, c = _parse(
        _record(enc.encode_key(TABLE, row), value),
        _record(b'{"id":1}', bare),
        _record(b'{"id":1}', bare, [(HEADER_COMMIT_LSN, None)]),  # a null header is absent
    )
    assert (a["commit_lsn"], a["tx_order"]) == (SOURCE.lsn, 0)
    assert (b["commit_lsn"], b["tx_order"]) == (0, 0)
    assert (c["commit_lsn"], c["kind"]) == (0, "change")


def test_version_headers_that_are_no_decimal_are_dead_and_too_large_ones_stop() -> None:
    """Rules 6, 7: not ASCII digits → dead with the reason; beyond 2**63-1 → a null commit
    LSN (the change builder stops on it) and order 0."""
    value = orjson.dumps({"op": "c", "after": {"id": 1}, "source": {"lsn": 5}})
    rows = _parse(
        _record(b'{"id":1}', value, [(HEADER_COMMIT_LSN, b"zz"), (HEADER_ORDER, b"0")]),
        _record(b'{"id":2}', value, [(HEADER_COMMIT_LSN, b"12"), (HEADER_ORDER, b"-1")]),
        _record(b'{"id":3}', value, [(HEADER_COMMIT_LSN, str(2**64).encode())]),
        _record(
            b'{"id":4}', value, [(HEADER_COMMIT_LSN, b"10"), (HEADER_ORDER, str(2**64).encode())]
        ),
        _record(b'{"id":5}', value, [(HEADER_COMMIT_LSN, "١٢".encode())]),  # not ASCII
        _record(b'{"id":6}', None, [(HEADER_COMMIT_LSN, b"")]),  # even a tombstone
        _record(b'{"id":7}', value, [(HEADER_COMMIT_LSN, b"8"), (HEADER_COMMIT_LSN, b"x")]),
    )
    assert [r["parse_error"] for r in rows] == [
        BAD_COMMIT_LSN, BAD_ORDER, None, None, BAD_COMMIT_LSN, BAD_COMMIT_LSN, None,
    ]  # fmt: skip
    assert rows[0]["kind"] == "dead" and rows[0]["raw_value"] == value.decode()
    assert rows[2]["kind"] == "change" and rows[2]["commit_lsn"] is None
    assert (rows[3]["commit_lsn"], rows[3]["tx_order"]) == (10, 0)
    assert rows[6]["commit_lsn"] == 8  # the first header of a name counts
    with pytest.raises(Exception, match="beyond 2\\*\\*63-1"):
        ChangeBuilder()({**rows[2], "history": None})


def test_the_poison_corpus_is_dead_lettered_or_left_to_the_change_builder() -> None:
    """Rules 2, 5, 7: what the jobs' poison corpus sends (tests/e2e/test_jobs_robustness)."""
    good = orjson.dumps({"op": "c", "after": {"id": 1}})
    rows = _parse(
        _record(b"{not json", good, offset=1),
        _record(b'{"id":2}', b"\x00\xffnot json at all", offset=2),
        _record(b"42", good, offset=3),
        _record(b'{"id":3}', orjson.dumps({"op": "c", "after": None}), offset=4),
        _record(b'{"id":4}', b"[1, 2]", offset=5),
        _record(b'{"id":5}', b'{"payload": "text"}', offset=6),
        _record(b'{"id":6}', b'{"payload": {"after": {}}}', offset=7),  # no op
        _record(b'{"id":7}', b'{"op": 5}', offset=8),
        _record(b'{"id":8}', good + b" trailing", offset=9),
    )
    by_offset = {r["offset"]: r for r in rows}
    dead = {o for o, r in by_offset.items() if r["kind"] == "dead"}
    assert dead == {2, 5, 6, 7, 8, 9}
    assert all(by_offset[o]["parse_error"] == NOT_DEBEZIUM for o in dead)
    assert by_offset[2]["raw_value"] == "\x00\ufffdnot json at all"
    # Keys that are no JSON object, and a c event without after, are the change builder's.
    build = ChangeBuilder()
    for offset, reason in ((1, "not JSON"), (3, "JSON object"), (4, "'after'")):
        row = by_offset[offset]
        assert row["kind"] == "change" and row["raw_value"] is None
        with pytest.raises(ValueError, match=reason):
            build({**row, "history": None})


def test_text_that_is_not_utf8_is_read_with_replacement_characters() -> None:
    """Rule 2: keys, values and headers."""
    value = b'{"op":"c","after":{"v":"a\xffb"}}'
    (row,) = _parse(_record(b'{"id":"\xfe"}', value, [(HEADER_UNCHANGED, b"n\xff")]))
    assert row["kind"] == "change"
    assert orjson.loads(row["key_json"]) == {"id": "\ufffd"}
    assert row["after"] == {"v": "a\ufffdb"}
    assert row["unchanged"] == "n\ufffd"


def test_tombstones_deletes_truncates_and_keyless_tables() -> None:
    """Rules 8, 9: kinds in order; a keyless table's tombstone is keyless too."""
    log = "srv.public.log"
    event = orjson.dumps({"op": "c", "after": {"n": 1}})
    rows = _parse(
        _record(b'{"id":1}', orjson.dumps({"op": "d", "before": {"id": 1}}), offset=1),
        _record(b'{"id":1}', None, offset=2),
        _record(None, event, topic=log, offset=3),
        _record(None, None, topic=log, offset=4),
        _record(None, orjson.dumps({"op": "t"}), topic=log, offset=5),
        _record(b'{"id":9}', orjson.dumps({"op": "t"}), offset=6),
    )
    assert [(r["kind"], r["is_delete"]) for r in rows] == [
        ("change", True), ("change", True), ("keyless", False), ("keyless", True),
        ("truncate", False), ("truncate", False),
    ]  # fmt: skip
    assert {r["table"] for r in rows[2:5]} == {"public.log"}
    assert all(r["parse_error"] is None for r in rows)


def test_heartbeats_give_their_lsn_and_nothing_else() -> None:
    """Rule 3."""
    key = b'{"serverName":"srv"}'
    rows = _parse(
        _record(key, b'{"ts_ms":1,"lsn":500}', topic=BEATS),
        _record(key, b'{"ts_ms":1,"lsn":"600"}', topic=BEATS),
        _record(key, b"not json", topic=BEATS),
        _record(key, None, topic=BEATS),
        _record(key, b'{"lsn":18446744073709551616}', topic=BEATS),
    )
    assert [r["kind"] for r in rows] == ["heartbeat"] * 5
    assert [r["heartbeat_lsn"] for r in rows] == [500, 600, None, None, None]
    assert all(r["parse_error"] is None and r["table"] == BEATS for r in rows)


def test_the_unchanged_header_and_placeholders_reach_the_change_builder() -> None:
    """Rule 10: the header names the columns whatever their value; a placeholder in the
    image is folded from an older event of the batch (the reduction keeps the history)."""
    big = "x" * 9000
    value = lambda after: orjson.dumps({"op": "u", "after": after})  # noqa: E731
    rows = _parse(
        _record(
            b'{"id":1}',
            value({"id": 1, "n": None}),
            [*_headers(400, 0), (HEADER_UNCHANGED, encode_unchanged_header(["n"]))],
        ),
        _record(b'{"id":5}', value({"id": 5, "body": big, "n": 1}), _headers(200, 0)),
        _record(
            b'{"id":5}',
            value({"id": 5, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "n": 2}),
            _headers(300, 0),
        ),
    )
    reduced = {
        orjson.loads(r["key_json"])["id"]: r for r in latest_per_key(rows) if r["kind"] == "change"
    }
    build = ChangeBuilder()
    one = build(reduced[1])
    assert one.doc == {"id": 1} and one.unchanged == frozenset({"n"})
    five = build(reduced[5])
    assert five.doc == {"id": 5, "body": big, "n": 2} and five.unchanged == frozenset()


def test_each_schema_is_carried_once_per_topic_and_on_every_dead_row() -> None:
    """Rule 11: equal schemas share an id; the text comes with the first of each (topic,
    id) and every dead row; the reduction gives one schema row per (topic, id)."""
    enc = _encoder()
    other = "srv.public.other"
    rows = _parse(
        *[
            _record(
                enc.encode_key(TABLE, _row(str(i))),
                enc.encode_value(TABLE, "c", None, _row(str(i)), SOURCE),
                topic=topic,
                offset=i,
            )
            for i, topic in enumerate([TOPIC, TOPIC, other, TOPIC])
        ],
        _record(
            b'{"id":9}',
            enc.encode_value(TABLE, "c", None, _row("9"), SOURCE),
            [(HEADER_ORDER, b"x")],
            offset=9,
        ),
    )
    assert len({r["schema_id"] for r in rows}) == 1
    assert [r["value_schema_json"] is not None for r in rows] == [True, False, True, False, True]
    schemas = [r for r in latest_per_key(rows) if r["kind"] == "schema"]
    assert sorted(r["topic"] for r in schemas) == sorted([other, TOPIC])
    assert rows[4]["kind"] == "dead" and rows[4]["parse_error"] == BAD_ORDER


def test_a_60_mb_value_is_read_whole() -> None:
    """Rule 12: no size limit of the parse's own (the JVM's reader needed a second parse)."""
    blob = "x" * (60 * 1024 * 1024)
    value = orjson.dumps({"op": "c", "after": {"id": 1, "body": blob}})
    (row,) = _parse(_record(b'{"id":1}', value))
    assert row["kind"] == "change"
    change = ChangeBuilder()({**row, "history": None})
    assert change.doc is not None and len(change.doc["body"]) == len(blob)


def test_avro_records_are_read_into_the_json_event_in_the_task(tmp_path: Path) -> None:
    """Rule 13: Avro (single-object, writer schemas in a folder) is transcoded first; a
    record that is no Avro event of its topic is dead with the transcoder's reason."""
    schema = SchemaSettings(value_format=ValueFormat.AVRO, avro_schema_dir=str(tmp_path))
    enc = EventEncoder(schema, PREFIX, "db", event_format=format_for(schema))
    json_enc = _encoder()
    row = _row("3", "avro")
    parser = RecordParser(PREFIX, BEATS, AvroTranscoder(schema).transcode)
    got, bad, beat = _parse(
        _record(
            enc.encode_key(TABLE, row),
            enc.encode_value(TABLE, "c", None, row, SOURCE),
            _headers(70, 1),
        ),
        _record(enc.encode_key(TABLE, row), b"\xc3\x01" + b"\x00" * 8 + b"junk", offset=1),
        _record(b'{"serverName":"srv"}', b'{"ts_ms":1,"lsn":80}', topic=BEATS),
        parser=parser,
    )
    (want,) = _parse(
        _record(
            json_enc.encode_key(TABLE, row),
            json_enc.encode_value(TABLE, "c", None, row, SOURCE),
            _headers(70, 1),
        )
    )
    assert got["kind"] == "change"
    assert orjson.loads(got["key_json"]) == orjson.loads(want["key_json"])
    assert got["after"] == want["after"]
    assert (got["commit_lsn"], got["tx_order"]) == (70, 1)
    assert bad["kind"] == "dead" and bad["parse_error"].startswith("Avro: ")
    assert beat["heartbeat_lsn"] == 80


def test_a_known_schema_is_not_parsed_again_and_changes_nothing() -> None:
    """Rule 14: once a topic's schema is known, values starting with its bytes have only
    their payload parsed; the rows equal those of a parse of each value on its own, for
    the reader's records and for values that merely start like them."""
    enc = _encoder()
    row = _row("1")
    value = enc.encode_value(TABLE, "c", None, row, SOURCE)
    head, payload = (
        value[: value.index(b',"payload":') + 11],
        value[value.index(b',"payload":') + 11 : -1],
    )
    other = orjson.loads(value)
    other["schema"]["name"] = "changed"
    values = [
        value,
        enc.encode_value(TABLE, "u", None, _row("2", "b"), SOURCE),
        head + payload + b', "schema": 1}',  # more after the payload: the last schema wins
        head + b"null}",  # a null payload: the bare event, no op
        head + b'"text"}',
        head + payload + b"} ",  # trailing space: parsed whole
        head + payload.replace(b'"b"', b'"\xff"') + b"}",  # not UTF-8
        orjson.dumps(other),  # the schema changed
        value,
    ]
    key = enc.encode_key(TABLE, row)
    shared = RecordParser(PREFIX, BEATS)
    together = _parse(*[_record(key, v, offset=i) for i, v in enumerate(values)], parser=shared)
    alone = [_parse(_record(key, v, offset=i))[0] for i, v in enumerate(values)]

    def comparable(r: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r.items() if k not in ("schema_id", "value_schema_json")}

    assert [comparable(r) for r in together] == [comparable(r) for r in alone]
    assert [r["kind"] for r in together] == ["change", "change", "change", "dead", "dead",
                                             "change", "change", "change", "change"]  # fmt: skip
    assert together[2]["value_schema_json"] == "1"
    assert together[0]["schema_id"] == together[1]["schema_id"] == together[8]["schema_id"]
    assert together[7]["schema_id"] != together[0]["schema_id"]
    assert orjson.loads(together[7]["value_schema_json"])["name"] == "changed"
    assert shared._known  # the fast path was there to take


_SCHEMAS = [{"type": "struct", "fields": [{"field": "after", "type": "struct"}]}, {"type": "x"}]
_PAYLOADS = st.one_of(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["c", "u", "d", "t"]), "after": st.none() | st.just({"id": 1})},
        optional={"source": st.fixed_dictionaries({"lsn": st.integers(0, 2**64 - 1)})},
    ),
    st.none(),
    st.text(max_size=3),
    st.integers(-(2**63), 2**64 - 1),
)


@st.composite
def _value(draw: st.DrawFn) -> bytes:
    """A value as the reader writes it, or one that only starts like it."""
    schema = orjson.dumps(draw(st.sampled_from(_SCHEMAS)))
    payload = orjson.dumps(draw(_PAYLOADS))
    body = b'{"schema":' + schema + b',"payload":' + payload
    tail = draw(st.sampled_from([b"}", b"} ", b',"schema":1}', b',"payload":null}', b"", b"}}"]))
    return body + tail


@settings(max_examples=300, deadline=None)
@given(st.lists(_value(), min_size=1, max_size=12))
def test_the_known_schema_shortcut_never_changes_a_row(values: list[bytes]) -> None:
    """Rule 14 as a property: a task's rows equal those of each value parsed alone."""
    shared = RecordParser(PREFIX, BEATS)
    records = [_record(b'{"id":1}', v, offset=i) for i, v in enumerate(values)]
    together = list(shared.rows(records))
    alone = [RecordParser(PREFIX, BEATS)(r) for r in records]
    for a, b in zip(together, alone, strict=True):
        assert {**a, "schema_id": None, "value_schema_json": None} == {
            **b,
            "schema_id": None,
            "value_schema_json": None,
        }
    # Equal schemas share an id, and the JSON of each id comes once, equal to its own.
    texts = {r["value_schema_json"] for r in alone if r["value_schema_json"] is not None}
    carried = [r for r in together if r["value_schema_json"] is not None and r["kind"] != "dead"]
    assert len({r["schema_id"] for r in together if r["schema_id"] is not None}) == len(texts)
    assert len(carried) <= len(texts)  # (and each dead row carries its own)
    for a in carried:
        assert a["value_schema_json"] == alone[a["offset"]]["value_schema_json"]


def test_a_worker_keeps_one_transcoder_its_range_threads_share(tmp_path: Path) -> None:
    """``transcoder_for``: the schemas a transcoder fetched outlive a task whose ranges ran
    in threads of their own (``spark.ranges_at_once``); other settings replace it."""
    import threading

    from spark_jobs.avro_input import transcoder_for

    schema = SchemaSettings(value_format=ValueFormat.AVRO, avro_schema_dir=str(tmp_path))
    first = transcoder_for(schema)
    seen: list[AvroTranscoder] = []
    threads = [
        threading.Thread(target=lambda: seen.append(transcoder_for(schema))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 3 and all(t is first for t in seen)
    other = SchemaSettings(value_format=ValueFormat.AVRO, avro_schema_dir=str(tmp_path / "x"))
    assert transcoder_for(other) is not first and transcoder_for(other).settings == other
