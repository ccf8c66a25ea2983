"""The sync jobs' DataFrame steps on a static frame shaped like the Kafka source's output.

The parse tests run on both paths (``spark.parse``): ``jvm``, Spark SQL's ``from_json``
(:mod:`spark_jobs.transforms`), and ``python``, the raw records over Arrow parsed in the task
(:mod:`spark_jobs.parse`), as the jobs run each.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

import orjson
import pytest

from pgcdc.core.contract import Headers, VersionOrder

pytestmark = [pytest.mark.spark]

PREFIX = "shop"
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "headers array<struct<key:string,value:binary>>"
)


def _event(op: str, row: dict[str, Any] | None, lsn: int, schemas: bool = True) -> bytes:
    payload = {
        "before": None,
        "after": row,
        "source": {"schema": "public", "table": "items", "lsn": lsn, "txId": 7, "ts_ms": 1},
        "op": op,
        "ts_ms": 2,
    }
    body = {"schema": {"type": "struct", "fields": []}, "payload": payload} if schemas else payload
    return orjson.dumps(body)


def _key(i: int) -> bytes:
    return orjson.dumps({"schema": {"type": "struct"}, "payload": {"id": i}})


def _headers(commit_lsn: int, order: int) -> Headers:
    return VersionOrder(commit_lsn, order).headers()


@pytest.fixture(params=["jvm", "python"])
def parse(request: pytest.FixtureRequest) -> str:
    """The parse path (``spark.parse``) a test runs on."""
    return str(request.param)


def _python_rows(raw: Any, heartbeat_topic: str | None) -> Any:
    """The frame's records parsed in its tasks as the ``python`` path does: one list of
    classified rows per Spark partition."""
    import pickle

    import pyarrow as pa

    from spark_jobs.parse import RecordParser
    from spark_jobs.transfer import RECORD_COLUMNS, records_from_arrow

    def task(batches: Any) -> Any:
        rows = list(RecordParser(PREFIX, heartbeat_topic).rows(records_from_arrow(batches)))
        out = pa.schema([("rows", pa.binary())])
        yield pa.RecordBatch.from_pylist([{"rows": pickle.dumps(rows)}], out)

    got = raw.select(*RECORD_COLUMNS).mapInArrow(task, "rows binary").collect()
    return [pickle.loads(r["rows"]) for r in got]


def classified(df: Any, parse: str, heartbeat_topic: str | None = None) -> list[dict[str, Any]]:
    """The classified rows of the Kafka-shaped frame ``df`` on parse path ``parse``."""
    if parse == "python":
        return [row for part in _python_rows(df, heartbeat_topic) for row in part]
    from spark_jobs.transforms import classify, parse_events

    events = classify(parse_events(df, PREFIX, heartbeat_topic=heartbeat_topic))
    return [r.asDict() for r in events.collect()]


def _image(row: dict[str, Any]) -> Any:
    """A row's ``after`` image: kept parsed by the ``python`` path, JSON text on ``jvm``."""
    return row.get("after") or orjson.loads(row["after_json"])


def _frame(spark: Any, records: list[tuple[Any, ...]]) -> Any:
    now = dt.datetime(2024, 1, 1)
    rows = [
        (rec[0], rec[1], rec[3] if len(rec) > 3 else f"{PREFIX}.public.items", 0, off, now, rec[2])
        for off, rec in enumerate(records)
    ]
    return spark.createDataFrame(rows, KAFKA_SCHEMA)


