"""How a task's rows reach Python (Arrow batches into dicts) and its stats come back.

The pure tests build Arrow batches by hand; the ``spark`` ones check that the rows equal the
old path's (``DataFrame.rdd``: pickled Rows) for the same Kafka records, and that a batch
applied through ``mapInArrow`` brings its stats and a follower outage back to the driver.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from pgcdc.core.settings import Settings
from sinks.base import ApplyResult, Change, Outcome
from spark_jobs.reduce import latest_per_key
from spark_jobs.stats import BatchStats
from spark_jobs.transfer import (
    SCHEMA_COLUMN,
    binary_array,
    rows_from_arrow,
    stats_batch,
    stats_from_rows,
)
from spark_jobs.transforms import CHANGE, DEAD, NOT_DEBEZIUM, SCHEMA

# The classified frame's columns (spark_jobs.transforms.classify) as Spark sends them.
CLASSIFIED = pa.schema(
    [
        ("kind", pa.string()),
        ("topic", pa.string()),
        ("table", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key_json", pa.string()),
        ("is_delete", pa.bool_()),
        ("op", pa.string()),
        ("after_json", pa.string()),
        ("unchanged", pa.string()),
        ("schema_id", pa.int64()),
        ("value_schema_json", pa.string()),
        ("commit_lsn", pa.int64()),
        ("tx_order", pa.int64()),
        ("source_ts_ms", pa.int64()),
        ("heartbeat_lsn", pa.int64()),
        ("parse_error", pa.string()),
        ("raw_value", pa.string()),
    ]
)


def _schema_text(n: int) -> str:
    return orjson.dumps({"type": "struct", "fields": [], "name": f"s{n}"}).decode()


def _record(offset: int, topic: str = "shop.public.items", sid: int = 1, **values: Any) -> dict:
    row: dict[str, Any] = dict.fromkeys(CLASSIFIED.names)
    row.update(
        kind=CHANGE,
        topic=topic,
        table=topic.split(".", 1)[1],
        partition=0,
        offset=offset,
        key_json=orjson.dumps({"id": offset}).decode(),
        is_delete=False,
        op="c",
        after_json=orjson.dumps({"id": offset}).decode(),
        schema_id=sid,
        value_schema_json=_schema_text(sid),
        commit_lsn=100 + offset,
        tx_order=0,
    )
    row.update(values)
    return row


def _batches(records: list[dict], size: int) -> list[pa.RecordBatch]:
    return [
        pa.RecordBatch.from_pylist(records[i : i + size], schema=CLASSIFIED)
        for i in range(0, len(records), size)
    ]


@pytest.mark.unit
def test_each_schema_reaches_python_once_per_topic_and_id_across_batches() -> None:
    other = "shop.public.orders"
    records = [
        _record(0),
        _record(1),
        _record(2, sid=2),
        _record(3, topic=other),  # the same id on another topic: its own first row
        _record(4),
        _record(5, sid=2),
        _record(6, topic=other),
    ]
    rows = list(rows_from_arrow(_batches(records, 2)))  # 4 batches: firsts span them
    got = [(r["topic"], r["schema_id"], r["value_schema_json"]) for r in rows]
    assert got == [
        ("shop.public.items", 1, _schema_text(1)),
        ("shop.public.items", 1, None),
        ("shop.public.items", 2, _schema_text(2)),
        (other, 1, _schema_text(1)),
        ("shop.public.items", 1, None),
        ("shop.public.items", 2, None),
        (other, 1, None),
    ]
    # Everything else as it was sent.
    for row, record in zip(rows, records, strict=True):
        assert {k: v for k, v in row.items() if k != "value_schema_json"} == {
            k: v for k, v in record.items() if k != "value_schema_json"
        }


@pytest.mark.unit
def test_values_nulls_big_ints_and_unicode_come_through_as_python_values() -> None:
    text = 'naïve ☃ 𝄞 \u200d 中文 \\"quoted"'
    records = [
        _record(0, commit_lsn=2**63 - 1, tx_order=2**62, source_ts_ms=-1, heartbeat_lsn=0),
        _record(1, after_json=orjson.dumps({"id": 1, "t": text}).decode(), unchanged="t,u"),
        _record(2, is_delete=True, op="d", after_json=None, commit_lsn=None, tx_order=None),
        _record(
            3,
            kind=DEAD,
            key_json=None,
            op=None,
            after_json=None,
            raw_value="\x00\xffnot json " + text,
            parse_error=NOT_DEBEZIUM,
            value_schema_json=None,
            schema_id=42,  # what Spark's xxhash64 gives a null schema
        ),
        _record(4, kind="heartbeat", heartbeat_lsn=2**63 - 2, value_schema_json=None, sid=42),
    ]
    rows = list(rows_from_arrow(_batches(records, 10)))
    # The schema text only at the first row of (topic, id 1).
    assert rows == [
        {**r, "value_schema_json": None} if i in (1, 2) else r for i, r in enumerate(records)
    ]
    assert type(rows[0]["commit_lsn"]) is int and type(rows[0]["is_delete"]) is bool


@pytest.mark.unit
def test_text_that_is_not_utf8_becomes_replacement_characters_not_a_failed_task() -> None:
    """Spark's strings are bytes: a Kafka value cast to a string keeps bytes that are no
    UTF-8, and Arrow hands them over as they are (pyarrow refuses to decode them)."""
    records = [_record(0, kind=DEAD, parse_error=NOT_DEBEZIUM), _record(1), _record(2)]
    batch = pa.RecordBatch.from_pylist(records, schema=CLASSIFIED)
    raw = pa.array([b"\x00\xffnot json \xe2\x98", None, b"ok"], pa.binary()).view(pa.string())
    schemas = pa.array([b"{\xfe}", b"{}", b"{}"], pa.binary()).view(pa.string())
    batch = batch.set_column(CLASSIFIED.get_field_index("raw_value"), "raw_value", raw)
    at = CLASSIFIED.get_field_index(SCHEMA_COLUMN)
    batch = batch.set_column(at, SCHEMA_COLUMN, schemas)
    with pytest.raises(UnicodeDecodeError):
        raw.to_pylist()
    rows = list(rows_from_arrow([batch]))
    assert [r["raw_value"] for r in rows] == ["\x00\ufffdnot json \ufffd", None, "ok"]
    assert [r[SCHEMA_COLUMN] for r in rows] == ["{\ufffd}", "{}", None]
    assert rows[1]["after_json"] == '{"id":1}'


@pytest.mark.unit
def test_a_dead_record_first_of_its_id_does_not_stand_for_the_others() -> None:
    """A record Spark could not read but the task can (spark_jobs.reduce.reparse) gets a
    schema of its own: the live rows of the id it came with still register theirs."""
    event = {"schema": {"type": "struct", "fields": [], "name": "own"}, "payload": {"op": "c"}}
    event["payload"]["after"] = {"id": 0}
    dead = _record(
        0,
        kind=DEAD,
        parse_error=NOT_DEBEZIUM,
        raw_value=orjson.dumps(event).decode(),
        after_json=None,
        op=None,
    )
    records = [dead, _record(1), _record(2), _record(3, kind=DEAD, parse_error="bad header")]
    rows = list(rows_from_arrow(_batches(records, 10)))
    assert [r["value_schema_json"] is not None for r in rows] == [True, True, False, True]
    reduced = latest_per_key(rows)
    schemas = {
        (r["topic"], r["schema_id"]): r["schema_json"] for r in reduced if r["kind"] == SCHEMA
    }
    assert schemas[("shop.public.items", 1)] == _schema_text(1)
    assert len(schemas) == 2  # and the reparsed record's own
    assert sum(r["kind"] == CHANGE for r in reduced) == 3


@pytest.mark.unit
def test_stats_travel_pickled_one_row_each() -> None:
    sent = [
        BatchStats(applied=3, max_commit_lsn=2**63 - 1, keyless_tables={"public.log"}),
        BatchStats(dead_lettered=1, heartbeat_lsn=7),
    ]
    batch = stats_batch(sent)
    assert batch.num_rows == 2 and batch.schema.names == ["stats"]
    assert stats_from_rows(batch.to_pylist()) == sent
    with pytest.raises(TypeError, match="not BatchStats"):
        stats_from_rows([{"stats": pickle.dumps({"applied": 1})}])
    assert stats_batch([]).num_rows == 0
    assert binary_array([b"", b"ab", b"\x00"]).to_pylist() == [b"", b"ab", b"\x00"]


@pytest.mark.unit
def test_a_tasks_answer_does_not_import_pandas() -> None:
    """pyarrow's conversion of Python lists imports pandas (0.28 s of CPU in each worker);
    the task's answer is made without it."""
    code = (
        "import sys\n"
        "from spark_jobs.stats import BatchStats\n"
        "from spark_jobs.transfer import stats_batch\n"
        "stats_batch([BatchStats(applied=1)])\n"
        "assert 'pandas' not in sys.modules, 'pandas imported'\n"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )


