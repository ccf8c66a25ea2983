"""The per-partition apply of the sync jobs, on rows shaped like the reduced frame's, with a
sink that records what it is given (no Spark session, no servers)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
import pytest
from pyspark.sql import Row

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER
from pgcdc.core.errors import SinkError
from pgcdc.core.settings import Settings, load_settings
from sinks.base import ApplyResult, Change, Outcome, WholeDocument
from spark_jobs import apply_loop, dead_letter

pytestmark = pytest.mark.unit

FIELDS = [
    "kind",
    "topic",
    "table",
    "partition",
    "offset",
    "key_json",
    "is_delete",
    "op",
    "after_json",
    "unchanged",
    "schema_id",
    "schema_json",
    "commit_lsn",
    "tx_order",
    "history",
    "heartbeat_lsn",
    "parse_error",
    "raw_value",
    "source_ts_ms",
]
SCHEMA = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": []}]}


def _row(kind: str, **values: Any) -> Row:
    base: dict[str, Any] = dict.fromkeys(FIELDS)
    base.update(kind=kind, topic="shop.public.items", table="public.items", partition=0)
    base.update(values)
    return Row(**base)


def _change(key: int, after: dict[str, Any] | None, lsn: int, **values: Any) -> Row:
    return _row(
        "change",
        key_json=orjson.dumps({"id": key}).decode(),
        is_delete=after is None,
        after_json=None if after is None else orjson.dumps(after).decode(),
        schema_id=1,
        commit_lsn=lsn,
        tx_order=0,
        **values,
    )


class RecordingSink:
    """Answers each change with the outcome its ``v`` column names."""

    def __init__(self) -> None:
        self.batches: list[list[Change]] = []
        self.schemas: list[tuple[str, Mapping[str, Any]]] = []
        self.closed = False

    def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
        self.batches.append(list(changes))
        out = []
        for c in changes:
            v = (c.doc or {}).get("v", "applied")
            outcome = Outcome.FAILED if v.startswith("failed") else Outcome(v)
            out.append(ApplyResult.of(c, outcome, v, retryable=v == "failed-retry"))
        return out

    def register_schema(
        self, table: str, value_schema: Mapping[str, Any], since_lsn: int | None = None
    ) -> None:
        self.schemas.append((table, value_schema))

    def record_watermark(self, job: str, lsn: int) -> None:
        raise AssertionError("the driver records watermarks, not a partition")

    def read_watermark(self, job: str) -> int | None:
        return None

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    s = RecordingSink()
    yield s
    apply_loop._SINKS.clear()


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[dead_letter.DeadLetter]:
    out: list[dead_letter.DeadLetter] = []

    def publish(settings: Settings, job: str, records: list[dead_letter.DeadLetter]) -> int:
        out.extend(records)
        return len(records)

    monkeypatch.setattr(dead_letter, "publish", publish)
    return out


def _one(sink: RecordingSink) -> list[apply_loop.Follower]:
    return [apply_loop.Follower("job", lambda _s: sink)]


def _apply(sink: RecordingSink, rows: list[Row]) -> apply_loop.BatchStats:
    (stats,) = apply_loop.apply_partition(load_settings(), _one(sink), rows)
    return stats


def test_changes_heartbeats_and_refusals(
    sink: RecordingSink, published: list[dead_letter.DeadLetter]
) -> None:
    rows = [
        _change(1, {"v": "applied"}, 100),
        _change(2, {"v": "skipped"}, 300),
        _change(3, {"v": "failed: mapping"}, 200, offset=5),
        _row("heartbeat", heartbeat_lsn=250),
        _row("heartbeat", heartbeat_lsn=None),
        _row("dead", offset=7, key_json='{"id":4}', raw_value="junk", parse_error="bad"),
        # Debezium's t event: the reader wrote a delete per removed row; skipped, counted.
        _row("truncate", offset=8, raw_value="{}"),
        # A keyless table's records: skipped and counted, never dead-lettered.
        _row("keyless", offset=9, table="public.log", after_json='{"n":1}'),
        _row("keyless", offset=10, table="public.log"),
        # The schema row comes after the changes that use it.
        _row("schema", schema_id=1, schema_json=orjson.dumps(SCHEMA).decode()),
    ]
    stats = _apply(sink, rows)
    assert (stats.applied, stats.skipped, stats.failed, stats.dead_lettered) == (1, 1, 1, 2)
    assert (stats.keyless, stats.truncates, stats.keyless_tables) == (2, 1, {"public.log"})
    assert (stats.max_commit_lsn, stats.heartbeat_lsn) == (300, 250)
    assert stats.busy
    # One reduction: the sink gets the rows' changes as they are, one per key.
    (batch,) = sink.batches
    assert [(c.key, c.commit_lsn) for c in batch] == [("1", 100), ("2", 300), ("3", 200)]
    # The value schema reaches the sink once, whole: what it makes of it is its own business.
    assert sink.schemas == [("public.items", SCHEMA)]
    # Unreadable records as they come; refused changes once their chunk is applied.
    dead, refused = published
    assert refused == {
        "topic": "shop.public.items",
        "partition": 0,
        "offset": 5,
        "table": "public.items",
        "key": "3",
        "reason": "failed: mapping",
        "commit_lsn": 200,
        "doc": {"v": "failed: mapping"},
    }
    assert (dead["offset"], dead["key"], dead["value"], dead["reason"]) == (
        7,
        '{"id":4}',
        "junk",
        "bad",
    )
    assert not sink.closed


def test_a_retryable_failure_marks_the_follower_unreachable_and_drops_the_sink(
    sink: RecordingSink, published: list[dead_letter.DeadLetter]
) -> None:
    stats = _apply(sink, [_change(1, {"v": "failed-retry"}, 100)])
    assert stats.job == "job" and stats.unreachable and "failed-retry" in stats.unreachable
    assert (stats.applied, stats.failed, stats.dead_lettered) == (0, 0, 0)
    assert sink.closed and not apply_loop._SINKS
    assert published == []


def test_each_follower_gets_the_changes_built_once_and_its_own_dead_letters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One partition, two followers: the second is unreachable and does not stop the
    first; the unreadable record is dead-lettered once per follower that got the batch,
    under that follower's job name."""
    letters: list[tuple[str, int]] = []

    def publish(settings: Settings, job: str, records: list[dead_letter.DeadLetter]) -> int:
        letters.extend((job, r["offset"]) for r in records)
        return len(records)

    monkeypatch.setattr(dead_letter, "publish", publish)
    up, down = RecordingSink(), RecordingSink()
    down.apply = lambda changes: [  # type: ignore[method-assign]
        ApplyResult.of(c, Outcome.FAILED, "unreachable", retryable=True) for c in changes
    ]
    rows = [
        _change(1, {"v": "applied"}, 100),
        _row("dead", offset=7, key_json='{"id":4}', raw_value="junk", parse_error="bad"),
        _row("schema", schema_id=1, schema_json=orjson.dumps(SCHEMA).decode()),
    ]
    followers = [
        apply_loop.Follower("up", lambda _s: up),
        apply_loop.Follower("down", lambda _s: down),
        apply_loop.Follower("up2", lambda _s: up),
    ]
    try:
        first, second, third = apply_loop.apply_partition(load_settings(), followers, rows)
    finally:
        apply_loop._SINKS.clear()
    assert (first.job, first.applied, first.dead_lettered, first.unreachable) == ("up", 1, 1, None)
    assert (second.job, second.applied, second.dead_lettered) == ("down", 0, 0)
    assert second.unreachable and "unreachable" in second.unreachable
    assert (third.job, third.applied, third.dead_lettered, third.unreachable) == ("up2", 1, 1, None)
    # The same Change objects reached both sinks: built once.
    assert up.batches[0][0] is up.batches[1][0]
    assert down.closed and not up.closed
    assert letters == [("up", 7), ("up2", 7)]