def test_parse_then_reduce_keeps_the_newest_event_per_key(spark: Any, parse: str) -> None:
    from spark_jobs.reduce import latest_per_key
    from spark_jobs.transforms import classify, parse_events

    df = _frame(
        spark,
        [
            (_key(1), _event("c", {"id": 1, "v": "a"}, 100), _headers(200, 0)),
            # Same transaction, later position: wins over order 0.
            (_key(1), _event("u", {"id": 1, "v": "b"}, 110), _headers(200, 1)),
            # Committed earlier but appearing later must not win (a replay or reordering).
            (_key(1), _event("u", {"id": 1, "v": "stale"}, 90), _headers(150, 0)),
            (_key(2), _event("c", {"id": 2, "v": "x"}, 120, schemas=False), _headers(300, 0)),
            (_key(3), _event("c", {"id": 3, "v": "y"}, 130), _headers(300, 1)),
            (_key(3), _event("d", None, 140), _headers(400, 0)),
            (_key(3), None, _headers(400, 0)),  # the tombstone after the delete
            (_key(4), b"not json at all", []),
            (b'{"serverName":"shop"}', b'{"ts_ms":1,"lsn":500}', [], "__cdc-heartbeat.shop"),
            (b'{"serverName":"shop"}', b'{"ts_ms":2,"lsn":900}', [], "__cdc-heartbeat.shop"),
        ],
    )
    rows = latest_per_key(classified(df, parse, heartbeat_topic="__cdc-heartbeat.shop"))
    changes = {orjson.loads(r["key_json"])["id"]: r for r in rows if r["kind"] == "change"}
    assert set(changes) == {1, 2, 3}
    assert _image(changes[1]) == {"id": 1, "v": "b"}
    assert (changes[1]["commit_lsn"], changes[1]["tx_order"]) == (200, 1)
    assert _image(changes[2]) == {"id": 2, "v": "x"}
    assert changes[3]["is_delete"] is True
    assert all(r["table"] == "public.items" for r in changes.values())

    dead = [r for r in rows if r["kind"] == "dead"]
    assert [(orjson.loads(d["key_json"])["id"], d["parse_error"]) for d in dead] == [
        (4, "value is not a Debezium event")
    ]
    assert dead[0]["raw_value"] == "not json at all"
    beats = sorted(r["heartbeat_lsn"] for r in rows if r["kind"] == "heartbeat")
    assert beats == [500, 900]
    # Every event of the batch had the same schema: it comes once, and changes name it by id.
    (schema,) = [r for r in rows if r["kind"] == "schema"]
    assert orjson.loads(schema["schema_json"]) == {"type": "struct", "fields": []}
    assert changes[1]["schema_id"] == schema["schema_id"]
    assert len(rows) == 3 + 1 + 2 + 1
    # No shuffle: the frame the tasks reduce is the source's own partitioning.
    events = classify(parse_events(df, PREFIX)) if parse == "jvm" else df
    assert "Exchange" not in events._jdf.queryExecution().executedPlan().toString()


def test_topic_pattern_matches_table_topics_only() -> None:
    import re

    from pgcdc.core.contract import table_topic_pattern as topic_pattern

    pat = re.compile(topic_pattern("shop"))
    assert pat.fullmatch("shop.public.items")
    assert not pat.fullmatch("shop.dlq")
    assert not pat.fullmatch("shopx.public.items")
    assert not pat.fullmatch("shop.__cdc_state")


def test_unchanged_toast_is_filled_from_an_older_event_of_the_same_batch(
    spark: Any, parse: str
) -> None:
    from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER as PLACEHOLDER
    from spark_jobs.changes import ChangeBuilder
    from spark_jobs.reduce import latest_per_key

    big = "x" * 9000
    df = _frame(
        spark,
        [
            (_key(5), _event("c", {"id": 5, "body": big, "n": 1}, 100), _headers(200, 0)),
            (_key(5), _event("u", {"id": 5, "body": PLACEHOLDER, "n": 2}, 110), _headers(300, 0)),
            (_key(6), _event("u", {"id": 6, "body": PLACEHOLDER, "n": 3}, 120), _headers(300, 1)),
        ],
    )
    rows = {
        orjson.loads(r["key_json"])["id"]: r
        for r in latest_per_key(classified(df, parse))
        if r["kind"] == "change"
    }
    build = ChangeBuilder()
    five = build(rows[5])
    assert five.doc == {"id": 5, "body": big, "n": 2}
    assert five.unchanged == frozenset()
    assert (five.commit_lsn, five.order) == (300, 0)
    # Nothing older in the batch: the follower must keep what it holds.
    six = build(rows[6])
    assert six.doc == {"id": 6, "n": 3} and six.unchanged == frozenset({"body"})


def test_keyless_records_truncates_and_headers(spark: Any, parse: str) -> None:
    from pgcdc.core.contract import HEADER_COMMIT_LSN, HEADER_ORDER, HEADER_UNCHANGED
    from spark_jobs.reduce import latest_per_key

    log = f"{PREFIX}.public.log"
    df = _frame(
        spark,
        [
            # A keyless table: its events and its delete's tombstone have a null key.
            (None, _event("c", {"n": 1}, 100), _headers(200, 0), log),
            (None, _event("c", {"n": 1}, 100), _headers(200, 1), log),
            (None, None, _headers(200, 2), log),
            (None, _event("t", None, 100), _headers(300, 0), log),
            # Our reader names the unchanged columns in a header, whatever their value.
            (
                _key(1),
                _event("u", {"id": 1, "n": None}, 1),
                [*_headers(400, 0), (HEADER_UNCHANGED, b"n")],
            ),
            (
                _key(2),
                _event("c", {"id": 2}, 1),
                [(HEADER_COMMIT_LSN, b"zz"), (HEADER_ORDER, b"0")],
            ),
            (_key(3), _event("c", {"id": 3}, 1), [(HEADER_COMMIT_LSN, str(2**64).encode())]),
        ],
    )
    rows = latest_per_key(classified(df, parse))
    kinds = sorted(r["kind"] for r in rows if r["kind"] != "schema")
    assert kinds == ["change", "change", "dead", "keyless", "keyless", "keyless", "truncate"]
    assert {r["table"] for r in rows if r["kind"] == "keyless"} == {"public.log"}
    changes = {orjson.loads(r["key_json"])["id"]: r for r in rows if r["kind"] == "change"}
    assert changes[1]["unchanged"] == "n" and changes[1]["op"] == "u"
    assert changes[1]["commit_lsn"] == 400
    # Beyond a long: null, for the change builder to stop on; not a number: dead-lettered.
    assert changes[3]["commit_lsn"] is None
    (dead,) = [r for r in rows if r["kind"] == "dead"]
    assert dead["parse_error"] == f"the {HEADER_COMMIT_LSN} header is no LSN"
    assert dead["raw_value"] is not None


