"""The direct read's native path (``spark.apply = "native"``, :mod:`spark_jobs.fast_changes`)
against the Python path it stands in for (:mod:`spark_jobs.parse`, :func:`latest_per_key`,
:class:`ChangeBuilder`): wherever the native path takes a range, both give the same changes,
value for value and type for type, and the Python path finds nothing in that range to
dead-letter or skip. No Spark, no servers."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from benchmarks.envelope import rows as table_rows
from benchmarks.envelope import sources, table
from pgcdc.core import native, row_digest
from pgcdc.core.contract import (
    HEADER_COMMIT_LSN,
    HEADER_ORDER,
    HEADER_UNCHANGED,
    UNAVAILABLE_VALUE_PLACEHOLDER,
)
from pgcdc.core.settings import SchemaSettings
from schemas.envelope import EventEncoder
from sinks.base import Change, WholeDocument
from sinks.cache import hash_fields
from spark_jobs import convert
from spark_jobs.changes import ChangeBuilder, RecordError
from spark_jobs.fast_changes import native_range
from spark_jobs.parse import CHANGE, SCHEMA, KafkaRecord, RecordParser
from spark_jobs.reduce import latest_per_key

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        native.module() is None or not hasattr(native.module(), "FastChanges"),
        reason="pgcdc's native module is not built (make install, with cargo)",
    ),
]

PREFIX = "srv"
TOPIC = "srv.public.things"
BEATS = "__cdc-heartbeat.srv"


def _python(records: list[KafkaRecord]) -> tuple[list[Change], list[str]]:
    """The Python path's changes, and what it found that is no change it applies (a dead
    letter, a keyless or truncate record, a change the builder refuses)."""
    rows = latest_per_key(RecordParser(PREFIX, BEATS).rows(records))
    schemas = {r["schema_id"]: r["schema_json"] for r in rows if r["kind"] == SCHEMA}
    build = ChangeBuilder(schemas)
    changes, others = [], []
    for r in rows:
        if r["kind"] == CHANGE:
            try:
                changes.append(build(r))
            except RecordError as e:
                others.append(f"refused: {e}")
        elif r["kind"] != SCHEMA:
            others.append(r["kind"])
    return changes, others


def _native(records: list[KafkaRecord]) -> list[Change] | None:
    built = native_range(RecordParser(PREFIX, BEATS), records, BEATS)
    return None if built is None else built.changes


def _same(records: list[KafkaRecord]) -> bool:
    """Whether the native path took the records; when it did, its changes are the Python
    path's exactly (order, values, their types, the documents' column order), and so are
    their records' positions, the schema and the newest commit time that go with them."""
    built = native_range(RecordParser(PREFIX, BEATS), records, BEATS)
    if built is None:
        return False
    fast = built.changes
    slow, others = _python(records)
    assert others == []
    assert fast == slow
    for a, b in zip(fast, slow, strict=True):
        assert a.split == b.split
        if a.doc is not None:
            assert a.schema == b.schema is not None  # the schema each was decoded with
            assert b.doc is not None
            assert list(a.doc.items()) == list(b.doc.items())
            assert [type(v) for v in a.doc.values()] == [type(v) for v in b.doc.values()]
    rows = latest_per_key(RecordParser(PREFIX, BEATS).rows(records))
    changed = [r for r in rows if r["kind"] == CHANGE]
    assert built.where == [(r["topic"], r["partition"], r["offset"]) for r in changed]
    # As the Python path counts it (spark_jobs.apply_loop): from 0, a time before 1970 none.
    assert built.newest_commit_ms == max([0, *(r["source_ts_ms"] or 0 for r in changed)])
    schemas = [orjson.loads(r["schema_json"]) for r in rows if r["kind"] == SCHEMA]
    assert schemas and all(s == built.schema for s in schemas)
    assert all(c.schema is built.schema for c in built.changes if c.doc is not None)
    assert {built.table} == {r["table"] for r in changed}
    # What lets the followers take its chunks as they are (sinks.base.OnePerKey).
    assert len({(c.table, c.key) for c in fast}) == len(fast)
    for c in fast:
        _rendered_as_the_followers_render(c)
    return True