# -- through Spark ---------------------------------------------------------------------


class CountingSink:
    """Applies every change (``v`` = "retry": answers that the follower is unreachable)."""

    @classmethod
    def make(cls, settings: Settings) -> CountingSink:
        return cls()

    def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
        out = []
        for c in changes:
            retry = (c.doc or {}).get("v") == "retry"
            outcome = Outcome.FAILED if retry else Outcome.APPLIED
            out.append(ApplyResult.of(c, outcome, "down" if retry else "", retryable=retry))
        return out

    def register_schema(
        self, table: str, value_schema: Mapping[str, Any], since_lsn: int | None = None
    ) -> None:
        pass

    def record_watermark(self, job: str, lsn: int) -> None:
        pass

    def read_watermark(self, job: str) -> int | None:
        return None

    def close(self) -> None:
        pass


def _classified(spark: Any, records: list[tuple[Any, ...]]) -> Any:
    from spark_jobs.transforms import classify, parse_events
    from tests.unit.test_spark_transforms import PREFIX, _frame

    heartbeats = "__cdc-heartbeat.shop"
    return classify(parse_events(_frame(spark, records), PREFIX, heartbeat_topic=heartbeats))


def _kafka_records() -> list[tuple[Any, ...]]:
    from pgcdc.core.contract import HEADER_COMMIT_LSN
    from tests.unit.test_spark_transforms import _event, _headers, _key

    text = "naïve ☃ 𝄞 中文"
    return [
        (_key(1), _event("c", {"id": 1, "v": text}, 100), _headers(2**63 - 1, 0)),
        (_key(1), _event("u", {"id": 1, "v": None}, 110), _headers(200, 1)),
        (_key(2), _event("c", {"id": 2, "v": "x"}, 120, schemas=False), _headers(300, 0)),
        (_key(3), _event("d", None, 140), _headers(400, 0)),
        (_key(3), None, _headers(400, 0)),  # a tombstone
        (_key(4), b"\x00\xffnot json " + text.encode(), []),
        (_key(5), _event("c", {"id": 5}, 1), [(HEADER_COMMIT_LSN, b"zz")]),
        (_key(6), _event("c", {"id": 6}, 1), [(HEADER_COMMIT_LSN, str(2**64).encode())]),
        (b'{"serverName":"shop"}', b'{"ts_ms":1,"lsn":900}', [], "__cdc-heartbeat.shop"),
        *[
            (_key(k), _event("u", {"id": k, "v": "y"}, 200 + k), _headers(500 + k, 0))
            for k in range(7, 20)
        ],
    ]