def test_spread_by_key_puts_every_event_of_a_key_in_one_task(spark: Any, parse: str) -> None:
    """With --min-partitions the batch is hash-partitioned by (topic, key): each task still
    holds every event of its keys, so the per-task reduction keeps the newest."""
    from spark_jobs.reduce import latest_per_key
    from spark_jobs.transforms import by_key, classify, parse_events

    records = [
        (_key(k), _event("u", {"id": k, "v": n}, 100 + n), _headers(1000 + 10 * n + k, 0))
        for n in range(5)
        for k in range(12)
    ]
    if parse == "jvm":
        events = by_key(classify(parse_events(_frame(spark, records), PREFIX)), 4)
        parts = events.rdd.glom().collect()
    else:  # the raw records are spread by their key bytes, then parsed in the task
        parts = _python_rows(by_key(_frame(spark, records), 4, key="key"), None)
    assert len(parts) == 4 and sum(1 for p in parts if p) > 1  # spread, not funnelled
    keys_per_task = [{r["key_json"] for r in p} for p in parts]
    for i, a in enumerate(keys_per_task):
        for b in keys_per_task[i + 1 :]:
            assert not a & b
    newest = {
        orjson.loads(r["key_json"])["id"]: _image(r)["v"]
        for p in parts
        for r in latest_per_key(p)
        if r["kind"] == "change"
    }
    assert newest == dict.fromkeys(range(12), 4)


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    """A classified row as both paths must agree on it: JSON text compared as JSON (and
    with the image the ``python`` path keeps parsed), the
    schema by its text (ids are each path's own; the text is carried once per id on the
    ``python`` path, so it is compared per distinct schema), and ``is_delete`` where it is
    read (a change)."""
    drop = ("schema_id", "value_schema_json", "after")
    out = {k: v for k, v in row.items() if k not in drop}
    for field in ("key_json", "after_json"):
        with contextlib.suppress(orjson.JSONDecodeError, TypeError):
            out[field] = orjson.loads(out[field])
    if row.get("after") is not None:  # the python parse keeps an object image parsed
        out["after_json"] = row["after"]
    if out["kind"] != "change":
        out["is_delete"] = None
    return out


def test_both_parse_paths_give_the_same_rows(spark: Any) -> None:
    """The ``python`` parse gives the rows Spark SQL's gives, record for record, on records
    as the reader writes them and on the poison corpus."""
    from pgcdc.core.contract import HEADER_UNCHANGED
    from tests.unit.test_spark_transfer import _kafka_records

    log = f"{PREFIX}.public.log"
    records = [
        *_kafka_records(),
        (b"{not json", _event("c", {"id": 1}, 1), _headers(600, 0)),
        (b"42", _event("c", {"id": 42}, 1), _headers(600, 1)),
        (_key(30), _event("c", None, 1), _headers(600, 2)),
        (b'{"payload":{"id":"\xff"}}', _event("c", {"id": 31}, 1), _headers(600, 3)),
        (_key(32), _event("u", {"id": 32, "n": None}, 5), [(HEADER_UNCHANGED, b"n")]),
        (
            _key(33),
            _event("c", {"id": 33, "q": 0}, 7, schemas=False).replace(b":0}", b":%d}" % 2**70),
            [],
        ),
        (_key(34), b'{"payload": "text"}', []),
        (_key(35), b"[1, 2]", []),
        (None, _event("c", {"n": 1}, 100), _headers(700, 0), log),
        (None, None, _headers(700, 1), log),
        (None, _event("t", None, 100), _headers(800, 0), log),
        (_key(36), _event("d", None, 9), []),
    ]
    df = _frame(spark, records)
    heartbeats = "__cdc-heartbeat.shop"
    jvm, python = (
        sorted(classified(df, parse, heartbeats), key=lambda r: (r["topic"], r["offset"]))
        for parse in ("jvm", "python")
    )
    assert [_comparable(r) for r in python] == [_comparable(r) for r in jvm]
    assert {r["kind"] for r in jvm} == {"change", "dead", "heartbeat", "keyless", "truncate"}

    def schemas(rows: list[dict[str, Any]]) -> set[str]:
        return {r["value_schema_json"] for r in rows if r["value_schema_json"] is not None}

    assert {orjson.dumps(orjson.loads(s)) for s in schemas(python)} == {
        orjson.dumps(orjson.loads(s)) for s in schemas(jvm)
    }
