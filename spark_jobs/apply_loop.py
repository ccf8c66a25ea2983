"""The apply loop: what each micro-batch does (:class:`ApplyBatch`, the ``foreachBatch``
function, on the driver) and how one partition is applied (:func:`apply_partition`, in the
Python workers).

A micro-batch is one Spark stage with a task per Kafka partition (per key-hash partition
with ``--min-partitions``): ``DataFrame.mapInArrow`` hands each task its partition as Arrow
batches (:mod:`spark_jobs.transfer` turns them into dicts and sends the task's stats back),
and each task, in parallel: with ``spark.parse = "python"`` parses its raw Kafka records
itself, once each (:mod:`spark_jobs.parse`; with ``"jvm"`` Spark SQL parsed them before,
:mod:`spark_jobs.transforms`); reduces its rows to the newest event per key
(:func:`~spark_jobs.reduce.latest_per_key`: the batch's one reduction); sends unparseable
records to the dead-letter topic; applies through the sink (every write carries an
LSN-derived version, so a replay can never go backwards); dead-letters what the sink
refused for good. Once every task is done the driver records the follower's watermark.

No record stops a job: one that cannot become a change (a key that is not JSON, a c/u/r
event without ``after``, a value its schema cannot decode) or that the sink refuses for good
goes to the dead-letter topic with the reason, and the rest of the batch is applied.
Records of keyless tables (null key) and Debezium ``t`` events (the reader also writes a
delete per removed row) are skipped and counted, with one log line per batch. Only what no
later record could get past stops the job: a follower that stays unreachable, or a commit
LSN beyond what the followers can order. Spark commits the batch's
offsets to the checkpoint after :class:`ApplyBatch` returns, so a crash anywhere replays
the batch: the versions make the replay harmless.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import orjson
import pyarrow as pa
from pyspark.sql import DataFrame

from pgcdc.core.errors import RetryableSinkError, SinkError
from pgcdc.core.settings import ParsePath, Settings, ValueFormat
from sinks.base import Change, Outcome, Sink
from spark_jobs import dead_letter
from spark_jobs.avro_input import avro_as_json, transcoder_for
from spark_jobs.changes import ChangeBuilder, RecordError
from spark_jobs.interrupt import BatchInterrupted
from spark_jobs.metrics import JobMetrics
from spark_jobs.options import JobOptions
from spark_jobs.parse import RecordParser, parsed_after
from spark_jobs.reduce import latest_per_key
from spark_jobs.stats import BatchStats
from spark_jobs.transfer import (
    RECORD_COLUMNS,
    STATS_SCHEMA,
    records_from_arrow,
    rows_from_arrow,
    stats_batch,
    stats_from_rows,
)
from spark_jobs.transforms import (
    CHANGE,
    DEAD,
    HEARTBEAT,
    KEYLESS,
    SCHEMA,
    TRUNCATE,
    by_key,
    classify,
    parse_events,
)
from spark_jobs.watermark import Watermark, progress_complete

log = logging.getLogger(__name__)
T = TypeVar("T")

# Builds a job's sink from the settings (the sink's ``from_settings``).
SinkFactory = Callable[[Settings], Sink]

_CHUNK = 2000  # changes per sink.apply call
_MAX_PAUSE_S = 15.0  # longest wait between two runs of a batch during an outage


def unreachable_reason(e: BaseException) -> str | None:
    """The line saying the follower is unreachable, if ``e`` (a failed Spark job, whose
    text carries the Python workers' tracebacks) came from a :class:`RetryableSinkError`."""
    marker = RetryableSinkError.__name__ + ": "
    for line in str(e).splitlines():
        at = line.find(marker)
        if at >= 0:
            return line[at + len(marker) :].strip()[:300]
    return None


_SINKS: dict[tuple[str, str], Sink] = {}


def _sink_key(settings: Settings, job: str) -> tuple[str, str]:
    return (job, settings.model_dump_json())


def cached_sink(settings: Settings, job: str, make_sink: SinkFactory) -> Sink:
    """One sink per job in each Python worker: Spark reuses its workers across tasks and
    batches, so connections, loaded scripts and known indices outlive a micro-batch."""
    key = _sink_key(settings, job)
    sink = _SINKS.get(key)
    if sink is None:
        sink = _SINKS[key] = make_sink(settings)
    return sink


def apply_partition(
    settings: Settings, job: str, make_sink: SinkFactory, rows: Iterable[Mapping[str, Any]]
) -> Iterator[BatchStats]:
    """Apply one partition of the reduced batch; yields its stats. Retryable failures raise.

    Changes go to the sink in chunks; records nobody can apply (unparseable, undecodable,
    refused by the sink for good) go to the dead-letter topic with the reason; records of
    keyless tables and truncate events are counted and skipped; heartbeats only raise the
    partition's heartbeat LSN.
    """
    # Schema rows may come after the changes that need them: read the partition first.
    rows = list(rows)
    schemas = {row["schema_id"]: row["schema_json"] for row in rows if row["kind"] == SCHEMA}
    sink = cached_sink(settings, job, make_sink)
    build = ChangeBuilder(schemas, sink.register_schema)
    stats = BatchStats()
    refused: list[dead_letter.DeadLetter] = []
    try:
        chunk: list[Change] = []
        where: list[tuple[str, int, int]] = []  # each change's Kafka record
        for row in rows:
            kind = row["kind"]
            if kind == CHANGE:
                stats.newest_commit_ms = max(stats.newest_commit_ms, row["source_ts_ms"] or 0)
                try:
                    chunk.append(build(row))
                except RecordError as e:
                    refused.append(_unreadable(row, str(e)))
                    continue
                except SinkError:
                    raise  # no later change could be ordered either: the job stops
                except Exception as e:  # a record never stops the job: dead-lettered
                    reason = f"cannot build the change: {type(e).__name__}: {e}"
                    refused.append(_unreadable(row, reason[:1000]))
                    continue
                where.append((row["topic"], row["partition"], row["offset"]))
                if len(chunk) >= _CHUNK:
                    _apply_chunk(sink, job, chunk, where, stats, refused)
            elif kind == HEARTBEAT:
                stats.heartbeat_lsn = max(stats.heartbeat_lsn, row["heartbeat_lsn"] or 0)
            elif kind == KEYLESS:
                stats.keyless += 1
                stats.keyless_tables.add(row["table"])
            elif kind == TRUNCATE:
                stats.truncates += 1
            elif kind == DEAD:
                refused.append(_unreadable(row, row["parse_error"]))
        if chunk:
            _apply_chunk(sink, job, chunk, where, stats, refused)
        if refused:
            stats.dead_lettered += dead_letter.publish(settings, job, refused)
    except BaseException:
        # A sink in an unknown state is not reused: the retried batch gets a new one.
        _SINKS.pop(_sink_key(settings, job), None)
        sink.close()
        raise
    yield stats


def apply_events(
    settings: Settings, job: str, make_sink: SinkFactory, rows: Iterable[Mapping[str, Any]]
) -> Iterator[BatchStats]:
    """Reduce one partition of the classified frame to the newest event per key
    (:func:`spark_jobs.reduce.latest_per_key`) and apply it (:func:`apply_partition`)."""
    return apply_partition(settings, job, make_sink, latest_per_key(rows))


def apply_arrow(
    settings: Settings, job: str, make_sink: SinkFactory, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: :func:`apply_events` over one partition's Arrow batches
    (all of them: the reduction sees the whole partition); yields the task's stats."""
    yield stats_batch(apply_events(settings, job, make_sink, rows_from_arrow(batches)))


def apply_records_arrow(
    settings: Settings,
    job: str,
    make_sink: SinkFactory,
    heartbeat_topic: str | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function with ``spark.parse = "python"``: the partition's raw Kafka
    records parsed here, once each (:mod:`spark_jobs.parse`; Avro read first when the
    settings say so), then as :func:`apply_arrow`."""
    schema = settings.schema_
    transcode = (
        transcoder_for(schema).transcode if schema.value_format is ValueFormat.AVRO else None
    )
    parser = RecordParser(settings.kafka.topic_prefix, heartbeat_topic, transcode)
    rows = parser.rows(records_from_arrow(batches))
    yield stats_batch(apply_events(settings, job, make_sink, rows))


def _apply_chunk(
    sink: Sink,
    job: str,
    chunk: list[Change],
    where: list[tuple[str, int, int]],
    stats: BatchStats,
    refused: list[dead_letter.DeadLetter],
) -> None:
    """Apply ``chunk`` (then empty it and ``where``, its records' Kafka positions),
    counting outcomes; refusals join ``refused``."""
    results = sink.apply(chunk)
    for change, (topic, partition, offset), res in zip(chunk, where, results, strict=True):
        if res.outcome is Outcome.APPLIED:
            stats.applied += 1
        elif res.outcome is Outcome.SKIPPED:
            stats.skipped += 1
        elif res.retryable:
            raise RetryableSinkError(f"{job}: {res.table}/{res.key}: {res.reason}")
        else:
            stats.failed += 1
            refused.append(
                dead_letter.RefusedChange(
                    topic=topic,
                    partition=partition,
                    offset=offset,
                    table=change.table,
                    key=change.key,
                    reason=res.reason,
                    commit_lsn=change.commit_lsn,
                    doc=change.doc,
                )
            )
        stats.max_commit_lsn = max(stats.max_commit_lsn, change.commit_lsn)
    chunk.clear()
    where.clear()


def _unreadable(row: Mapping[str, Any], reason: str) -> dead_letter.UnreadableRecord:
    """The dead-letter record for a Kafka record that is no applicable change (a change row
    carries its ``after`` image, not the whole record)."""
    value = row["raw_value"] if row["raw_value"] is not None else row["after_json"]
    after = parsed_after(row)
    if value is None and after is not None:
        value = orjson.dumps(after).decode()
    return dead_letter.UnreadableRecord(
        topic=row["topic"],
        partition=row["partition"],
        offset=row["offset"],
        table=row["table"],
        key=row["key_json"],
        value=value,
        reason=reason,
    )


class ApplyBatch:
    """The ``foreachBatch`` function: reduce the micro-batch, apply it in the workers, then
    record the follower's watermark. Its frame is ``batch.events(<the Kafka stream>)``."""

    def __init__(self, settings: Settings, opts: JobOptions, make_sink: SinkFactory) -> None:
        self.settings = settings
        self.opts = opts
        self.make_sink = make_sink
        # Heartbeats give an exact watermark (spark_jobs.watermark); without them, the
        # highest applied commit LSN stands in (approximate across partitions).
        self.exact = opts.heartbeat_topic is not None
        self.watermarks = Watermark()
        # The query's last progress report (set by the job once the query started): under
        # a rate limit it tells whether the previous batch reached the end of the topics.
        self.last_progress: Callable[[], Mapping[str, Any] | None] = lambda: None
        self.metrics = JobMetrics(opts.name)
        self.outage_retries = 0  # batches run again because the follower was unreachable
        # Set when the job is asked to stop (Ctrl-C: spark_jobs.interrupt).
        self.stopping = threading.Event()

    def _apply(
        self,
        events: DataFrame,
        apply: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
        batch_id: int,
    ) -> list[BatchStats]:
        """Run the batch's tasks (again while the follower is unreachable)."""
        return self._while_unreachable(
            batch_id, lambda: stats_from_rows(events.mapInArrow(apply, STATS_SCHEMA).collect())
        )

    def _while_unreachable(self, batch_id: int, step: Callable[[], T]) -> T:
        """``step()``; while the follower is unreachable, again with backoff, for at most
        ``spark.follower_retry_s`` (then the job stops, saying why). Running a batch or a
        watermark write again is harmless: every write carries its version."""
        deadline: float | None = None
        attempt = 0
        while True:
            try:
                return step()
            except Exception as e:
                reason = str(e) if isinstance(e, RetryableSinkError) else unreachable_reason(e)
                if reason is None:
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.settings.spark.follower_retry_s
                if now >= deadline:
                    log.error(
                        "batch %d: the follower stayed unreachable for %.0fs "
                        "(spark.follower_retry_s): stopping; a restart resumes here. %s",
                        batch_id,
                        self.settings.spark.follower_retry_s,
                        reason,
                        extra={"job": self.opts.name, "batch_id": batch_id},
                    )
                    raise
                delay = min(_MAX_PAUSE_S, 0.5 * 2**attempt, max(0.0, deadline - now))
                attempt += 1
                self.outage_retries += 1
                log.warning(
                    "batch %d: follower unreachable (%s); applying the batch again in %.1fs "
                    "(attempt %d; the job stops after %.0fs of this)",
                    batch_id,
                    reason,
                    delay,
                    attempt + 1,
                    self.settings.spark.follower_retry_s,
                    extra={"job": self.opts.name, "batch_id": batch_id},
                )
                time.sleep(delay)

    def _watermark(self, batch_id: int, total: BatchStats) -> int:
        """The LSN to record after applying ``batch_id`` (0: nothing new); the rule is
        :mod:`spark_jobs.watermark`'s."""
        if not self.exact:
            return total.max_commit_lsn
        self.watermarks.seen(batch_id, total.heartbeat_lsn)
        if not self.opts.max_offsets_per_trigger:
            return self.watermarks.complete(batch_id)  # every batch is complete
        previous = self.last_progress()
        if previous and previous.get("batchId") == batch_id - 1 and progress_complete(previous):
            return self.watermarks.complete(batch_id - 1)
        return 0

    def events(self, records: DataFrame) -> DataFrame:
        """The frame each batch applies, from the Kafka source's ``records``: parsed,
        classified and (with ``--min-partitions``) spread by key; with ``spark.parse =
        "python"`` the records themselves, which each task parses.

        Give it the *streaming* frame and pass the result to ``foreachBatch``: Spark then
        plans it once per batch inside the JVM (about 10 ms). Building the same columns
        from Python for every batch cost 200-700 ms of py4j calls and eager analysis on
        this 2-core machine, most of a micro-batch's fixed cost."""
        if self.settings.spark.parse is ParsePath.PYTHON:
            # The records as Kafka gave them: each task parses its own (apply_records_arrow).
            raw = records.select(*RECORD_COLUMNS)
            return by_key(raw, self.opts.min_partitions, key="key")
        prefix = self.settings.kafka.topic_prefix
        records = avro_as_json(records, self.settings)
        events = classify(parse_events(records, prefix, self.opts.heartbeat_topic))
        return by_key(events, self.opts.min_partitions)

    def __call__(self, events: DataFrame, batch_id: int) -> None:
        """Apply one micro-batch of :meth:`events`' frame."""
        try:
            self._run(events, batch_id)
        except Exception:
            if not self.stopping.is_set():
                raise
            # The stop cancelled the batch's tasks. Spark reads its own interruption in the
            # error's text by a regex that overflows the stack on a Java trace as long as
            # the cancelled collect()'s: a short error instead, and no chained one.
            raise BatchInterrupted(f"batch {batch_id} interrupted by a stop") from None

    def _run(self, events: DataFrame, batch_id: int) -> None:
        t0 = time.monotonic()
        apply = (
            functools.partial(
                apply_records_arrow,
                self.settings,
                self.opts.name,
                self.make_sink,
                self.opts.heartbeat_topic,
            )
            if self.settings.spark.parse is ParsePath.PYTHON
            else functools.partial(apply_arrow, self.settings, self.opts.name, self.make_sink)
        )
        total = BatchStats()
        # One stage, a task per Kafka partition (or per key-hash partition): each task
        # reduces and applies its own keys; the driver only gathers the counts.
        for stats in self._apply(events, apply, batch_id):
            total.add(stats)
        watermark = self._watermark(batch_id, total)
        if watermark:

            def record() -> None:
                sink = cached_sink(self.settings, self.opts.name, self.make_sink)
                try:
                    sink.record_watermark(self.opts.name, watermark)
                except BaseException:
                    _SINKS.pop(_sink_key(self.settings, self.opts.name), None)
                    sink.close()
                    raise

            self._while_unreachable(batch_id, record)
        try:
            self.metrics.batch(total, time.monotonic() - t0, watermark)
            self.metrics.progress(self.last_progress())
        except Exception:  # metrics never stop a job
            log.exception("batch %d: metrics not updated", batch_id)
        extra = {"job": self.opts.name, "batch_id": batch_id}
        if total.keyless:
            log.warning(
                "batch %d: skipped %d records of keyless tables %s (no key to apply them by; "
                "name key columns with CDC_POSTGRES__MESSAGE_KEY_COLUMNS)",
                batch_id,
                total.keyless,
                ", ".join(sorted(total.keyless_tables)),
                extra=extra,
            )
        if total.busy:
            log.info(
                "batch %d: applied=%d skipped=%d failed=%d dead_lettered=%d keyless=%d "
                "truncates=%d watermark=%d (%.0f ms)",
                batch_id,
                total.applied,
                total.skipped,
                total.failed,
                total.dead_lettered,
                total.keyless,
                total.truncates,
                watermark,
                (time.monotonic() - t0) * 1e3,
                extra=extra,
            )