def test_unchanged_toast_is_folded_from_the_history(sink: RecordingSink) -> None:
    placeholder = UNAVAILABLE_VALUE_PLACEHOLDER
    history = [
        {
            "commit_lsn": 20,
            "tx_order": 0,
            "offset": 5,
            "is_delete": False,
            "after_json": orjson.dumps({"id": 1, "body": placeholder, "n": 2}).decode(),
            "unchanged": None,
        },
        {
            "commit_lsn": 10,
            "tx_order": 0,
            "offset": 4,
            "is_delete": False,
            "after_json": orjson.dumps({"id": 1, "body": "big", "n": 1}).decode(),
            "unchanged": None,
        },
    ]
    row = _change(1, {"id": 1, "body": placeholder, "n": 2}, 20, history=history)
    _apply(sink, [row])
    (batch,) = sink.batches
    assert batch[0].doc == {"id": 1, "body": "big", "n": 2}
    assert batch[0].version_order == (20, 0)


def test_records_no_follower_can_apply_are_dead_lettered_and_the_rest_applied(
    sink: RecordingSink, published: list[dead_letter.DeadLetter]
) -> None:
    def bad(offset: int, key_json: str | None, **values: Any) -> Row:
        base = {"is_delete": False, "after_json": '{"v":"applied"}', "op": "c"}
        base.update(values)
        return _row("change", offset=offset, key_json=key_json, schema_id=1, commit_lsn=5, **base)

    rows = [
        bad(1, "not json"),
        bad(2, "[1,2]"),
        bad(3, "{}"),
        bad(4, '{"id":9}', after_json=None, op="u"),
        bad(5, '{"id":10}', after_json="[1]"),
        bad(6, '{"id":11}', after_json="{broken"),
        _change(12, {"v": "applied"}, 100),
        _row("schema", schema_id=1, schema_json=orjson.dumps(SCHEMA).decode()),
    ]
    stats = _apply(sink, rows)
    assert (stats.applied, stats.dead_lettered) == (1, 6)
    assert [c.key for c in sink.batches[0]] == ["12"]
    reasons = {d["offset"]: d["reason"] for d in published}  # type: ignore[typeddict-item]
    assert "not JSON" in reasons[1]
    assert "not a JSON object" in reasons[2] and "not a JSON object" in reasons[3]
    assert "u event without an 'after' image" in reasons[4]
    assert "'after' image is not a JSON object" in reasons[5]
    assert "cannot decode" in reasons[6]
    assert all(d["value"] is None or isinstance(d["value"], str) for d in published)