def _rendered_as_the_followers_render(c: Change) -> None:
    """``c.rendered`` is byte for byte what the followers make of ``c.doc`` themselves
    (sinks.cache's hash payload, sinks.search's document and row digest, floats written as
    orjson writes them); it is missing only for a delete."""
    if c.doc is None:
        assert c.rendered is None
        return
    assert c.rendered is not None
    source, fields, digest = c.rendered
    # Its document is read from that JSON when asked (sinks.base.WholeDocument); its length
    # is known without reading it, and is what the Redis follower asks.
    assert isinstance(c.doc, WholeDocument) and c.doc.json is source
    doc = dict(c.doc)
    assert len(c.doc) == len(doc)
    assert source == orjson.dumps(doc)
    assert fields == hash_fields(doc)
    assert digest == orjson.dumps(row_digest.stored(c.key, doc))
    assert row_digest.canonical(doc) == orjson.dumps(dict(sorted(doc.items())))


def _headers(lsn: int, order: int | None) -> list[tuple[str, bytes | None]]:
    out: list[tuple[str, bytes | None]] = [(HEADER_COMMIT_LSN, str(lsn).encode())]
    if order is not None:
        out.append((HEADER_ORDER, str(order).encode()))
    return out


# -- the reader's own records --------------------------------------------------------------


def test_the_readers_own_records_take_the_native_path() -> None:
    """Records of the reader's encoder (the benchmarks' 10-column table: numeric, dates,
    timestamps, booleans, floats, text), keys written several times, deletes and
    tombstones: taken natively, the same changes as the Python path."""
    enc = EventEncoder(SchemaSettings(), PREFIX, "db")
    tbl = table()
    (source,) = sources(1)
    records = []
    for n, row in enumerate(table_rows(300)):
        key = str(n % 120)  # 120 keys, written up to three times
        row = (key, *row[1:])
        op = "c" if n < 120 else "u"
        k, v = enc.encode_key(tbl, row), enc.encode_value(tbl, op, None, row, source)
        records.append(KafkaRecord(TOPIC, 0, len(records), k, v, _headers(1000 + n, n % 3)))
        if n % 37 == 5:  # a delete and its tombstone
            d = enc.encode_value(tbl, "d", row, None, source)
            records.append(KafkaRecord(TOPIC, 0, len(records), k, d, _headers(1000 + n, 9)))
            records.append(KafkaRecord(TOPIC, 0, len(records), k, None, _headers(1000 + n, 9)))
    assert _same(records)
    fast = _native(records)
    assert fast is not None and len(fast) == 120
    assert any(c.doc is None for c in fast) and any(c.doc is not None for c in fast)


def _readers_records(n: int, keys: int) -> list[KafkaRecord]:
    """``n`` changes of the reader's encoder over ``keys`` keys (each written again and
    again, the versions rising with the offsets), a delete and its tombstone now and then."""
    enc = EventEncoder(SchemaSettings(), PREFIX, "db")
    tbl = table()
    (source,) = sources(1)
    records: list[KafkaRecord] = []
    for i, row in enumerate(table_rows(n)):
        key = str(i % keys)
        row = (key, *row[1:])
        k, v = enc.encode_key(tbl, row), enc.encode_value(tbl, "u", None, row, source)
        records.append(KafkaRecord(TOPIC, 0, len(records), k, v, _headers(1000 + i, 0)))
        if i % 41 == 7:
            d = enc.encode_value(tbl, "d", row, None, source)
            records.append(KafkaRecord(TOPIC, 0, len(records), k, d, _headers(1000 + i, 1)))
            records.append(KafkaRecord(TOPIC, 0, len(records), k, None, _headers(1000 + i, 1)))
    return records


def _held(takes: list[list[Change]]) -> dict[str, Change]:
    """What a follower holds once ``takes`` are written in their order: for each key, the
    change of the newest version (a follower refuses an older one)."""
    held: dict[str, Change] = {}
    for changes in takes:
        for c in changes:
            h = held.get(c.key)
            if h is None or (c.commit_lsn, c.order) > (h.commit_lsn, h.order):
                held[c.key] = c
    return held


