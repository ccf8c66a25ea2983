"""The apply loop: what each micro-batch does (:class:`ApplyBatch`, the ``foreachBatch``
function, on the driver) and how one partition is applied (:func:`apply_partition`, in the
Python workers).

A micro-batch is one Spark stage with a task per Kafka partition (per key-hash partition
with ``--min-partitions``): ``DataFrame.mapInArrow`` hands each task its partition as Arrow
batches (:mod:`spark_jobs.transfer` turns them into dicts and sends the task's stats back);
with ``spark.read = "direct"`` the batch's frame is its offset ranges and the tasks of a
plain RDD (no Spark SQL plan), a task a core, read the ranges from Kafka themselves, up to
``spark.ranges_at_once`` at a time each (:mod:`spark_jobs.kafka_direct`,
:func:`apply_ranges`). Each
task, in parallel: with ``spark.parse = "python"`` parses its raw Kafka records
itself, once each (:mod:`spark_jobs.parse`; with ``"jvm"`` Spark SQL parsed them before,
:mod:`spark_jobs.transforms`); reduces its rows to the newest event per key
(:func:`~spark_jobs.reduce.latest_per_key`: the batch's one reduction); builds each change
once and applies it through each follower's sink (one for ``cache_sync``/``search_sync``,
those ``spark_jobs/sync.py --followers`` names for the shared job; every write carries an
LSN-derived version, so a replay can never go backwards); each follower dead-letters, under
its own job name, the unparseable records and what its sink refused for good. Once every
task is done the driver records each follower's watermark.

No record stops a job: one that cannot become a change (a key that is not JSON, a c/u/r
event without ``after``, a value its schema cannot decode) or that the sink refuses for good
goes to the dead-letter topic with the reason, and the rest of the batch is applied.
Records of keyless tables (null key) and Debezium ``t`` events (the reader also writes a
delete per removed row) are skipped and counted, with one log line per batch. Only what no
later record could get past stops the job: every follower unreachable for
``spark.follower_retry_s`` (with several, one that stays down falls behind instead, and
catches up later: :class:`ApplyBatch`), or a commit LSN beyond what the followers can
order. Spark commits the batch's
offsets to the checkpoint after :class:`ApplyBatch` returns, so a crash anywhere replays
the batch: the versions make the replay harmless.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import DataFrame, SparkSession

from pgcdc.core.errors import ConfigError, RetryableSinkError, SinkError
from pgcdc.core.kafka_config import client_config
from pgcdc.core.settings import Settings, ValueFormat
from pgcdc.core.spark_settings import ApplyPath, DirectPlanner, ParsePath, ReadPath
from sinks.base import Change, OnePerKey, Outcome, Sink
from spark_jobs import behind, dead_letter, planner_workers
from spark_jobs.changes import ChangeBuilder, RecordError
from spark_jobs.fast_changes import NativeParts, native_message_parts
from spark_jobs.gc_pause import gc_paused, thaw
from spark_jobs.interrupt import BatchInterrupted
from spark_jobs.kafka_direct import (
    Range,
    RangeMessages,
    kafka_source_ranges,
    plan_ranges,
    range_starts,
    read_range,
    spread_ranges,
)
from spark_jobs.metrics import JobMetrics
from spark_jobs.options import JobOptions
from spark_jobs.parse import RecordParser, parsed_after
from spark_jobs.progress import AVAILABLE_NOW_BATCH_RECORDS
from spark_jobs.reduce import latest_per_key
from spark_jobs.source import catch_up_records, direct_planner
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

# Only named in annotations: the Arrow tasks have it imported (PySpark's serializer), the
# direct ones need none (and it starts threads at import: spark_jobs.daemon).
if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

# Builds a job's sink from the settings (the sink's ``from_settings``).
SinkFactory = Callable[[Settings], Sink]

_CHUNK = 2000  # changes per sink.apply call
_MAX_PAUSE_S = 15.0  # longest wait between two runs of a batch during an outage
_PROBE_EVERY_S = 2.0  # how often a follower that is behind is asked whether it answers
_SPANS_KEPT = 200  # batches whose ranges' spans the progress line may still ask (ApplyBatch.spans)


def unreachable_reason(e: BaseException) -> str | None:
    """The line saying the follower is unreachable, if ``e`` (a failed Spark job, whose
    text carries the Python workers' tracebacks) came from a :class:`RetryableSinkError`."""
    marker = RetryableSinkError.__name__ + ": "
    for line in str(e).splitlines():
        at = line.find(marker)
        if at >= 0:
            return line[at + len(marker) :].strip()[:300]
    return None


@dataclass(frozen=True)
class Follower:
    """A follower a job applies to: its job name (its watermark, its dead letters, its
    metrics) and how its sink is built."""

    job: str
    make_sink: SinkFactory


_SINKS: dict[tuple[str, str, int], Sink] = {}


def _sink_key(settings: Settings, job: str, slot: int = 0) -> tuple[str, str, int]:
    return (job, settings.model_dump_json(), slot)


def cached_sink(settings: Settings, job: str, make_sink: SinkFactory, slot: int = 0) -> Sink:
    """One sink per job in each Python worker, and per ``slot`` (a range a task applies
    beside another: :func:`apply_ranges`; a sink serves one thread): Spark reuses its
    workers across tasks and batches, so connections, loaded scripts and known indices
    outlive a micro-batch."""
    key = _sink_key(settings, job, slot)
    sink = _SINKS.get(key)
    if sink is None:
        sink = _SINKS[key] = make_sink(settings)
    return sink


def drop_sink(settings: Settings, job: str, slot: int = 0) -> None:
    """Close ``job``'s cached sink of ``slot``: one in an unknown state is not reused (the
    next use builds a new one)."""
    sink = _SINKS.pop(_sink_key(settings, job, slot), None)
    if sink is not None:
        sink.close()
        thaw()  # its cycles, frozen after an earlier task, are garbage now


@dataclass
class _Target:
    """One follower of a task: its sink, its counts, its refusals, and whether it was
    found unreachable (then it gets nothing more in this task)."""

    follower: Follower
    stats: BatchStats
    refused: list[dead_letter.DeadLetter] = field(default_factory=list)
    sink: Sink | None = None
    unreachable: str | None = None

    def writer(self) -> Sink:
        """The follower's sink (opened when the task starts)."""
        assert self.sink is not None
        return self.sink


class _Targets:
    """The task's followers; :meth:`each` runs an action on each one still reachable, one
    after the other, and :meth:`each_concurrently` in a thread per follower."""

    def __init__(self, settings: Settings, followers: Sequence[Follower], slot: int = 0) -> None:
        self.settings = settings
        self.slot = slot  # whose sinks (cached_sink)
        self.all = [_Target(f, BatchStats(job=f.job)) for f in followers]
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: dict[int, Future[None]] = {}
        self.each(self._open)

    def _open(self, target: _Target) -> None:
        target.sink = cached_sink(
            self.settings, target.follower.job, target.follower.make_sink, self.slot
        )

    def each(self, action: Callable[[_Target], None]) -> None:
        """``action(target)`` for each reachable one, in this thread, once every action
        :meth:`each_concurrently` started has ended. One that turns out unreachable
        (:class:`RetryableSinkError`) is marked and its sink dropped; the others go on.
        Any other error fails the task (its sink dropped too)."""
        self.settle()
        for target in self.all:
            if target.unreachable is None:
                self._outcome(target, action)

    def each_concurrently(self, action: Callable[[_Target], None]) -> None:
        """As :meth:`each`, but ``action(target)`` runs in a thread of the target's own and
        this returns once each one has started: a target's previous action ends before its
        next starts (its chunks stay in order), while the caller prepares the next. Outcomes
        are taken as in :meth:`each`, when the target's next action starts or at
        :meth:`settle`."""
        if len(self.all) < 2:
            self.each(action)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(len(self.all), thread_name_prefix="follower")
        for i, target in enumerate(self.all):
            self._settle_one(i)
            if target.unreachable is None:
                self._inflight[i] = self._pool.submit(action, target)

    def idle(self) -> bool:
        """Whether every action :meth:`each_concurrently` started has ended (its outcome
        is taken later, as ever)."""
        return all(f.done() for f in self._inflight.values())

    def settle(self) -> None:
        """Wait for each action :meth:`each_concurrently` started, and take its outcome; the
        first error that fails the task is raised once every action has ended."""
        failure: BaseException | None = None
        for i in list(self._inflight):
            try:
                self._settle_one(i)
            except BaseException as e:
                failure = failure or e
        if failure is not None:
            raise failure

    def close(self) -> None:
        """Wait for what is still running and end the threads. Once the task has failed,
        what else failed meanwhile only drops its sink (:meth:`_outcome`)."""
        for i in list(self._inflight):
            with contextlib.suppress(BaseException):  # the task's own failure is raised
                self._settle_one(i)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _settle_one(self, i: int) -> None:
        future = self._inflight.pop(i, None)
        if future is not None:
            self._outcome(self.all[i], lambda _t: future.result())

    def _outcome(self, target: _Target, action: Callable[[_Target], None]) -> None:
        try:
            action(target)
        except RetryableSinkError as e:
            drop_sink(self.settings, target.follower.job, self.slot)
            target.unreachable = str(e)[:300] or type(e).__name__
        except BaseException:
            drop_sink(self.settings, target.follower.job, self.slot)
            raise


def apply_partition(
    settings: Settings,
    followers: Sequence[Follower],
    rows: Iterable[Mapping[str, Any]],
    slot: int = 0,
) -> Iterator[BatchStats]:
    """Apply one partition of the reduced batch to each follower; yields each follower's
    stats (``job`` names it).

    Each change is built once and goes to every follower, in chunks; records nobody can
    apply (unparseable, undecodable) are dead-lettered by each follower under its own job
    name, as are those its sink refused for good; records of keyless tables and truncate
    events are counted and skipped; heartbeats only raise the partition's heartbeat LSN.
    A follower that is unreachable (:class:`RetryableSinkError`) does not stop the others:
    its stats say ``unreachable`` and the driver runs the batch again for it alone.
    ``slot`` says whose sinks it writes with (:func:`cached_sink`).
    """
    # Schema rows may come after the changes that need them: read the partition first.
    rows = list(rows)
    schemas = {row["schema_id"]: row["schema_json"] for row in rows if row["kind"] == SCHEMA}
    targets = _Targets(settings, followers, slot)
    try:
        yield from _apply_rows(settings, targets, schemas, rows)
    finally:
        targets.close()


def _apply_rows(
    settings: Settings,
    targets: _Targets,
    schemas: Mapping[Any, Any],
    rows: Sequence[Mapping[str, Any]],
) -> Iterator[BatchStats]:
    """:func:`apply_partition`'s work, its targets open."""
    each_chunk = _chunks_to(settings, targets)
    build = ChangeBuilder(schemas, functools.partial(_register, targets))
    common = BatchStats()  # what every follower counts alike
    unreadable: list[dead_letter.DeadLetter] = []
    chunk: list[Change] = []
    where: list[tuple[str, int, int]] = []  # each change's Kafka record

    for row in rows:
        kind = row["kind"]
        if kind == CHANGE:
            common.newest_commit_ms = max(common.newest_commit_ms, row["source_ts_ms"] or 0)
            try:
                chunk.append(build(row))
            except RecordError as e:
                unreadable.append(_unreadable(row, str(e)))
                continue
            except SinkError:
                raise  # no later change could be ordered either: the job stops
            except Exception as e:  # a record never stops the job: dead-lettered
                reason = f"cannot build the change: {type(e).__name__}: {e}"
                unreadable.append(_unreadable(row, reason[:1000]))
                continue
            where.append((row["topic"], row["partition"], row["offset"]))
            if len(chunk) >= _CHUNK:
                each_chunk([(chunk, where)])
                chunk, where = [], []
        elif kind == HEARTBEAT:
            common.heartbeat_lsn = max(common.heartbeat_lsn, row["heartbeat_lsn"] or 0)
        elif kind == KEYLESS:
            common.keyless += 1
            common.keyless_tables.add(row["table"])
        elif kind == TRUNCATE:
            common.truncates += 1
        elif kind == DEAD:
            unreadable.append(_unreadable(row, row["parse_error"]))
    if chunk:
        each_chunk([(chunk, where)])
    yield from _settled(settings, targets, common, unreadable)


def apply_parts(
    settings: Settings, followers: Sequence[Follower], parts: NativeParts, slot: int = 0
) -> Iterator[BatchStats]:
    """Apply one range's changes built natively a part at a time
    (:class:`spark_jobs.fast_changes.NativeParts`) to each follower, as
    :func:`apply_partition` applies the same changes' rows: the table's schema registered
    with its first written change, chunk after chunk; each follower's stats, which count
    the changes taken (``native``).

    With the followers written concurrently (``spark.concurrent_followers``, more than
    one), what the parts added so far reduce to is taken and handed to the followers
    whenever each is done with what it was handed before, and the next parts are read and
    built meanwhile: a follower writes while the task builds. The more the followers lag,
    the more each take reduces; each key's newest change is written last, as the followers'
    versions require. Otherwise the range is taken once, whole.

    A part with a record off the native path ends it (False from
    :meth:`~spark_jobs.fast_changes.NativeParts.add_next`): what was handed stays written,
    the rest of the range is the Python path's, from ``parts.taken_to``. ``slot``: as
    :func:`apply_partition`'s."""
    targets = _Targets(settings, followers, slot)
    try:
        each_chunk = _chunks_to(settings, targets)
        pipelined = settings.spark.concurrent_followers and len(targets.all) > 1
        registered = False
        newest = 0
        while True:
            added = parts.add_next()
            if added is False:
                break
            if added and not (pipelined and targets.idle()):
                continue
            changes, where, ts = parts.take()
            newest = max(newest, ts)
            if not registered:
                first = next((c for c in changes if c.doc is not None), None)
                if first is not None:
                    registered = True
                    _register(targets, parts.table, parts.schema, first.commit_lsn)
            if changes:
                each_chunk(
                    [
                        (OnePerKey(changes[at : at + _CHUNK]), where[at : at + _CHUNK])
                        for at in range(0, len(changes), _CHUNK)
                    ]
                )
            if added is None:
                break
        common = BatchStats(newest_commit_ms=newest, native=parts.taken)
        yield from _settled(settings, targets, common, [])
    finally:
        targets.close()


def _register(targets: _Targets, table: str, schema: Mapping[str, Any], since_lsn: int) -> None:
    """Tell every follower ``table``'s value schema, in force from ``since_lsn``."""
    targets.each(lambda t: t.writer().register_schema(table, schema, since_lsn))


_Where = list[tuple[str, int, int]]  # the Kafka positions of a chunk's records


def _chunks_to(
    settings: Settings, targets: _Targets
) -> Callable[[Sequence[tuple[Sequence[Change], _Where]]], None]:
    """What hands chunks of changes (each with its records' Kafka positions) to every
    follower, each applying them one after the other: in a thread each
    (``spark.concurrent_followers``: the caller goes on meanwhile), or one follower after
    the other."""
    each = targets.each_concurrently if settings.spark.concurrent_followers else targets.each

    def to_each(chunks: Sequence[tuple[Sequence[Change], _Where]]) -> None:
        def apply(t: _Target) -> None:
            for chunk, where in chunks:
                _apply_chunk(t.writer(), t.follower.job, chunk, where, t.stats, t.refused)

        each(apply)

    return to_each


def _settled(
    settings: Settings,
    targets: _Targets,
    common: BatchStats,
    unreadable: list[dead_letter.DeadLetter],
) -> Iterator[BatchStats]:
    """Once every chunk is applied: each follower's dead letters published and its stats
    (``common`` added), or that it was unreachable."""
    targets.settle()

    def publish(t: _Target) -> None:
        letters = [*unreadable, *t.refused]
        if letters:
            t.stats.dead_lettered += dead_letter.publish(settings, t.follower.job, letters)

    targets.each(publish)
    for t in targets.all:
        if t.unreachable is not None:
            yield BatchStats(job=t.follower.job, unreachable=t.unreachable)
        else:
            t.stats.add(common)
            yield t.stats


def apply_events(
    settings: Settings, followers: Sequence[Follower], rows: Iterable[Mapping[str, Any]]
) -> Iterator[BatchStats]:
    """Reduce one partition of the classified frame to the newest event per key
    (:func:`spark_jobs.reduce.latest_per_key`) and apply it (:func:`apply_partition`)."""
    return apply_partition(settings, followers, latest_per_key(rows))


def apply_arrow(
    settings: Settings, followers: Sequence[Follower], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: :func:`apply_events` over one partition's Arrow batches
    (all of them: the reduction sees the whole partition); yields the task's stats. The
    garbage collector is paused meanwhile (:mod:`spark_jobs.gc_pause`)."""
    with gc_paused():
        stats = stats_batch(apply_events(settings, followers, rows_from_arrow(batches)))
    yield stats


def apply_records_arrow(
    settings: Settings,
    followers: Sequence[Follower],
    heartbeat_topic: str | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function with ``spark.parse = "python"``: the partition's raw Kafka
    records parsed here, once each (:mod:`spark_jobs.parse`; Avro read first when the
    settings say so), then as :func:`apply_arrow`."""
    with gc_paused():
        rows = record_parser(settings, heartbeat_topic).rows(records_from_arrow(batches))
        stats = stats_batch(apply_events(settings, followers, rows))
    yield stats


def record_parser(settings: Settings, heartbeat_topic: str | None) -> RecordParser:
    """The parser of a task's raw records (Avro read first when the settings say so)."""
    schema = settings.schema_
    transcode = None
    if schema.value_format is ValueFormat.AVRO:
        # Imported here: the Avro reader and the registry's client cost a JSON job's every
        # Python worker about 0.14 s of CPU to import.
        from spark_jobs.avro_input import transcoder_for

        transcode = transcoder_for(schema).transcode
    return RecordParser(settings.kafka.topic_prefix, heartbeat_topic, transcode)


def apply_ranges(
    settings: Settings,
    followers: Sequence[Follower],
    heartbeat_topic: str | None,
    ranges: Sequence[Range],
    ids: Iterable[int],
) -> Iterator[BatchStats]:
    """The task function with ``spark.read = "direct"``: ``ids`` are indices into the
    batch's offset ``ranges`` (the task's share: :meth:`ApplyBatch._range_tasks`), each range
    read from Kafka here (:func:`spark_jobs.kafka_direct.read_range`), parsed, reduced and
    applied, the garbage collector paused meanwhile (:mod:`spark_jobs.gc_pause`); each
    follower's stats of each range.

    Up to ``spark.ranges_at_once`` ranges are applied at once, each in a thread with sinks of
    its own (its *slot*: :func:`cached_sink`); a range's records stay in order, and ranges
    are Kafka partitions, whose keys no other range holds. The first range that fails fails
    the task, once the ranges under way have ended (no other is started)."""
    ids = list(ids)
    at_once = min(settings.spark.ranges_at_once, len(ids))
    conf = client_config(settings.kafka)

    def one(i: int, slot: int) -> list[BatchStats]:
        return _apply_range(settings, followers, heartbeat_topic, conf, ranges[i], slot)

    if at_once <= 1:
        for i in ids:
            with gc_paused():
                done = one(i, 0)
            yield from done
        return
    with gc_paused():
        by_range = _concurrently(ids, at_once, one)
    for i in ids:
        yield from by_range[i]


def _apply_range(
    settings: Settings,
    followers: Sequence[Follower],
    heartbeat_topic: str | None,
    conf: Mapping[str, str],
    r: Range,
    slot: int,
) -> list[BatchStats]:
    """Each follower's stats of range ``r``, applied with ``slot``'s sinks: natively what
    that path takes (:func:`_native_part`), the rest the Python way."""
    done: list[BatchStats] = []
    left: Range | None = r
    native = settings.spark.apply is ApplyPath.NATIVE
    if native and settings.schema_.value_format is not ValueFormat.AVRO:
        done, left = _native_part(settings, followers, heartbeat_topic, conf, r, slot)
    if left is not None:
        records = read_range(conf, left, keep=settings.spark.ranges_at_once)
        rows = record_parser(settings, heartbeat_topic).rows(records)
        done += apply_partition(settings, followers, latest_per_key(rows), slot)
    return done


def _concurrently(
    ids: Sequence[int], at_once: int, run: Callable[[int, int], list[BatchStats]]
) -> dict[int, list[BatchStats]]:
    """``run(i, slot)`` for each of ``ids``, in ``at_once`` threads (``slot`` says which),
    each taking the next id when its last one is done; what each returned, by id. After a
    failure no id is started, and the first failure is raised once the others have ended."""
    pending = collections.deque(ids)
    done: dict[int, list[BatchStats]] = {}
    failures: list[BaseException] = []
    lock = threading.Lock()

    def take(slot: int) -> None:
        while True:
            with lock:
                if failures or not pending:
                    return
                i = pending.popleft()
            try:
                done[i] = run(i, slot)
            except BaseException as e:
                with lock:
                    failures.append(e)
                return

    threads = [
        threading.Thread(target=take, args=(slot,), name=f"range-{slot}", daemon=True)
        for slot in range(at_once)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return done


def _stats(s: object) -> BatchStats:
    """A task's stats, checked as :func:`spark_jobs.transfer.stats_from_rows` checks them."""
    if not isinstance(s, BatchStats):
        raise TypeError(f"a task returned {type(s).__name__}, not BatchStats")
    return s


def _native_part(
    settings: Settings,
    followers: Sequence[Follower],
    heartbeat_topic: str | None,
    conf: Mapping[str, str],
    r: Range,
    slot: int = 0,
) -> tuple[list[BatchStats], Range | None]:
    """What of ``r`` the native path applies (:func:`apply_parts`): each follower's stats
    of it, and what is left of ``r`` for the Python path (None: nothing; ``r`` itself when
    the range is not for the native path)."""
    messages = RangeMessages(conf, r, keep=settings.spark.ranges_at_once)
    try:
        parser = record_parser(settings, heartbeat_topic)
        parts = native_message_parts(parser, messages, heartbeat_topic)
        if parts is None:
            return [], r
        done = list(apply_parts(settings, followers, parts, slot))
        if parts.whole:
            return done, None
        return done, Range(r.topic, r.partition, parts.taken_to, r.end)
    finally:
        messages.close()  # its consumer, kept unless Kafka failed (the range may be left part way)


def _apply_chunk(
    sink: Sink,
    job: str,
    chunk: Sequence[Change],
    where: Sequence[tuple[str, int, int]],
    stats: BatchStats,
    refused: list[dead_letter.DeadLetter],
) -> None:
    """Apply ``chunk`` (``where``: its records' Kafka positions), counting outcomes;
    refusals join ``refused``. A failure worth retrying raises :class:`RetryableSinkError`
    (the follower's counts of this task are then void)."""
    results = sink.apply(chunk)
    if len(results) != len(chunk):
        raise ValueError(f"{job}: {len(results)} results for {len(chunk)} changes")
    # Counted in C: nearly every change is applied or skipped.
    outcomes = [res.outcome for res in results]
    applied = outcomes.count(Outcome.APPLIED)
    skipped = outcomes.count(Outcome.SKIPPED)
    if applied + skipped < len(results):
        for change, (topic, partition, offset), res in zip(chunk, where, results, strict=True):
            if res.outcome is Outcome.APPLIED or res.outcome is Outcome.SKIPPED:
                continue
            if res.retryable:
                raise RetryableSinkError(f"{job}: {res.table}/{res.key}: {res.reason}")
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
    stats.applied += applied
    stats.skipped += skipped
    stats.max_commit_lsn = max(stats.max_commit_lsn, max(map(_commit_lsn, chunk), default=0))


_commit_lsn = operator.attrgetter("commit_lsn")


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


class _QuietProbe(logging.Filter):
    """Keeps a background probe's failed attempts (a sink logs each, with its traceback)
    out of the job's log: the batch lines say that a follower is behind."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.threadName or "").startswith("probe-") or record.levelno >= logging.ERROR


def _quiet_probes() -> None:
    """Install :class:`_QuietProbe` on the root logger's handlers (once each)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _QuietProbe) for f in handler.filters):
            handler.addFilter(_QuietProbe())


def _local_offsets_log(checkpoint: str) -> Path | None:
    """The checkpoint's offsets log as a local directory, or None (``hdfs://`` and the like)."""
    try:
        return behind.local_dir(checkpoint) / "offsets"
    except ConfigError:
        return None


class ApplyBatch:
    """The ``foreachBatch`` function: apply the micro-batch in the workers to each follower,
    then record each follower's watermark. Its frame is ``batch.events(<the Kafka stream>)``.

    With several followers (spark_jobs/sync.py) each task parses and reduces its partition
    once and applies it to every follower. A follower that is unreachable gets the batch
    again, alone (the others' writes are not repeated), with backoff. When it stays
    unreachable for ``spark.follower_behind_after_s`` while another follower applied the
    batch, it falls *behind* (:mod:`spark_jobs.behind`): the others go on without it, its
    watermark stays where it is, and once it answers again (probed in the background) a
    batch read of the Kafka range it missed is applied to it alone, with the same task
    code, before it rejoins. The job stops (one line saying why) only when no follower has
    been reachable for ``spark.follower_retry_s``.
    """

    def __init__(
        self,
        settings: Settings,
        opts: JobOptions,
        make_sink: SinkFactory | None = None,
        followers: Sequence[Follower] = (),
    ) -> None:
        self.settings = settings
        self.opts = opts
        if not followers:
            if make_sink is None:
                raise ValueError("a job needs a sink or followers")
            followers = (Follower(opts.name, make_sink),)
        self.followers = tuple(followers)
        # Heartbeats give an exact watermark (spark_jobs.watermark); without them, the
        # highest applied commit LSN stands in (approximate across partitions).
        self.exact = opts.heartbeat_topic is not None
        self.watermarks = Watermark()
        # The query's last progress report (set by the job once the query started): under
        # a rate limit it tells whether the previous batch reached the end of the topics.
        self.last_progress: Callable[[], Mapping[str, Any] | None] = lambda: None
        self._progress_seen: tuple[int, Mapping[str, Any] | None] | None = None
        self.metrics = JobMetrics(*(f.job for f in self.followers))
        self.outage_retries = 0  # batches run again because a follower was unreachable
        self.catch_ups = 0  # followers caught up on what they missed while behind
        # The direct read: where the current batch's ranges start (a batch's start offsets
        # for a source that logs no initial offsets: spark_jobs.behind.batch_start).
        self.read_from: behind.Offsets | None = None
        # The direct read: the offsets each recent batch's ranges spanned (the progress line's
        # records: spark_jobs.progress.ProgressLog).
        self.spans: dict[int, int] = {}
        # Set when the job is asked to stop (Ctrl-C: spark_jobs.interrupt).
        self.stopping = threading.Event()
        # Who is behind since where (several followers only: one alone never falls behind).
        self._state_dir = behind.local_dir(opts.checkpoint) if len(self.followers) > 1 else None
        # (A follower this run does not apply to keeps its entry, untouched.)
        self.behind = behind.load(self._state_dir) if self._state_dir else {}
        self._answering: dict[str, threading.Event] = {}
        self._planners_stopped = False  # the direct read's (spark_jobs.planner_workers)
        # Whether to stop them once planned: only where this is the process's one query (a
        # job's spark-submit). In a session of several queries another one may be planning
        # its source with them at that moment, and its planner call would end with the
        # worker (a Python worker crash, seen in the tests' shared session).
        self.stop_planners = False
        # The direct read's ranges come from the checkpoint's offsets log when it is a local
        # directory (_logged_ranges); the batch running now.
        self._offsets_log = _local_offsets_log(opts.checkpoint)
        self._dynamic: bool | None = None  # Spark's dynamic allocation (_task_groups)
        self.planner = direct_planner(settings, opts.checkpoint)  # with spark.read = direct
        self.batch_id: int | None = None
        self._said_logged = False
        for f in self.followers:
            if f.job in self.behind:
                self._probe(f.job)

    def _follower(self, job: str) -> Follower:
        return next(f for f in self.followers if f.job == job)

    def _tasks(self, events: DataFrame, followers: Sequence[Follower]) -> dict[str, BatchStats]:
        """Run the batch's tasks once for ``followers``: each follower's summed stats, with
        ``unreachable`` set for one that was unreachable in any task."""
        fs = tuple(followers)
        if self.settings.spark.read is ReadPath.DIRECT:
            # The frame holds the batch's offset ranges, which the checkpoint's offsets log
            # says too (:meth:`_logged_ranges`); else they are collected first. Then a task
            # each reads its range. Not mapInArrow over the source's frame itself: each task
            # would then hold two Python workers, the source's and the apply's.
            ranges: list[Range] | None
            if self.planner is DirectPlanner.KAFKA:
                # The frame is Spark's Kafka source's, whose records no task may read here.
                ranges = self._kafka_source_ranges(self.batch_id)
            else:
                ranges = self._logged_ranges(self.batch_id)
            if ranges is None:
                ranges = [Range.of(row) for row in events.collect()]
            self.read_from = range_starts(ranges)
            if self.batch_id is not None:
                self.spans[self.batch_id] = sum(r.end - r.start for r in ranges)
                self.spans.pop(self.batch_id - _SPANS_KEPT, None)
            if self.stop_planners and not self._planners_stopped:
                # The source is planned (Spark did it before it called this): they idle from
                # now on.
                self._planners_stopped = True
                planner_workers.stop(events.sparkSession)
            return self._range_tasks(events.sparkSession, ranges, fs)
        apply = (
            functools.partial(apply_records_arrow, self.settings, fs, self.opts.heartbeat_topic)
            if self.settings.spark.parse is ParsePath.PYTHON
            else functools.partial(apply_arrow, self.settings, fs)
        )
        # One stage, a task per Kafka partition (or per key-hash partition): each task
        # reduces and applies its own keys; the driver only gathers the counts.
        return self._totals(fs, stats_from_rows(events.mapInArrow(apply, STATS_SCHEMA).collect()))

    def _logged_ranges(self, batch_id: int | None) -> list[Range] | None:
        """Batch ``batch_id``'s offset ranges, planned as the source plans them
        (:func:`plan_ranges` of Spark's start and end offsets: the previous batch's entry of
        the checkpoint's offsets log and this batch's, which Spark writes before it runs
        the batch), so that no Spark job collects them; None when the log cannot say (a
        checkpoint that is not a local directory; an entry that cannot be read; the first
        batch of a run not from ``earliest``, whose start Spark does not log for this
        source).

        The first batch from ``earliest`` starts at each partition's log start, which no log
        holds either: it is read from offset 0, the same records, since the task's consumer
        goes on from the log start (``auto.offset.reset``; retention only moves it up). A
        fresh job or a rebuild over a backlog then runs no Spark job to collect its ranges,
        nor the source's read with its Python workers (measured: 1-2 s of CPU)."""
        if batch_id is None or self._offsets_log is None:
            return None
        if batch_id == 0 and self.opts.starting_offsets != "earliest":
            return None
        try:
            end = self._logged(batch_id)
            start = (
                self._logged(batch_id - 1)
                if batch_id
                else {t: dict.fromkeys(parts, 0) for t, parts in end.items()}
            )
        except (OSError, ValueError) as e:
            log.debug("batch %d: ranges collected (offsets log: %s)", batch_id, e)
            return None
        if not self._said_logged:
            self._said_logged = True
            log.info(
                "batch %d: the offset ranges come from the checkpoint's offsets log from now "
                "on (no Spark job collects them)",
                batch_id,
                extra={"job": self.opts.name, "batch_id": batch_id},
            )
        return plan_ranges(start, end)

    def _kafka_source_ranges(self, batch_id: int | None) -> list[Range]:
        """Batch ``batch_id``'s offset ranges as Spark's Kafka source planned them
        (``spark.direct_planner = kafka``): from its start, the previous batch's entry of
        the offsets log or, for the first batch, the initial offsets the source logs
        (``sources/0/0``), to this batch's entry (:func:`kafka_source_ranges`)."""
        if batch_id is None or self._offsets_log is None:
            raise ConfigError(
                "spark.direct_planner = kafka takes each batch's ranges from the checkpoint's "
                f"offsets log, which {self.opts.checkpoint} does not hold as a local directory"
            )
        checkpoint = self._offsets_log.parent
        try:
            end = self._logged(batch_id)
            if batch_id:
                start = self._logged(batch_id - 1)
            else:
                initial = checkpoint / "sources" / "0" / "0"
                start = behind.logged_offsets(initial.read_text(errors="replace"))
        except (OSError, ValueError) as e:
            raise RuntimeError(
                f"batch {batch_id}: the checkpoint's offsets log does not say the batch's "
                f"offsets ({e}); the job stops rather than read the records through the JVM"
            ) from e
        ranges, again = kafka_source_ranges(start, end)
        for line in again:
            log.warning(
                "batch %d: read from its log start: %s",
                batch_id,
                line,
                extra={"job": self.opts.name, "batch_id": batch_id},
            )
        return ranges

    def _logged(self, batch_id: int) -> behind.Offsets:
        assert self._offsets_log is not None
        return behind.logged_offsets(
            (self._offsets_log / str(batch_id)).read_text(errors="replace")
        )

    def _range_tasks(
        self, spark: SparkSession, ranges: Sequence[Range], followers: Sequence[Follower]
    ) -> dict[str, BatchStats]:
        """The batch's tasks over its offset ranges (``spark.read = "direct"``), as
        :meth:`_tasks`: a task a range, or with ``spark.ranges_at_once`` above 1, the ranges
        spread over a task a core (:func:`spread_ranges`), each task applying up to that many
        at once (:func:`apply_ranges`): a task that waits on its followers then leaves its
        core to a range of its own, and the last range of a batch does not run alone."""
        fs = tuple(followers)
        if not ranges:
            return self._totals(fs, [])
        # A task per group of range indices: the groups parallelized make each group a
        # partition of its own in the task itself (no data shipped, no shuffle). An RDD, not
        # a frame (spark.range(...).mapInArrow): no plan for Spark SQL to analyze and
        # optimize, and no Arrow runner per task, each batch. Measured at 1,000 changes/s
        # (the shared job, 200 ms triggers): the JVM's CPU fell from 6.7 to 5.3 s in 25 s.
        groups = self._task_groups(spark, ranges)
        apply = functools.partial(
            apply_ranges, self.settings, fs, self.opts.heartbeat_topic, tuple(ranges)
        )
        tasks = spark.sparkContext.parallelize(groups, len(groups))
        done = tasks.mapPartitions(lambda gs: apply(i for g in gs for i in g)).collect()
        return self._totals(fs, [_stats(s) for s in done])

    def _task_groups(self, spark: SparkSession, ranges: Sequence[Range]) -> list[list[int]]:
        """The range indices of each task: spread over a task a core with
        ``spark.ranges_at_once`` above 1 (the cores Spark has now, each batch: executors come
        and go), else a task a range. With dynamic allocation a task a range too: Spark asks
        for executors by the tasks waiting, and a task a core would never ask for more."""
        sc = spark.sparkContext
        if self.settings.spark.ranges_at_once > 1:
            if self._dynamic is None:
                conf = sc.getConf().get("spark.dynamicAllocation.enabled", "false")
                self._dynamic = conf.strip().lower() == "true"
            if not self._dynamic:
                return spread_ranges(ranges, sc.defaultParallelism)
        return [[i] for i in range(len(ranges))]

    @staticmethod
    def _totals(fs: Sequence[Follower], tasks: Iterable[BatchStats]) -> dict[str, BatchStats]:
        """Each follower's summed stats of a batch's tasks, with ``unreachable`` set for
        one that was unreachable in any task."""
        totals = {f.job: BatchStats(job=f.job) for f in fs}
        for stats in tasks:
            total = totals[stats.job]
            if stats.unreachable:
                total.unreachable = total.unreachable or stats.unreachable
            else:
                total.add(stats)
        return totals

    def _apply(
        self, events: DataFrame, batch_id: int, followers: Sequence[Follower]
    ) -> dict[str, BatchStats]:
        """Apply the batch to ``followers`` (again to those unreachable: :meth:`_each`);
        the stats of those that got it."""
        done: dict[str, BatchStats] = {}

        def run(pending: Sequence[Follower]) -> dict[str, str]:
            failed: dict[str, str] = {}
            for job, total in self._tasks(events, pending).items():
                if total.unreachable:
                    failed[job] = total.unreachable
                else:
                    done[job] = total
            return failed

        self._each(batch_id, followers, run)
        return done

    def _each(
        self,
        batch_id: int,
        followers: Sequence[Follower],
        step: Callable[[Sequence[Follower]], dict[str, str]],
    ) -> None:
        """``step(followers)``, which returns the reasons of those it found unreachable;
        ``step`` again for those only, with backoff. One that stays unreachable for
        ``spark.follower_behind_after_s`` while another follower went on falls behind;
        when none went on, the job stops after ``spark.follower_retry_s``, saying why.
        Running a batch or a watermark write again is harmless: every write carries its
        version."""
        pending = list(followers)
        down_since: float | None = None
        attempt = 0
        while pending:
            try:
                failed = step(pending)
            except Exception as e:  # a task failed outright: unreachable, or a real error
                reason = str(e) if isinstance(e, RetryableSinkError) else unreachable_reason(e)
                if reason is None:
                    raise
                failed = {f.job: reason for f in pending}
            pending = [f for f in pending if f.job in failed]
            if not pending:
                return
            now = time.monotonic()
            if down_since is None:
                down_since = now
            going_on = [
                f.job for f in self.followers if f.job not in self.behind and f not in pending
            ]
            limit = (
                self.settings.spark.follower_behind_after_s
                if going_on
                else self.settings.spark.follower_retry_s
            )
            jobs = ", ".join(f.job for f in pending)
            reason = "; ".join(dict.fromkeys(failed[f.job] for f in pending))
            extra = {"job": self.opts.name, "batch_id": batch_id}
            if now - down_since >= limit:
                if going_on:
                    self._fall_behind(batch_id, pending, now - down_since, going_on, reason)
                    return
                log.error(
                    "batch %d: %s stayed unreachable for %.0fs (spark.follower_retry_s): "
                    "stopping; a restart resumes here. %s",
                    batch_id,
                    jobs,
                    limit,
                    reason,
                    extra=extra,
                )
                raise RetryableSinkError(f"{jobs} unreachable: {reason}")
            delay = min(_MAX_PAUSE_S, 0.5 * 2**attempt, max(0.0, down_since + limit - now))
            attempt += 1
            self.outage_retries += 1
            log.warning(
                "batch %d: %s unreachable (%s); applying the batch again to %s in %.1fs "
                "(attempt %d; %s after %.0fs of this)",
                batch_id,
                jobs,
                reason,
                "it" if len(pending) == 1 else "them",
                delay,
                attempt + 1,
                "it falls behind" if going_on else "the job stops",
                limit,
                extra=extra,
            )
            time.sleep(delay)

    # -- followers behind ---------------------------------------------------------------

    def _fall_behind(
        self,
        batch_id: int,
        followers: Sequence[Follower],
        down_s: float,
        going_on: Sequence[str],
        reason: str,
    ) -> None:
        """Leave ``followers`` out from batch ``batch_id`` on; remember where they left."""
        assert self._state_dir is not None  # a single follower never falls behind
        since = behind.batch_start(self._state_dir, batch_id, self.read_from)
        for f in followers:
            self.behind[f.job] = behind.Behind(batch_id, since)
        behind.save(self._state_dir, self.behind)
        for f in followers:
            log.warning(
                "batch %d: %s is behind: unreachable for %.0fs (spark.follower_behind_after_s) "
                "while %s went on; it catches up from batch %d's offsets when it answers "
                "again (%s)",
                batch_id,
                f.job,
                down_s,
                ", ".join(going_on),
                batch_id,
                reason,
                extra={"job": self.opts.name, "batch_id": batch_id},
            )
            self._probe(f.job)

    def _probe(self, job: str) -> None:
        """Ask ``job``'s follower in the background, every few seconds, until it answers
        (a batch never waits for a follower that is behind)."""
        answered = self._answering[job] = threading.Event()
        follower = self._follower(job)
        _quiet_probes()

        def probe() -> None:
            while not self.stopping.is_set():
                try:
                    sink = follower.make_sink(self.settings)
                    try:
                        sink.read_watermark(job)
                    finally:
                        sink.close()
                except Exception as e:  # still unreachable (or not yet answering right)
                    log.debug("%s still unreachable: %s", job, e)
                else:
                    answered.set()
                    return
                self.stopping.wait(_PROBE_EVERY_S)

        threading.Thread(target=probe, name=f"probe-{job}", daemon=True).start()

    def _catch_up(self, events: DataFrame, batch_id: int) -> None:
        """Followers behind that answer again replay the Kafka range they missed, up to this
        batch's start, alone: one step (at most a batch's records) per batch; after the last
        one they rejoin (with this batch)."""
        assert self._state_dir is not None
        most = self.opts.max_offsets_per_trigger or AVAILABLE_NOW_BATCH_RECORDS
        for job, since in list(self.behind.items()):
            answered = self._answering.get(job)
            if answered is None or not answered.is_set():
                continue
            t0 = time.monotonic()
            span = behind.catch_up_range(
                since.offsets, behind.batch_start(self._state_dir, batch_id)
            )
            caught = BatchStats(job=job)
            reached: behind.Offsets = {}
            if span is not None:
                start, end = span
                reached = behind.catch_up_step(start, end, most)
                try:
                    caught = self._catch_up_step(events.sparkSession, job, start, reached)
                except Exception as e:
                    if unreachable_reason(e) is None:
                        raise
                    caught.unreachable = unreachable_reason(e)
                if caught.unreachable:
                    log.warning(
                        "batch %d: %s answered, then failed its catch-up: still behind (%s)",
                        batch_id,
                        job,
                        caught.unreachable,
                        extra={"job": self.opts.name, "batch_id": batch_id},
                    )
                    self._probe(job)
                    continue
            self.catch_ups += 1
            extra = {"job": self.opts.name, "batch_id": batch_id}
            if span is not None and reached != span[1]:
                self.behind[job] = behind.Behind(
                    since.since_batch, behind.advanced(since.offsets, reached)
                )
                behind.save(self._state_dir, self.behind)
                log.info(
                    "batch %d: %s catching up: replayed %s of the %s records it still "
                    "missed since batch %d (applied=%d skipped=%d, %.0f ms)",
                    batch_id,
                    job,
                    behind.records_between(span[0], reached),
                    behind.records_between(*span),
                    since.since_batch,
                    caught.applied,
                    caught.skipped,
                    (time.monotonic() - t0) * 1e3,
                    extra=extra,
                )
                continue
            del self.behind[job]
            behind.save(self._state_dir, self.behind)
            log.warning(
                "batch %d: %s caught up on batches %d to %d (applied=%d skipped=%d failed=%d "
                "dead_lettered=%d, %.0f ms); it rejoins",
                batch_id,
                job,
                since.since_batch,
                batch_id - 1,
                caught.applied,
                caught.skipped,
                caught.failed,
                caught.dead_lettered,
                (time.monotonic() - t0) * 1e3,
                extra=extra,
            )

    def _catch_up_step(
        self, spark: SparkSession, job: str, start: behind.Offsets, end: behind.Offsets
    ) -> BatchStats:
        """Apply the records from ``start`` up to ``end`` to ``job`` alone."""
        follower = [self._follower(job)]
        if self.settings.spark.read is ReadPath.DIRECT:
            return self._range_tasks(spark, plan_ranges(start, end), follower)[job]
        records = catch_up_records(spark, self.settings, self.opts, start, end)
        return self._tasks(self.events(records), follower)[job]

    def _previous_progress(self, batch_id: int) -> Mapping[str, Any] | None:
        """The query's last progress report as batch ``batch_id`` sees it (the report of a
        batch before it), asked once a batch: each ask is two py4j calls and the JVM's JSON
        of the report."""
        seen = self._progress_seen
        if seen is None or seen[0] != batch_id:
            seen = self._progress_seen = (batch_id, self.last_progress())
        return seen[1]

    def _watermark(self, batch_id: int, total: BatchStats) -> int:
        """The LSN to record after applying ``batch_id`` (0: nothing new); the rule is
        :mod:`spark_jobs.watermark`'s."""
        if not self.exact:
            return total.max_commit_lsn
        self.watermarks.seen(batch_id, total.heartbeat_lsn)
        if not self.opts.max_offsets_per_trigger:
            return self.watermarks.complete(batch_id)  # every batch is complete
        previous = self._previous_progress(batch_id)
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
        if self.settings.spark.read is ReadPath.DIRECT:
            return records  # the batch's offset ranges (spark_jobs.kafka_direct)
        if self.settings.spark.parse is ParsePath.PYTHON:
            # The records as Kafka gave them: each task parses its own (apply_records_arrow).
            raw = records.select(*RECORD_COLUMNS)
            return by_key(raw, self.opts.min_partitions, key="key")
        from spark_jobs.avro_input import avro_as_json

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

    def _record(self, followers: Sequence[Follower], watermark: int) -> dict[str, str]:
        """Record ``watermark`` for each of ``followers``; the reasons of those unreachable."""
        return self._on_driver(
            followers,
            lambda f: cached_sink(self.settings, f.job, f.make_sink),
            lambda f, sink: sink.record_watermark(f.job, watermark),
        )

    def _wrote(self, done: Mapping[str, BatchStats]) -> Iterator[tuple[Follower, int]]:
        """Each follower that got the batch, with the changes it applied."""
        for f in self.followers:
            if f.job in done:
                yield f, done[f.job].applied

    def _refresh(self, followers: Sequence[Follower]) -> dict[str, str]:
        """Make what ``followers`` were written searchable now (the search follower's
        ``refresh_indices``; a follower whose sink has none is skipped); the reasons of those
        unreachable."""

        def held(f: Follower) -> Sink | None:
            sink = cached_sink(self.settings, f.job, f.make_sink)
            return sink if hasattr(sink, "refresh_indices") else None

        return self._on_driver(followers, held, lambda _f, sink: sink.refresh_indices())  # type: ignore[attr-defined]

    def _maintain(self, followers: Sequence[Follower]) -> dict[str, str]:
        """Each follower's work between batches on the driver (``maintain``, when its sink
        has one: the search follower switches an index version that caught up); the reasons
        of those unreachable."""

        def held(f: Follower) -> Sink | None:
            # A sink the driver holds already (it wrote a watermark), or, when a setting asks
            # for work between batches (search.evolve_indices), a new one: no connection is
            # made for a batch that does not need one.
            sink = _SINKS.get(_sink_key(self.settings, f.job))
            if sink is None and self.settings.search.evolve_indices:
                sink = cached_sink(self.settings, f.job, f.make_sink)
            return sink if hasattr(sink, "maintain") else None

        return self._on_driver(followers, held, lambda _f, sink: sink.maintain())  # type: ignore[attr-defined]

    def _on_driver(
        self,
        followers: Sequence[Follower],
        sink_of: Callable[[Follower], Sink | None],
        step: Callable[[Follower, Sink], None],
    ) -> dict[str, str]:
        """``step`` with each follower's driver-side sink (none: skipped); the reasons of
        those unreachable. A sink that failed is dropped: the next use builds a new one."""
        failed: dict[str, str] = {}
        for f in followers:
            sink = sink_of(f)
            if sink is None:
                continue
            try:
                step(f, sink)
            except RetryableSinkError as e:
                drop_sink(self.settings, f.job)
                failed[f.job] = str(e)[:300]
            except BaseException:
                drop_sink(self.settings, f.job)
                raise
        return failed

    def _run(self, events: DataFrame, batch_id: int) -> None:
        t0 = time.monotonic()
        self.batch_id = batch_id
        if self.behind:
            self._catch_up(events, batch_id)
        current = [f for f in self.followers if f.job not in self.behind]
        done = self._apply(events, batch_id, current)
        seen = BatchStats()  # the same batch for every follower: its heartbeats and LSNs
        for stats in done.values():
            seen.heartbeat_lsn = max(seen.heartbeat_lsn, stats.heartbeat_lsn)
            seen.max_commit_lsn = max(seen.max_commit_lsn, stats.max_commit_lsn)
            seen.keyless, seen.keyless_tables = stats.keyless, stats.keyless_tables
        if self.settings.search.refresh_after_batch:
            # Before the watermark: what it covers is searchable (the search follower).
            self._each(
                batch_id,
                [f for f, n in self._wrote(done) if n and f.job not in self.behind],
                self._refresh,
            )
        watermark = self._watermark(batch_id, seen)
        if watermark:
            self._each(
                batch_id,
                [f for f in self.followers if f.job in done and f.job not in self.behind],
                lambda fs: self._record(fs, watermark),
            )
        self._each(
            batch_id,
            [f for f in self.followers if f.job in done and f.job not in self.behind],
            self._maintain,
        )
        seconds = time.monotonic() - t0
        extra = {"job": self.opts.name, "batch_id": batch_id}
        if seen.keyless:
            log.warning(
                "batch %d: skipped %d records of keyless tables %s (no key to apply them by; "
                "name key columns with CDC_POSTGRES__MESSAGE_KEY_COLUMNS)",
                batch_id,
                seen.keyless,
                ", ".join(sorted(seen.keyless_tables)),
                extra=extra,
            )
        for f in self.followers:
            self.metrics.behind.labels(f.job).set(1 if f.job in self.behind else 0)
            total = done.get(f.job)
            if total is None:
                continue  # behind
            marked = 0 if f.job in self.behind else watermark
            try:
                self.metrics.batch(total, seconds, marked, f.job)
            except Exception:  # metrics never stop a job
                log.exception("batch %d: metrics not updated", batch_id)
            if total.busy:
                log.info(
                    "batch %d: %sapplied=%d skipped=%d failed=%d dead_lettered=%d keyless=%d "
                    "truncates=%d watermark=%d%s (%.0f ms)",
                    batch_id,
                    f"{f.job} " if len(self.followers) > 1 else "",
                    total.applied,
                    total.skipped,
                    total.failed,
                    total.dead_lettered,
                    total.keyless,
                    total.truncates,
                    marked,
                    f" native={total.native}" if total.native else "",
                    seconds * 1e3,
                    extra={**extra, "follower": f.job},
                )
        try:
            self.metrics.progress(self._previous_progress(batch_id))
        except Exception:  # metrics never stop a job
            log.exception("batch %d: metrics not updated", batch_id)