def test_dates_beyond_python_reach_are_applied_not_fatal(sink: RecordingSink) -> None:
    from schemas.convert import DATE_POSITIVE_INFINITY_DAYS

    date_schema = {
        "type": "struct",
        "fields": [
            {
                "field": "after",
                "type": "struct",
                "fields": [{"field": "d", "type": "int32", "name": "io.debezium.time.Date"}],
            }
        ],
    }
    rows = [
        _change(1, {"d": DATE_POSITIVE_INFINITY_DAYS, "v": "applied"}, 10),
        _change(2, {"d": 2_932_897, "v": "applied"}, 10),  # 10000-01-01
        _change(3, {"d": -719_528, "v": "applied"}, 10),  # 1 BC (year 0), a leap year
        _row("schema", schema_id=1, schema_json=orjson.dumps(date_schema).decode()),
    ]
    stats = _apply(sink, rows)
    assert stats.applied == 3
    assert [c.doc["d"] for c in sink.batches[0] if c.doc] == [
        "infinity",
        "10000-01-01",
        "0001-01-01 BC",
    ]


def test_the_unchanged_header_decides_whatever_the_value(sink: RecordingSink) -> None:
    row = _change(
        1,
        {"id": 1, "n": None, "tags": None, "body": "kept as written", "v": "applied"},
        20,
        unchanged="n,tags,odd%2Cname",
    )
    _apply(sink, [row])
    (change,) = sink.batches[0]
    # Null placeholders of non-text columns are known from the header alone.
    assert change.doc == {"id": 1, "body": "kept as written", "v": "applied"}
    assert change.unchanged == frozenset({"n", "tags"})


