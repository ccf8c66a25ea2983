"""The per-partition apply of the sync jobs, on rows shaped like the reduced frame's, with a
sink that records what it is given (no Spark session, no servers)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
import pytest
from pyspark.sql import Row

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER
from pgcdc.core.errors import RetryableSinkError
from pgcdc.core.settings import Settings, load_settings
from sinks.base import ApplyResult, Change, Outcome
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
    "after_json",
    "schema_id",
    "schema_json",
    "commit_lsn",
    "tx_order",
    "history",
    "heartbeat_lsn",
    "parse_error",
    "raw_value",
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

    def register_schema(self, table: str, value_schema: Mapping[str, Any]) -> None:
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


def _apply(sink: RecordingSink, rows: list[Row]) -> apply_loop.BatchStats:
    (stats,) = apply_loop.apply_partition(load_settings(), "job", lambda _s: sink, rows)
    return stats


def test_changes_heartbeats_and_refusals(
    sink: RecordingSink, published: list[dead_letter.DeadLetter]
) -> None:
    rows = [
        _change(1, {"v": "applied"}, 100),
        _change(2, {"v": "skipped"}, 300),
        _change(3, {"v": "failed: mapping"}, 200),
        _row("heartbeat", heartbeat_lsn=250),
        _row("heartbeat", heartbeat_lsn=None),
        _row("dead", offset=7, key_json='{"id":4}', raw_value="junk", parse_error="bad"),
        _row("truncate", offset=8, raw_value="{}"),
        # The schema row comes after the changes that use it.
        _row("schema", schema_id=1, schema_json=orjson.dumps(SCHEMA).decode()),
    ]
    stats = _apply(sink, rows)
    assert (stats.applied, stats.skipped, stats.failed, stats.dead_lettered) == (1, 1, 1, 3)
    assert (stats.max_commit_lsn, stats.heartbeat_lsn) == (300, 250)
    assert stats.busy
    # One reduction: the sink gets the rows' changes as they are, one per key.
    (batch,) = sink.batches
    assert [(c.key, c.commit_lsn) for c in batch] == [("1", 100), ("2", 300), ("3", 200)]
    # The value schema reaches the sink once, whole: what it makes of it is its own business.
    assert sink.schemas == [("public.items", SCHEMA)]
    # Unreadable records as they come; refused changes once their chunk is applied.
    dead, truncate, refused = published
    assert refused == {
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
    assert truncate["reason"].startswith("TRUNCATE is not applied")
    assert not sink.closed


def test_a_retryable_failure_fails_the_partition_and_drops_the_sink(
    sink: RecordingSink, published: list[dead_letter.DeadLetter]
) -> None:
    with pytest.raises(RetryableSinkError):
        _apply(sink, [_change(1, {"v": "failed-retry"}, 100)])
    assert sink.closed and not apply_loop._SINKS
    assert published == []


def test_unchanged_toast_is_folded_from_the_history(sink: RecordingSink) -> None:
    placeholder = UNAVAILABLE_VALUE_PLACEHOLDER
    history = [
        {
            "commit_lsn": 20,
            "tx_order": 0,
            "offset": 5,
            "is_delete": False,
            "after_json": orjson.dumps({"id": 1, "body": placeholder, "n": 2}).decode(),
        },
        {
            "commit_lsn": 10,
            "tx_order": 0,
            "offset": 4,
            "is_delete": False,
            "after_json": orjson.dumps({"id": 1, "body": "big", "n": 1}).decode(),
        },
    ]
    row = _change(1, {"id": 1, "body": placeholder, "n": 2}, 20, history=history)
    _apply(sink, [row])
    (batch,) = sink.batches
    assert batch[0].doc == {"id": 1, "body": "big", "n": 2}
    assert batch[0].version_order == (20, 0)
