"""How far a long ``--available-now`` run is: one line per micro-batch.

Spark's AvailableNow trigger respects ``maxOffsetsPerTrigger``, so a backlog is cut into
batches of at most :data:`AVAILABLE_NOW_BATCH_RECORDS` records (unless the run sets its own
limit), and after each one the driver logs the records read so far of the backlog, the rate
and the time left. The backlog is what has been read plus what the batch's progress report
says is left (each partition's latest offset minus the batch's end offset), so records that
arrive during the run make it grow a little.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pgcdc.core.durations import duration

log = logging.getLogger(__name__)

# Records per micro-batch of an --available-now run that sets no limit of its own. Measured
# here (2 cores, cache_sync over 600,000 rows): 7,500-10,000 records/s, so a batch is 13-24 s
# of work and a batch's fixed cost (~0.25 s, a 4-record batch) stays under 2 %; a million
# records make 5 progress lines.
AVAILABLE_NOW_BATCH_RECORDS = 200_000


def batch_limit(max_offsets_per_trigger: int | None, available_now: bool) -> int | None:
    """The records a micro-batch may read: the run's own limit, else for ``--available-now``
    :data:`AVAILABLE_NOW_BATCH_RECORDS` (a streaming job's batches are already small)."""
    if max_offsets_per_trigger or not available_now:
        return max_offsets_per_trigger
    return AVAILABLE_NOW_BATCH_RECORDS


def records_left(sources: list[Mapping[str, Any]]) -> int:
    """Records still to read after a batch: each partition's latest offset minus the batch's
    end offset, summed over the sources of a progress report."""
    left = 0
    for source in sources:
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        for topic, partitions in latest.items():
            for partition, offset in partitions.items():
                left += max(0, int(offset) - int(end.get(topic, {}).get(partition, offset)))
    return left


def records_read(sources: list[Mapping[str, Any]]) -> int:
    """Offsets a batch moved through (its end minus its start offsets, summed): the records
    it read, give or take those compacted away. The direct read's input rows are its offset
    ranges, not its records (:mod:`spark_jobs.kafka_direct`)."""
    read = 0
    for source in sources:
        start, end = _offsets(source.get("startOffset")), _offsets(source.get("endOffset"))
        for topic, partitions in end.items():
            for partition, offset in partitions.items():
                read += max(0, int(offset) - int(start.get(topic, {}).get(partition, offset)))
    return read


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def progress_line(batch_id: int, done: int, left: int, elapsed_s: float) -> str:
    """``batch 3: read 600000 of 1000000 records (60%), 8000 records/s, ETA 50s``."""
    total = done + left
    pct = 100.0 * done / total if total else 100.0
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    eta = f"ETA {duration(left / rate)}" if rate > 0 and left else "ETA -"
    if not left:
        eta = "caught up"
    return (
        f"batch {batch_id}: read {done} of {total} records ({pct:.0f}%), "
        f"{rate:.0f} records/s, {eta}"
    )


def new_reports(query: Any, after: int) -> list[dict[str, Any]]:
    """``query``'s progress reports of the batches after ``after``, oldest first: read from
    its newest back, each one's JSON as the JVM writes it. PySpark's ``recentProgress``
    converts every report the query keeps (up to 100), two py4j calls each, at each poll of
    the wait loop (twice a second)."""
    held = query._jsq.recentProgress()
    out: list[dict[str, Any]] = []
    for i in range(len(held) - 1, -1, -1):
        report = json.loads(held[i].json())
        if int(report.get("batchId", -1)) <= after:
            break
        out.append(report)
    out.reverse()
    return out


class ProgressLog:
    """Logs :func:`progress_line` once per micro-batch that read records, from the query's
    progress reports (polled by the driver's wait loop: no listener calls back into Python
    from the JVM, which outlived the driver's callback server at the end of a run)."""

    def __init__(
        self,
        job: str,
        clock: Callable[[], float] = time.monotonic,
        direct: bool = False,
        spans: Mapping[int, int] | None = None,
    ) -> None:
        self.job = job
        self.direct = direct  # spark.read = "direct": records from the offsets, not the rows
        # The direct read's offsets each batch's ranges spanned, by batch (ApplyBatch.spans):
        # a run's first report has no start offsets, and its records went uncounted.
        self.spans = spans if spans is not None else {}
        self.clock = clock
        self.started = clock()
        self.done = 0
        self.last_batch = -1

    def poll(self, query: Any) -> None:
        """Log the batches ``query`` reported since the last poll (:func:`new_reports`)."""
        self.update(new_reports(query, self.last_batch))

    def update(self, reports: Iterable[Mapping[str, Any]]) -> None:
        """Log each report of a batch not logged yet (Spark's ``recentProgress``)."""
        for report in reports:
            batch_id = int(report.get("batchId", -1))
            if batch_id <= self.last_batch:
                continue
            self.last_batch = batch_id
            sources = report.get("sources") or []
            if not self.direct:
                rows = int(report.get("numInputRows") or 0)
            else:
                rows = self.spans.get(batch_id, records_read(sources))
            if not rows:
                continue
            self.done += rows
            left = records_left(sources)
            line = progress_line(batch_id, self.done, left, self.clock() - self.started)
            log.info("%s", line, extra={"job": self.job, "batch_id": batch_id})