def test_a_commit_lsn_beyond_2_to_the_63_stops_the_job(
    sink: RecordingSink, published: list[dead_letter.DeadLetter]
) -> None:
    with pytest.raises(SinkError, match=r"2\*\*63-1"):
        _apply(sink, [_row("change", key_json='{"id":1}', is_delete=True, commit_lsn=None)])
    assert published == []


def test_an_unreachable_follower_is_told_from_other_failures() -> None:
    spark_text = (
        "An error occurred while calling o123.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
        '  File "/w/spark_jobs/apply_loop.py", line 181, in _apply_chunk\n'
        "pgcdc.core.errors.RetryableSinkError: Redis unreachable: Error 111 connecting\n"
    )
    assert apply_loop.unreachable_reason(RuntimeError(spark_text)) == (
        "Redis unreachable: Error 111 connecting"
    )
    assert apply_loop.unreachable_reason(RuntimeError("SinkError: bad password")) is None


def test_a_letter_too_large_carries_the_position_not_the_contents() -> None:
    big = dead_letter.UnreadableRecord(
        topic="t",
        partition=2,
        offset=9,
        table="public.items",
        key='{"id":1}',
        value="x" * (dead_letter.MAX_LETTER_BYTES + 1),
        reason="value is not a Debezium event",
    )
    got = orjson.loads(dead_letter.letter(big, "cache_sync"))
    assert got["truncated"] is True and got["bytes"] > dead_letter.MAX_LETTER_BYTES
    assert (got["topic"], got["partition"], got["offset"]) == ("t", 2, 9)
    assert got["reason"] == "value is not a Debezium event" and "value" not in got
    small = orjson.loads(dead_letter.letter({**big, "value": "x"}, "cache_sync"))
    assert small["value"] == "x" and "truncated" not in small


def test_a_refused_whole_document_is_dead_lettered_with_its_values() -> None:
    # The native path's documents are read from their JSON when asked (WholeDocument), no
    # dict: the letter carries their values all the same.
    doc = WholeDocument(b'{"id":1,"name":"caf\xc3\xa9","n":1.5}', 3)
    refused = dead_letter.RefusedChange(
        topic="t",
        partition=0,
        offset=4,
        table="public.items",
        key='{"id":1}',
        reason="mapper_parsing_exception",
        commit_lsn=7,
        doc=doc,
    )
    got = orjson.loads(dead_letter.letter(refused, "search_sync"))
    assert got["doc"] == {"id": 1, "name": "café", "n": 1.5} and "truncated" not in got


def test_reduced_changes_that_cannot_be_built_are_dead_lettered(
    sink: RecordingSink, published: list[dead_letter.DeadLetter]
) -> None:
    """Rows as classify gives them, reduced in the task: a change whose key is not JSON is
    dead-lettered with its position, and the other change of the partition applied."""
    classified = {
        "kind": "change", "topic": "shop.public.items", "table": "public.items",
        "partition": 2, "is_delete": False, "op": "c", "unchanged": None, "schema_id": 1,
        "value_schema_json": orjson.dumps(SCHEMA).decode(), "tx_order": 0,
        "source_ts_ms": 1, "heartbeat_lsn": None, "parse_error": None, "raw_value": None,
    }  # fmt: skip
    rows = [
        {**classified, "offset": 3, "key_json": "{not json", "after_json": '{"v":"applied"}',
         "commit_lsn": 100},
        {**classified, "offset": 4, "key_json": '{"id":5}', "after_json": '{"v":"applied"}',
         "commit_lsn": 110},
    ]  # fmt: skip
    (stats,) = apply_loop.apply_events(load_settings(), _one(sink), rows)
    assert (stats.applied, stats.dead_lettered) == (1, 1)
    (letter,) = published
    assert (letter["partition"], letter["offset"]) == (2, 3)
    assert "not JSON" in str(letter["reason"])