@pytest.mark.spark
def test_arrow_rows_equal_the_pickled_rows_of_the_same_records(spark: Any) -> None:
    from pyspark import TaskContext

    events = _classified(spark, _kafka_records())  # local[2]: two partitions
    by_rdd = [[r.asDict() for r in part] for part in events.rdd.glom().collect()]

    def task(batches: Any) -> Any:
        rows = list(rows_from_arrow(batches))
        part = TaskContext.get().partitionId()  # type: ignore[union-attr]
        out = pa.schema([("part", pa.int32()), ("rows", pa.binary())])
        yield pa.RecordBatch.from_pylist([{"part": part, "rows": pickle.dumps(rows)}], out)

    before = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "3")  # several per task
    try:
        got = events.mapInArrow(task, "part int, rows binary").collect()
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", before)
    by_arrow: list[list[dict[str, Any]]] = [[] for _ in by_rdd]
    for row in got:
        by_arrow[row["part"]] = pickle.loads(row["rows"])

    assert sum(len(p) for p in by_arrow) == len(_kafka_records()) and all(by_arrow)
    for arrow_part, rdd_part in zip(by_arrow, by_rdd, strict=True):
        seen = set()
        assert len(arrow_part) == len(rdd_part)
        for a, r in zip(arrow_part, rdd_part, strict=True):
            sid = (r["topic"], r["schema_id"])
            first = r["kind"] == DEAD or sid not in seen
            seen.add(sid)
            assert a == {**r, "value_schema_json": r["value_schema_json"] if first else None}
        # And the reduction is the same.
        assert latest_per_key(arrow_part) == latest_per_key(rdd_part)
    kinds = sorted(r["kind"] for p in by_arrow for r in p)
    assert kinds.count(DEAD) == 2 and "heartbeat" in kinds
    assert any(r["commit_lsn"] == 2**63 - 1 for p in by_arrow for r in p)