def test_a_range_taken_part_by_part_leaves_each_key_at_its_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Taken after each part (as a task does while its followers keep up), a range's
    changes are one a key in each take, the parts after a take reduce anew, and written
    take after take they leave every key at the change the whole range reduces to. A part
    with a record off the native path ends it: the Python path's changes of the range from
    ``taken_to`` on, written after the takes, leave the same."""
    from spark_jobs import fast_changes

    monkeypatch.setattr(fast_changes, "_PART", 50)
    records = _readers_records(300, 70)  # 70 keys, each in several parts
    whole = _native(records)
    assert whole is not None
    parts = fast_changes.native_parts(RecordParser(PREFIX, BEATS), records, BEATS)
    assert parts is not None
    takes: list[list[Change]] = []
    while parts.add_next():
        changes, where, _ = parts.take()
        assert len({c.key for c in changes}) == len(changes)
        part = range(50 * len(takes), 50 * len(takes) + 50)  # the part just added, alone
        assert all(t == TOPIC and p == 0 and o in part for t, p, o in where), where
        takes.append(changes)
    assert parts.whole and len(takes) == -(-len(records) // 50)
    assert parts.taken == sum(map(len, takes)) > len(whole)  # keys written again, take by take
    assert _held(takes) == {c.key: c for c in whole}

    # A record with unchanged columns in the fourth part: the first three are taken.
    at = 170
    off = [
        *records[:at],
        records[at]._replace(headers=[*records[at].headers, (HEADER_UNCHANGED, b"[]")]),
        *records[at + 1 :],
    ]
    parts = fast_changes.native_parts(RecordParser(PREFIX, BEATS), off, BEATS)
    assert parts is not None
    takes = []
    while added := parts.add_next():
        takes.append(parts.take()[0])
    assert added is False and not parts.whole
    assert len(takes) == 3 and parts.taken_to == 150
    rest, _ = _python(off[parts.taken_to :])
    expected, _ = _python(off)
    assert _held([*takes, rest]) == {c.key: c for c in expected}


class _Consumed:
    """A range's messages as ``RangeMessages`` hands them over: confluent-kafka's own
    ``Message`` objects, in lists of ``sizes`` (the last size repeated)."""

    def __init__(self, messages: list[Any], start: int, end: int, sizes: list[int]) -> None:
        from spark_jobs.kafka_direct import Range

        self.range = Range(TOPIC, 0, start, end)
        self._messages, self._sizes = messages, sizes
        self.asked: list[int] = []  # the ``expect`` of each next()
        self.failed_too = False

    def next(self, expect: int) -> list[Any]:
        self.asked.append(expect)
        size = self._sizes[min(len(self.asked) - 1, len(self._sizes) - 1)]
        taken, self._messages = self._messages[:size], self._messages[size:]
        assert taken, "read past the range's end"
        return taken

    def failed(self) -> None:
        self.failed_too = True


def _message(r: KafkaRecord | None = None, **fields: Any) -> Any:
    from confluent_kafka import Message

    if r is not None:
        fields = {"topic": r.topic, "partition": r.partition, "offset": r.offset, "key": r.key,
                  "value": r.value, "headers": r.headers, **fields}  # fmt: skip
    return Message(**fields)


def test_a_range_read_from_its_consumed_messages_gives_what_its_records_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``native_message_parts`` reads confluent-kafka's messages as ``read_range`` reads
    them: another partition's records and its end, a message without an offset, and what
    comes after the range's last offset are passed over, and the changes, their positions
    and the part boundaries are those of the range's records. A record off the path ends
    the native part at the part before it; an error other than a partition's end is raised
    and the consumer marked failed."""
    from confluent_kafka import KafkaError, KafkaException

    from spark_jobs import fast_changes

    monkeypatch.setattr(fast_changes, "_PART", 50)
    records = _readers_records(300, 70)
    whole = _native(records)
    assert whole is not None
    other = KafkaError(KafkaError._PARTITION_EOF)
    stray = [_message(r, partition=1, value=b"off this path") for r in records[:3]]
    messages = [
        _message(error=other, topic=TOPIC, partition=1),
        *stray[:2],
        *(_message(r) for r in records[:120]),
        _message(topic=TOPIC, partition=0, value=b"no offset"),
        stray[2],
        *(_message(r) for r in records[120:]),
        _message(records[-1], offset=records[-1].offset + 1),  # past the end: never read
    ]
    end = records[-1].offset + 1
    consumed = _Consumed(messages, records[0].offset, end, [7, 500, 33])
    parts = fast_changes.native_message_parts(RecordParser(PREFIX, BEATS), consumed, BEATS)
    assert parts is not None
    takes = []
    while parts.add_next():
        changes, where, _ = parts.take()
        assert all(t == TOPIC and p == 0 and o < end for t, p, o in where), where
        takes.append(changes)
    assert parts.whole and parts.taken_to == end
    assert _held(takes) == {c.key: c for c in whole}
    assert not consumed.failed_too and consumed.asked[0] == records[0].offset

    # The range's own end: the range is read, whatever follows.
    eof = KafkaError(KafkaError._PARTITION_EOF)
    consumed = _Consumed([*(_message(r) for r in records[:100]), _message(error=eof, topic=TOPIC,
                          partition=0)], records[0].offset, end, [64])  # fmt: skip
    parts = fast_changes.native_message_parts(RecordParser(PREFIX, BEATS), consumed, BEATS)
    assert parts is not None
    while parts.add_next():
        parts.take()
    assert parts.whole and parts.taken_to == records[100].offset

    # A record with unchanged columns in the fourth part: the first three parts are taken.
    at = 170
    off = [*records[:at], records[at]._replace(headers=[*records[at].headers,
           (HEADER_UNCHANGED, b"[]")]), *records[at + 1 :]]  # fmt: skip
    consumed = _Consumed([_message(r) for r in off], records[0].offset, end, [50])
    parts = fast_changes.native_message_parts(RecordParser(PREFIX, BEATS), consumed, BEATS)
    assert parts is not None
    while added := parts.add_next():
        parts.take()
    assert added is False and not parts.whole and parts.taken_to == records[150].offset

    # A range of tombstones only: the Python path's, read no further than its last offset.
    tombstones = [
        _message(topic=TOPIC, partition=0, offset=o, key=records[0].key) for o in range(5)
    ]
    consumed = _Consumed(tombstones, 0, 5, [2])
    assert fast_changes.native_message_parts(RecordParser(PREFIX, BEATS), consumed, BEATS) is None
    assert consumed.asked == [0, 2, 4]

    # A failure: raised, the consumer not kept.
    broken = KafkaError(KafkaError._TRANSPORT)
    consumed = _Consumed([*(_message(r) for r in records[:10]), _message(error=broken)],
                         records[0].offset, end, [500])  # fmt: skip
    parts = fast_changes.native_message_parts(RecordParser(PREFIX, BEATS), consumed, BEATS)
    assert parts is not None
    with pytest.raises(KafkaException):
        parts.add_next()
    assert consumed.failed_too


