"""The --available-now progress line and the batch limit rule (no Spark needed)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from spark_jobs.progress import (
    AVAILABLE_NOW_BATCH_RECORDS,
    ProgressLog,
    batch_limit,
    new_reports,
    progress_line,
    records_left,
    records_read,
)

pytestmark = pytest.mark.unit


def test_an_available_now_run_is_cut_into_batches_unless_it_sets_its_own_limit() -> None:
    assert batch_limit(None, available_now=True) == AVAILABLE_NOW_BATCH_RECORDS
    assert batch_limit(5000, available_now=True) == 5000
    assert batch_limit(None, available_now=False) is None
    assert batch_limit(5000, available_now=False) == 5000


def test_records_left_are_latest_minus_end_offsets_per_partition() -> None:
    sources = [
        {
            "endOffset": '{"t.a": {"0": 100, "1": 50}}',
            "latestOffset": {"t.a": {"0": 300, "1": 50, "2": 7}},  # a dict, or JSON text
        }
    ]
    assert records_left(sources) == 200 + 0 + 0  # a partition the batch never saw: no count


def test_the_progress_line() -> None:
    assert progress_line(1, 400_000, 200_000, 50.0) == (
        "batch 1: read 400000 of 600000 records (67%), 8000 records/s, ETA 25s"
    )
    assert progress_line(4, 600_000, 0, 75.0).endswith("(100%), 8000 records/s, caught up")
    assert progress_line(0, 10, 5_000_000, 1.0).endswith("10 records/s, ETA 138h 53m")
    assert progress_line(0, 100, 6_000, 1.0).endswith("ETA 1m 00s")


def test_each_batch_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    times = iter([0.0, 10.0, 20.0])
    log = ProgressLog("cache_sync", clock=lambda: next(times))
    offsets = '{"t.a": {"0": %d}}'
    report = {
        "batchId": 0,
        "numInputRows": 100,
        "sources": [{"endOffset": offsets % 100, "latestOffset": offsets % 300}],
    }
    empty = {"batchId": 1, "numInputRows": 0, "sources": []}
    with caplog.at_level(logging.INFO, logger="spark_jobs.progress"):
        log.update([report])
        log.update([report, empty])  # recentProgress repeats what was seen
    assert [r.getMessage() for r in caplog.records] == [
        "batch 0: read 100 of 300 records (33%), 10 records/s, ETA 20s"
    ]


def test_the_direct_read_counts_records_by_offsets_not_input_rows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # spark.read = "direct": the frame's rows are the batch's offset ranges (two here).
    report = {
        "batchId": 3,
        "numInputRows": 2,
        "sources": [
            {
                "startOffset": '{"t.a": {"0": 100, "1": 40}}',
                "endOffset": '{"t.a": {"0": 400, "1": 50, "2": 5}}',
                "latestOffset": '{"t.a": {"0": 500, "1": 50, "2": 5}}',
            }
        ],
    }
    assert records_read(report["sources"]) == 300 + 10  # a new partition: recorded first
    log = ProgressLog("sync", clock=iter([0.0, 31.0]).__next__, direct=True)
    with caplog.at_level(logging.INFO, logger="spark_jobs.progress"):
        log.update([report])
    assert [r.getMessage() for r in caplog.records] == [
        "batch 3: read 310 of 410 records (76%), 10 records/s, ETA 10s"
    ]


class _Report:
    """A progress report as py4j gives it: its JSON on asking (each ask counted)."""

    def __init__(self, report: dict[str, object], asked: list[int]) -> None:
        self.report, self.asked = report, asked

    def json(self) -> str:
        self.asked.append(int(str(self.report["batchId"])))
        return json.dumps(self.report)


def test_a_poll_reads_only_the_reports_of_batches_it_has_not_seen(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asked: list[int] = []
    offsets = '{"t.a": {"0": %d}}'
    held = [
        _Report(
            {
                "batchId": b,
                "numInputRows": 10,
                "sources": [{"endOffset": offsets % (10 * b + 10), "latestOffset": offsets % 1000}],
            },
            asked,
        )
        for b in range(100)  # what Spark keeps of a long run (numRecentProgressUpdates)
    ]
    query = SimpleNamespace(_jsq=SimpleNamespace(recentProgress=lambda: held))
    assert [r["batchId"] for r in new_reports(query, 97)] == [98, 99]
    assert asked == [99, 98, 97]  # from the newest back, to the first one seen
    assert new_reports(query, 99) == [] and asked[3:] == [99]
    log = ProgressLog("sync", clock=iter([0.0, 10.0, 20.0]).__next__)
    log.last_batch = 98
    with caplog.at_level(logging.INFO, logger="spark_jobs.progress"):
        log.poll(query)
        log.poll(query)
    assert [r.getMessage() for r in caplog.records] == [
        "batch 99: read 10 of 10 records (100%), 1 records/s, caught up"
    ]


def test_the_direct_reads_first_batch_counts_the_offsets_its_ranges_spanned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A run's first report has no start offsets: its records were left out of "read", and
    # the backlog's total read 70,000 of a 100,000-record backlog.
    offsets = '{"t.a": {"0": %d}}'
    first = {
        "batchId": 0,
        "numInputRows": 1,
        "sources": [
            {"startOffset": None, "endOffset": offsets % 30_000, "latestOffset": offsets % 100_000}
        ],
    }
    second = {
        "batchId": 1,
        "numInputRows": 1,
        "sources": [
            {
                "startOffset": offsets % 30_000,
                "endOffset": offsets % 60_000,
                "latestOffset": offsets % 100_000,
            }
        ],
    }
    spans = {0: 30_000, 1: 30_000}
    log = ProgressLog("sync", clock=iter([0.0, 10.0, 20.0]).__next__, direct=True, spans=spans)
    with caplog.at_level(logging.INFO, logger="spark_jobs.progress"):
        log.update([first, second])
    assert [r.getMessage() for r in caplog.records] == [
        "batch 0: read 30000 of 100000 records (30%), 3000 records/s, ETA 23s",
        "batch 1: read 60000 of 100000 records (60%), 3000 records/s, ETA 13s",
    ]