@pytest.mark.spark
def test_a_batch_through_map_in_arrow_brings_its_stats_and_outages_back(spark: Any) -> None:
    from pgcdc.core.errors import RetryableSinkError
    from pgcdc.core.settings import load_settings
    from pgcdc.core.spark_settings import ParsePath, ReadPath
    from spark_jobs.apply_loop import ApplyBatch
    from spark_jobs.options import JobOptions
    from tests.unit.test_spark_transforms import _event, _headers, _key

    opts = JobOptions(
        name="transfer-test",
        heartbeat_topic="__cdc-heartbeat.shop",
        topics=(),
        topic_pattern="x",
        starting_offsets="earliest",
        checkpoint="/tmp/x",
        available_now=False,
        trigger_interval="1 second",
        max_offsets_per_trigger=None,
    )
    # Spark's read, whatever the run's CDC_SPARK__READ: the frame here is of records.
    spark_settings = {"follower_retry_s": 0, "parse": ParsePath.JVM, "read": ReadPath.SPARK}
    settings = load_settings().model_copy(
        update={"spark": load_settings().spark.model_copy(update=spark_settings)}
    )
    batch = ApplyBatch(settings, opts, CountingSink.make)
    records = [
        *[(_key(k), _event("c", {"id": k}, 100 + k), _headers(1000 + k, 0)) for k in range(9)],
        (_key(1), _event("u", {"id": 1}, 200), _headers(2000, 0)),
        (b'{"serverName":"shop"}', b'{"ts_ms":1,"lsn":900}', [], "__cdc-heartbeat.shop"),
    ]
    done = batch._apply(_classified(spark, records).repartition(3, "key_json"), 0, batch.followers)
    total = done["transfer-test"]  # the three tasks' stats, summed
    assert (total.applied, total.max_commit_lsn, total.heartbeat_lsn) == (9, 2000, 900)

    records.append((_key(99), _event("c", {"id": 99, "v": "retry"}, 1), _headers(3000, 0)))
    with pytest.raises(RetryableSinkError) as failed:
        batch._apply(_classified(spark, records), 1, batch.followers)
    assert "transfer-test" in str(failed.value) and "down" in str(failed.value)


def test_kafka_records_come_through_as_bytes_with_their_headers() -> None:
    """The python parse's input (spark.parse = "python"): the source's columns as they are,
    headers per record in order, null lists and values kept, across sliced batches."""
    from spark_jobs.parse import KafkaRecord
    from spark_jobs.transfer import records_from_arrow

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    schema = pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us")),
            ("headers", pa.list_(header)),
        ]
    )
    headers = [
        [{"key": "cdc.commit_lsn", "value": b"10"}, {"key": "cdc.order", "value": b"2"}],
        None,
        [],
        [{"key": "cdc.unchanged", "value": None}],
        [{"key": "a", "value": b"\xff"}],
    ]
    n = len(headers)
    table = pa.Table.from_pydict(
        {
            "key": [b'{"id":1}', None, b"k", b"\xfe", b"x"],
            "value": [b"{}", b"v", None, b"w", b"\x00" * 3],
            "topic": ["t"] * n,
            "partition": [0, 1, 2, 3, 4],
            "offset": [10, 11, 12, 13, 14],
            "timestamp": [None] * n,
            "headers": headers,
        },
        schema,
    )
    batches = [table.slice(0, 2).to_batches()[0], table.slice(2).to_batches()[0]]
    got = list(records_from_arrow(batches))
    assert got == [
        KafkaRecord(
            "t", 0, 10, b'{"id":1}', b"{}", [("cdc.commit_lsn", b"10"), ("cdc.order", b"2")]
        ),
        KafkaRecord("t", 1, 11, None, b"v", None),
        KafkaRecord("t", 2, 12, b"k", None, []),
        KafkaRecord("t", 3, 13, b"\xfe", b"w", [("cdc.unchanged", None)]),
        KafkaRecord("t", 4, 14, b"x", b"\x00" * 3, [("a", b"\xff")]),
    ]