# -- a table of every kind, generated --------------------------------------------------------


def _field(name: str, kind: str, semantic: str | None = None, **params: str) -> dict[str, Any]:
    f: dict[str, Any] = {"type": kind, "optional": True, "field": name}
    if semantic is not None:
        f["name"] = semantic
        f["version"] = 1
    if params:
        f["parameters"] = params
    return f


COLUMNS = [
    _field("s", "string"),
    _field("n", "int64"),
    _field("f", "double"),
    _field("b", "boolean"),
    _field("d2", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2"),
    _field("d0", "bytes", "org.apache.kafka.connect.data.Decimal", scale="0"),
    _field("day", "int32", "io.debezium.time.Date"),
    _field("ts", "int64", "io.debezium.time.MicroTimestamp"),
    _field("tsm", "int64", "io.debezium.time.Timestamp"),
    _field("tsn", "int64", "io.debezium.time.NanoTimestamp"),
    _field("t", "int64", "io.debezium.time.MicroTime"),
    _field("tm", "int32", "org.apache.kafka.connect.data.Time"),
    _field("z", "string", "io.debezium.time.ZonedTimestamp"),
]
KEYS = [_field("id", "int64"), _field("code", "string")]


def _row_schema(fields: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return {"type": "struct", "fields": fields, "optional": True, "name": name}


def _envelope_schema(fields: list[dict[str, Any]]) -> dict[str, Any]:
    row = _row_schema(fields, "srv.public.things.Value")
    source = _row_schema([_field("ts_ms", "int64"), _field("lsn", "int64")], "source")
    return {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {**source, "optional": False, "field": "source"},
            _field("op", "string"),
            _field("ts_ms", "int64"),
        ],
        "optional": False,
        "name": "srv.public.things.Envelope",
    }


def _decimal(n: int) -> str:
    size = max(1, (n.bit_length() + 8) // 8)
    return base64.b64encode(n.to_bytes(size, "big", signed=True)).decode()


_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(['a"b', "a\\b", "tab\there", "new\nline", "é ✓ 𝄞", "\x01", "", "1e5"]),
)
_ODD_TEXT = st.one_of(_TEXT, st.just(UNAVAILABLE_VALUE_PLACEHOLDER))
_I64 = st.integers(-(2**63), 2**63 - 1)
_MICROS = st.integers(-62_135_596_800 * 10**6, 253_402_300_799 * 10**6)  # years 1 to 9999
# Values in the converters' plain cases, which the native path takes.
_PLAIN: dict[str, st.SearchStrategy[Any]] = {
    "s": _TEXT,
    "n": st.one_of(_I64, st.integers(0, 2**64 - 1)),
    "f": st.floats(allow_nan=False, allow_infinity=False),
    "b": st.booleans(),
    "d2": st.integers(-(10**37), 10**37).map(_decimal),
    "d0": st.integers(-(10**20), 10**20).map(_decimal),
    "day": st.integers(-719_162, 2_932_896),
    "ts": _MICROS,
    "tsm": _MICROS.map(lambda us: us // 1000),
    "tsn": _I64,
    "t": st.integers(0, 86_400_000_000),
    "tm": st.integers(0, 86_400_000),
    "z": _TEXT,
}
# And beyond them: placeholders, a bool or text for a date, dates and times out of range,
# decimals of over 16 bytes, not base64.
_ODD: dict[str, st.SearchStrategy[Any]] = {
    "s": _ODD_TEXT,
    "n": _I64,
    "f": st.just(-0.0),
    "b": st.booleans(),
    "d2": st.one_of(st.integers(-(10**45), 10**45).map(_decimal), _ODD_TEXT, st.integers(-5, 5)),
    "d0": st.sampled_from(["A", "AA==", "////", "gA=="]),
    "day": st.one_of(st.integers(-(2**31), 2**31), st.booleans(), _ODD_TEXT),
    "ts": st.one_of(_I64, st.booleans()),
    "tsm": _I64,
    "tsn": st.one_of(_ODD_TEXT, st.floats(allow_nan=False, allow_infinity=False)),
    "t": st.integers(-(10**12), 10**14),
    "tm": st.integers(-5, 10**10),
    "z": _ODD_TEXT,
}


@st.composite
def _after(draw: st.DrawFn, odd: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"id": draw(st.integers(0, 3)), "code": draw(st.sampled_from("ab"))}
    for f in COLUMNS:
        name = f["field"]
        values = st.one_of(_PLAIN[name], _ODD[name]) if odd else _PLAIN[name]
        row[name] = draw(st.one_of(st.none(), values))
    return row


@st.composite
def _records(draw: st.DrawFn) -> list[KafkaRecord]:
    composite = draw(st.booleans())
    key_fields = KEYS if composite else KEYS[:1]
    key_schema = _row_schema(key_fields, "srv.public.things.Key")
    schema = _envelope_schema([*KEYS, *COLUMNS])
    # Most ranges hold plain values only; the others each record at times.
    odd_range = draw(st.integers(0, 3)) == 0
    out = []
    for offset in range(draw(st.integers(1, 12))):
        after = draw(_after(odd_range and draw(st.booleans())))
        key = {f["field"]: after[f["field"]] for f in key_fields}
        k = orjson.dumps({"schema": key_schema, "payload": key})
        op = draw(st.sampled_from("cucurd"))
        payload = {
            "before": None,
            "after": None if op == "d" else after,
            "source": {"ts_ms": draw(st.one_of(st.none(), _I64)), "lsn": 5},
            "op": op,
            "ts_ms": 1,
        }
        v: bytes | None = orjson.dumps({"schema": schema, "payload": payload})
        if op == "d" and draw(st.booleans()):
            v = None  # a tombstone
        headers = _headers(draw(st.integers(0, 40)), draw(st.one_of(st.none(), st.integers(0, 3))))
        if draw(st.integers(0, 30)) == 0:
            headers.append((HEADER_UNCHANGED, b'["s"]'))
        if draw(st.integers(0, 10)) == 0:
            headers.insert(0, ("other", None))
        out.append(KafkaRecord(TOPIC, 0, offset, k, v, headers))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records())
def test_generated_records_give_the_python_paths_changes(records: list[KafkaRecord]) -> None:
    """Every column kind with values in and out of the converters' plain cases; keys of one
    and of two columns; repeated keys, deletes, tombstones; version headers with and without
    an order, unchanged columns, other headers."""
    event("native" if _same(records) else "python")


def test_the_generated_tables_plain_records_are_taken_natively() -> None:
    """The path the generated test compares is taken: a range of plain values."""
    after = {"id": 1, "code": "a", "s": "x", "n": 5, "f": 1.5, "b": True, "d2": _decimal(-12345)}
    after |= {"d0": _decimal(10**19), "day": 19_000, "ts": 1_700_000_000_123_456}
    after |= {"tsm": -1, "tsn": 1_700_000_000_000_000_001, "t": 3_600_000_001, "tm": 61_000}
    after |= {"z": "2024-01-01T00:00:00Z"}
    schema = _envelope_schema([*KEYS, *COLUMNS])
    key = orjson.dumps({"schema": _row_schema(KEYS[:1], "K"), "payload": {"id": 1}})
    payload = {"before": None, "after": after, "source": {"ts_ms": 7}, "op": "c"}
    value = orjson.dumps({"schema": schema, "payload": payload})
    records = [KafkaRecord(TOPIC, 0, 0, key, value, _headers(10, 0))]
    assert _same(records)
    (change,) = _native(records) or []
    assert change.doc is not None
    assert change.doc["d2"] == "-123.45" and change.doc["d0"] == "10000000000000000000"
    assert change.doc["day"] == "2022-01-08" and change.doc["tsm"] == "1969-12-31T23:59:59.999000"
    assert change.doc["t"] == "01:00:00.000001" and change.doc["tm"] == "00:01:01.000000"


# -- what the native path leaves to Python ----------------------------------------------------


def _one(value_json: bytes, key: bytes = b'{"id":1}') -> list[KafkaRecord]:
    """A plain record, then one of ``value_json`` (its payload) and ``key`` (the key's)."""
    schema = orjson.dumps(_envelope_schema([*KEYS[:1], *COLUMNS]))
    key_schema = b'{"schema":' + orjson.dumps(_row_schema(KEYS[:1], "K")) + b',"payload":'
    good = b'{"op":"c","after":{"id":1,"n":1},"source":{"ts_ms":1}}'
    value = b'{"schema":' + schema + b',"payload":'
    records = [
        KafkaRecord(TOPIC, 0, 0, key_schema + b'{"id":1}}', value + good + b"}", []),
        KafkaRecord(TOPIC, 0, 1, key_schema + key + b"}", value + value_json + b"}", []),
    ]
    return [r._replace(headers=_headers(5 + r.offset, 0)) for r in records]


@pytest.mark.parametrize(
    "value, key",
    [
        (b'{"op":"c","after":{"id":1,"n":-0},"source":{}}', b'{"id":1}'),  # orjson: int 0
        (b'{"op":"c","after":{"id":1,"n":1},"before":{"n":1e999}}', b'{"id":1}'),
        (b'{"op":"c","after":{"id":1,"s":"\\ud800"}}', b'{"id":1}'),  # a lone surrogate
        (b'{"op":"c","after":{"id":1,"n":1,"n":2}}', b'{"id":1}'),  # a column twice
        (b'{"op":"c","after":{"id":1,"s":[1]}}', b'{"id":1}'),  # an array
        (b'{"op":"c","after":{"id":1,"s":{"a":1}}}', b'{"id":1}'),  # an object
        (b'{"op":"t","after":null}', b'{"id":1}'),  # a truncate
        (b'{"op":5,"after":{"id":1}}', b'{"id":1}'),  # no Debezium event
        (b'{"op":"c","after":"text"}', b'{"id":1}'),
        (b'{"op":"c","after":{"id":1,"day":true}}', b'{"id":1}'),  # a bool is an int
        (b'{"op":"c","after":{"id":1,"day":9999999}}', b'{"id":1}'),  # after 9999-12-31
        (b'{"op":"c","after":{"id":1,"d2":"A"}}', b'{"id":1}'),  # no base64
        (b'{"op":"c","after":{"id":1,"s":"x"},"source":"\xff"}', b'{"id":1}'),  # not UTF-8
        (b'{"op":"c","after":{"id":1}}', b'{"id":1.5}'),  # a float key
        (b'{"op":"c","after":{"id":1}}', b"{}"),  # no key column
    ],
)
def test_a_range_with_a_record_the_native_path_is_unsure_of_goes_the_python_way(
    value: bytes, key: bytes
) -> None:
    records = _one(value, key)
    assert _native(records[:1]) is not None  # the good record alone is taken
    assert _native(records) is None
    _python(records)  # and the Python path reads them (its own rules say what they are)


def test_an_integer_beyond_64_bits_is_the_float_orjson_reads() -> None:
    assert _same(_one(b'{"op":"c","after":{"id":1,"n":123456789012345678901234567}}'))
    assert _same(_one(b'{"op":"c","after":{"id":1,"n":-18446744073709551617}}'))


def test_unchanged_columns_heartbeats_and_other_schemas_go_the_python_way() -> None:
    records = _one(b'{"op":"c","after":{"id":1,"n":2}}')
    assert _native(records) is not None
    unchanged = [
        records[0],
        records[1]._replace(headers=[*records[1].headers, (HEADER_UNCHANGED, b"[]")]),
    ]
    assert _native(unchanged) is None
    assert (
        native_range(RecordParser(PREFIX, BEATS), [r._replace(topic=BEATS) for r in records], BEATS)
        is None
    )
    other = orjson.dumps(_envelope_schema(KEYS[:1]))
    second = records[1]._replace(
        value=b'{"schema":' + other + b',"payload":{"op":"c","after":{"id":1}}}'
    )
    assert _native([records[0], second]) is None
    schemaless = records[0]._replace(value=b'{"op":"c","after":{"id":1}}')
    assert _native([schemaless]) is None


def test_every_converter_has_a_native_kind_or_keeps_its_table_python() -> None:
    """A converter added to spark_jobs.convert without a native kind would be skipped by
    the native path: each semantic name converted there has one, but VariableScaleDecimal,
    whose tables the native path leaves."""
    assert set(convert._BY_NAME) - set(convert._NATIVE_BY_NAME) == {
        "io.debezium.data.VariableScaleDecimal"
    }
    for name, (kind, per_second) in convert._NATIVE_BY_NAME.items():
        conv = convert._BY_NAME[name]
        one = {"date": 1, "timestamp": per_second, "time": per_second}[kind]
        assert conv(one) in {"1970-01-02", "1970-01-01T00:00:01", "00:00:01.000000"}, name
    variable = _field("v", "struct", "io.debezium.data.VariableScaleDecimal")
    assert convert.native_kinds(_row_schema([variable], "r")) is None


def test_a_key_of_two_columns_is_the_same_id_with_any_text() -> None:
    """sinks.base.key_id's JSON array, its strings as Python's json writes them."""
    schema = orjson.dumps(_envelope_schema([*KEYS, *COLUMNS]))
    key_schema = orjson.dumps(_row_schema(KEYS, "K"))
    records = []
    for n, code in enumerate(['a"b', "c\\d", "e\nf\tg", "\x01\x1f\x7f", "é✓𝄞", "", "null"]):
        key = orjson.dumps({"id": n - 3, "code": code})
        after = orjson.dumps({"id": n - 3, "code": code, "s": code})
        value = b'{"op":"c","after":' + after + b"}"
        records.append(
            KafkaRecord(
                TOPIC,
                0,
                n,
                b'{"schema":' + key_schema + b',"payload":' + key + b"}",
                b'{"schema":' + schema + b',"payload":' + value + b"}",
                _headers(n, 0),
            )
        )
    assert _same(records)
    assert [c.key for c in _native(records) or []][:2] == ['[-3,"a\\"b"]', '[-2,"c\\\\d"]']


@pytest.mark.parametrize(
    "odd",
    [
        _field("d", "bytes", "org.apache.kafka.connect.data.Decimal", scale="x"),
        {"type": "string", "optional": True},  # no field name
        "not a field",
    ],
)
def test_a_schema_the_converters_cannot_read_is_left_to_python_not_a_stop(odd: Any) -> None:
    """A value schema the native path cannot read goes the Python way, which dead-letters
    the changes its converters cannot decode and applies the others, instead of failing the
    task (which would stop the job at that range for good)."""
    schema = orjson.dumps(_envelope_schema([*KEYS[:1], odd]))
    key = b'{"schema":' + orjson.dumps(_row_schema(KEYS[:1], "K")) + b',"payload":{"id":1}}'
    value = b'{"op":"c","after":{"id":1,"d":"AQ=="}}'
    records = [
        KafkaRecord(
            TOPIC, 0, 0, key, b'{"schema":' + schema + b',"payload":' + value + b"}", _headers(5, 0)
        )
    ]
    assert _native(records) is None
    changes, others = _python(records)
    if isinstance(odd, dict) and "name" not in odd:  # nothing to convert: applied as it is
        assert [c.key for c in changes] == ["1"] and others == []
    else:  # the converters cannot be made: the change is refused
        assert changes == [] and len(others) == 1
        assert others[0].startswith("refused: cannot decode")


def test_a_document_comes_rendered_as_the_followers_write_it() -> None:
    """Every kind the native path converts, escapes and non-ASCII text among them, with the
    columns in table order (not sorted: the digest sorts them), and floats in each of
    orjson's layouts: rendered, and rendered as the followers would write it."""
    after = {
        "id": 7,
        "s": 'a "quoted" \\ é \u2028 \x01 tab\t{}',
        "n": -(2**63),
        "b": True,
        "d2": base64.b64encode((12345).to_bytes(2, "big", signed=True)).decode(),
        "d0": base64.b64encode((-5).to_bytes(1, "big", signed=True)).decode(),
        "day": 19000,
        "ts": 1_700_000_000_123_456,
        "tsm": 1_700_000_000_123,
        "tsn": 1_700_000_000_123_456_789,
        "t": 45_296_000_001,
        "tm": 45_296_001,
        "z": "2026-11-30T12:00:00Z",
        "f": None,
    }
    floats = [1.5, 100.0, 1e16, 1e15, 1e-5, 1e-6, 1.5e-7, 5e-324, 1.7976931348623157e308, -2e16]
    for f in [None, *floats]:
        value = orjson.dumps({"op": "c", "after": {**after, "f": f}, "source": {"ts_ms": 3}})
        records = _one(value, b'{"id":7}')
        assert _same(records)
        (_, change) = _native(records) or []
        assert change.rendered is not None
        assert list(change.doc or {}) == list(after)