def test_a_value_sparks_json_reader_refused_is_read_again_in_the_task(
    sink: RecordingSink, published: list[dead_letter.DeadLetter]
) -> None:
    """Spark's JSON reader gives up on some values (a string of tens of MB): the task reads
    the record again and applies it; a value that is no event stays dead-lettered."""
    from spark_jobs.transforms import NOT_DEBEZIUM

    big = "x" * 100_000
    event = {"schema": SCHEMA, "payload": {"op": "c", "after": {"v": "applied", "body": big}}}
    dead = {
        "kind": "dead", "topic": "shop.public.items", "table": "public.items",
        "partition": 1, "key_json": '{"id":9}', "is_delete": None, "op": None,
        "after_json": None, "unchanged": None, "schema_id": None, "value_schema_json": None,
        "commit_lsn": 500, "tx_order": 0, "source_ts_ms": None, "heartbeat_lsn": None,
        "parse_error": NOT_DEBEZIUM,
    }  # fmt: skip
    rows = [
        # As Spark hands it to the task: a Row, not a dict.
        Row(**{**dead, "offset": 1, "raw_value": orjson.dumps(event).decode()}),
        {**dead, "offset": 2, "key_json": '{"id":10}', "raw_value": "not json"},
    ]
    (stats,) = apply_loop.apply_events(load_settings(), _one(sink), rows)
    assert (stats.applied, stats.dead_lettered) == (1, 1)
    ((change,),) = sink.batches
    assert change.key == "9" and change.doc == {"v": "applied", "body": big}
    assert sink.schemas == [("public.items", SCHEMA)]
    (letter,) = published
    assert letter["offset"] == 2 and letter["reason"] == NOT_DEBEZIUM


def test_rows_of_the_python_parse_are_applied_and_dead_lettered_alike(
    sink: RecordingSink, published: list[dead_letter.DeadLetter]
) -> None:
    """``spark.parse = "python"``: the task's own parse (spark_jobs.parse) feeds the same
    reduction and apply; a change that cannot be built is dead-lettered with its image."""
    from spark_jobs.parse import KafkaRecord, RecordParser

    def event(after: dict[str, Any]) -> bytes:
        return orjson.dumps({"schema": SCHEMA, "payload": {"op": "c", "after": after}})

    records = [
        KafkaRecord("shop.public.items", 0, 1, b'{"id":1}', event({"v": "skipped"}), None),
        KafkaRecord("shop.public.items", 0, 2, b'{"id":1}', event({"v": "applied", "n": 2}), None),
        KafkaRecord("shop.public.items", 0, 3, b"{not json", event({"v": "applied"}), None),
        KafkaRecord("shop.public.items", 0, 4, b'{"id":2}', b"junk", None),
        KafkaRecord("__cdc-heartbeat.shop", 0, 5, None, b'{"lsn":77}', None),
    ]
    rows = RecordParser("shop", "__cdc-heartbeat.shop").rows(records)
    (stats,) = apply_loop.apply_events(load_settings(), _one(sink), rows)
    assert (stats.applied, stats.dead_lettered, stats.heartbeat_lsn) == (1, 2, 77)
    ((change,),) = sink.batches
    assert change.key == "1" and change.doc == {"v": "applied", "n": 2}
    assert sink.schemas == [("public.items", SCHEMA)]
    letters = {letter["offset"]: letter for letter in published}
    assert orjson.loads(str(letters[3]["value"])) == {"v": "applied"}
    assert "not JSON" in str(letters[3]["reason"])
    assert letters[4]["value"] == "junk" and letters[4]["reason"] == "value is not a Debezium event"


