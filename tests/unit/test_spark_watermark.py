"""The watermark rule with several partitions (spark_jobs.watermark): a heartbeat counts
once a later complete batch is applied; a rate-limited batch is complete only when its
progress shows it reached the latest offset of every partition."""

from __future__ import annotations

import json

import pytest

from spark_jobs.watermark import Watermark, progress_complete

pytestmark = pytest.mark.unit


def _progress(
    batch: int, end: dict[str, dict[str, int]], latest: dict[str, dict[str, int]]
) -> dict:
    return {
        "batchId": batch,
        "sources": [{"endOffset": json.dumps(end), "latestOffset": json.dumps(latest)}],
    }


def test_a_heartbeat_counts_only_after_a_later_batch() -> None:
    w = Watermark()
    w.seen(0, 500)
    # Batch 0 itself does not confirm its own heartbeat: its offsets were listed per broker.
    assert w.complete(0) == 0
    w.seen(1, 900)
    assert w.complete(1) == 500
    assert w.complete(2) == 900
    # Never backwards, whatever the batches bring.
    w.seen(3, 100)
    assert w.complete(4) == 900


def test_complete_means_every_partition_reached_its_latest_offset() -> None:
    six = {"cdc.public.t": {str(p): 100 + p for p in range(6)}, "__cdc-heartbeat.cdc": {"0": 7}}
    assert progress_complete(_progress(3, six, six))
    short = json.loads(json.dumps(six))
    short["cdc.public.t"]["4"] -= 1  # one partition of six cut short by the rate limit
    assert not progress_complete(_progress(3, short, six))
    assert not progress_complete(None)
    assert not progress_complete({"batchId": 1, "sources": []})
    assert progress_complete({"batchId": 1, "sources": [{"endOffset": six, "latestOffset": six}]})


def test_rate_limited_batches_hold_the_watermark_until_the_end_is_reached() -> None:
    from pgcdc.core.settings import load_settings
    from spark_jobs.apply_loop import ApplyBatch, BatchStats
    from spark_jobs.options import JobOptions

    opts = JobOptions(
        name="j",
        heartbeat_topic="__cdc-heartbeat.cdc",
        topics=(),
        topic_pattern="x",
        starting_offsets="earliest",
        checkpoint="/tmp/x",
        available_now=False,
        trigger_interval="1 second",
        max_offsets_per_trigger=100,
    )
    batch = ApplyBatch(load_settings(), opts, lambda _s: None)  # type: ignore[arg-type,return-value]
    latest = {"t": {"0": 500, "1": 500}}
    reports: list[dict] = []
    batch.last_progress = lambda: reports[-1] if reports else None

    def run(batch_id: int, beat: int, end: dict[str, dict[str, int]]) -> int:
        got = batch._watermark(batch_id, BatchStats(heartbeat_lsn=beat, max_commit_lsn=10**9))
        reports.append(_progress(batch_id, end, latest))
        return got

    assert run(0, 300, {"t": {"0": 100, "1": 100}}) == 0  # cut short
    assert run(1, 0, {"t": {"0": 200, "1": 500}}) == 0  # partition 0 still behind
    assert run(2, 0, {"t": {"0": 500, "1": 500}}) == 0  # complete, known at the next batch
    assert run(3, 0, {"t": {"0": 500, "1": 500}}) == 300