class _SlowSink(RecordingSink):
    """Waits at ``barrier`` in each ``apply`` (both followers must be inside their apply at
    once to pass it) and records what each apply saw."""

    def __init__(
        self, barrier: threading.Barrier, fail_on: int | None = None, wait_s: float = 10
    ) -> None:
        super().__init__()
        self.barrier = barrier
        self.wait_s = wait_s
        self.fail_on = fail_on
        self.inside = 0
        self.most_inside = 0
        self.finished = 0

    def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            self.barrier.wait(timeout=self.wait_s)
            if self.fail_on is not None and len(self.batches) == self.fail_on:
                self.batches.append(list(changes))
                raise RuntimeError("the follower broke")
            return super().apply(changes)
        finally:
            self.inside -= 1
            self.finished += 1


def test_the_shared_job_writes_a_chunk_to_its_followers_at_once_each_in_order(
    monkeypatch: pytest.MonkeyPatch, published: list[dead_letter.DeadLetter]
) -> None:
    """spark.concurrent_followers: each chunk goes to both followers at the same time (their
    applies meet at a barrier, which one after the other never reaches), each follower gets
    its chunks in order and one at a time, and the counts are as without threads."""
    monkeypatch.setattr(apply_loop, "_CHUNK", 2)
    barrier = threading.Barrier(2)
    cache, search = _SlowSink(barrier), _SlowSink(barrier)
    followers = [
        apply_loop.Follower("cache", lambda _s: cache),
        apply_loop.Follower("search", lambda _s: search),
    ]
    rows = [_change(k, {"v": "applied"}, 100 + k) for k in range(1, 8)]
    try:
        first, second = apply_loop.apply_partition(load_settings(), followers, rows)
    finally:
        apply_loop._SINKS.clear()
    assert not barrier.broken
    for sink in (cache, search):
        assert [[c.key for c in b] for b in sink.batches] == [
            ["1", "2"],
            ["3", "4"],
            ["5", "6"],
            ["7"],
        ]
        assert sink.most_inside == 1
    assert (first.job, first.applied, second.job, second.applied) == ("cache", 7, "search", 7)


def test_one_after_the_other_when_concurrent_followers_is_off(
    monkeypatch: pytest.MonkeyPatch, published: list[dead_letter.DeadLetter]
) -> None:
    monkeypatch.setenv("CDC_SPARK__CONCURRENT_FOLLOWERS", "false")
    threads: list[str] = []

    class Sink(RecordingSink):
        def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
            threads.append(threading.current_thread().name)
            return super().apply(changes)

    cache, search = Sink(), Sink()
    followers = [
        apply_loop.Follower("cache", lambda _s: cache),
        apply_loop.Follower("search", lambda _s: search),
    ]
    try:
        first, second = apply_loop.apply_partition(load_settings(), followers, [_change(1, {}, 9)])
    finally:
        apply_loop._SINKS.clear()
    assert threads == [threading.current_thread().name] * 2
    assert (first.applied, second.applied) == (1, 1)


def test_a_follower_that_fails_the_task_fails_it_once_the_other_has_ended(
    monkeypatch: pytest.MonkeyPatch, published: list[dead_letter.DeadLetter]
) -> None:
    """A failure that is not an outage fails the task, but not while the other follower's
    chunk is still being written: no thread of the task outlives it."""
    monkeypatch.setattr(apply_loop, "_CHUNK", 2)
    barrier = threading.Barrier(2)
    # The cache's chunk after the failure waits for a search that never comes, and ends.
    cache, search = _SlowSink(barrier, wait_s=0.5), _SlowSink(barrier, fail_on=1)
    followers = [
        apply_loop.Follower("cache", lambda _s: cache),
        apply_loop.Follower("search", lambda _s: search),
    ]
    rows = [_change(k, {"v": "applied"}, 100 + k) for k in range(1, 8)]
    try:
        with pytest.raises(RuntimeError, match="the follower broke"):
            list(apply_loop.apply_partition(load_settings(), followers, rows))
    finally:
        apply_loop._SINKS.clear()
    # Both followers' threads had ended: the other's chunk after the failure was taken too.
    assert cache.inside == 0 and search.inside == 0 and cache.finished == 3
    assert len(search.batches) == 2 and search.closed


def test_ranges_at_once_run_a_thread_a_slot_and_the_first_failure_ends_the_task() -> None:
    """``_concurrently`` (a task's ranges, ``spark.ranges_at_once``): each id once, at most
    ``at_once`` at a time, each thread with its own slot; after a failure no id starts, and
    the failure is raised once the ranges under way have ended."""
    both_in = threading.Barrier(2, timeout=10)
    ran: list[tuple[int, int, str]] = []

    def run(i: int, slot: int) -> list[apply_loop.BatchStats]:
        if i in (10, 11):
            both_in.wait()  # two ranges under way at once, or the barrier breaks
        ran.append((i, slot, threading.current_thread().name))
        return [apply_loop.BatchStats(job=f"j{i}", applied=i)]

    done = apply_loop._concurrently([10, 11, 12, 13], 2, run)
    assert {i: [s.applied for s in got] for i, got in done.items()} == {
        10: [10],
        11: [11],
        12: [12],
        13: [13],
    }
    assert {slot for _, slot, _ in ran} == {0, 1}
    assert all(name == f"range-{slot}" for _, slot, name in ran)

    started: list[int] = []
    ended: list[int] = []
    failed_in: list[threading.Thread] = []
    go = threading.Event()

    def failing(i: int, slot: int) -> list[apply_loop.BatchStats]:
        started.append(i)
        if i == 1:
            failed_in.append(threading.current_thread())
            go.set()
            raise RuntimeError("range 1 failed")
        assert go.wait(10)
        failed_in[0].join(10)  # its failure is taken: this range is the last under way
        ended.append(i)
        return []

    with pytest.raises(RuntimeError, match="range 1 failed"):
        apply_loop._concurrently([1, 2, 3, 4], 2, failing)
    # 1 was taken first; 2 may have started beside it, and then ended before the raise;
    # nothing started after the failure.
    assert sorted(started) in ([1], [1, 2])
    assert ended == [i for i in started if i != 1]
    assert 3 not in started and 4 not in started


def test_a_slot_writes_with_sinks_of_its_own_and_drops_only_them(
    published: list[dead_letter.DeadLetter],
) -> None:
    made: list[RecordingSink] = []

    def make(_s: Settings) -> RecordingSink:
        made.append(RecordingSink())
        return made[-1]

    followers = [apply_loop.Follower("job", make)]
    try:
        settings = load_settings()
        (first,) = apply_loop.apply_partition(settings, followers, [_change(1, {}, 100)], 0)
        (second,) = apply_loop.apply_partition(settings, followers, [_change(2, {}, 101)], 1)
        assert first.applied == second.applied == 1
        assert len(made) == 2 and [len(s.batches) for s in made] == [1, 1]
        (again,) = apply_loop.apply_partition(settings, followers, [_change(3, {}, 102)], 1)
        assert again.applied == 1
        assert len(made) == 2 and [len(s.batches) for s in made] == [1, 2]  # kept, each slot's
        (lost,) = apply_loop.apply_partition(
            settings, followers, [_change(4, {"v": "failed-retry"}, 103)], 1
        )
        assert lost.unreachable and made[1].closed and not made[0].closed
        assert list(apply_loop._SINKS) == [apply_loop._sink_key(settings, "job", 0)]
    finally:
        apply_loop._SINKS.clear()
