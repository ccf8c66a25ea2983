"""The jobs' Kafka read with ``spark.read = "direct"``: each task reads its own offset range
from Kafka (librdkafka), so no record crosses the JVM.

With Spark's Kafka source every record crosses the JVM: fetched, made a row, written to
the Python worker as Arrow. Measured on this machine (4 kB events, ``local[2]``), that
costs the JVM 30-80 µs per record, more than the task's whole Python work. Here Spark
keeps what it is for (the micro-batches, the offsets in the checkpoint, task scheduling
and retries, ``--available-now`` and ``maxOffsetsPerTrigger``) through a Python streaming
data source (PySpark 4.2's ``DataSourceStreamReader``) whose rows are not records but the
batch's offset ranges:

* the source's offsets are ``{topic: {partition: next offset}}`` (the shape of the Kafka
  source's, so the checkpoint's offset log reads the same), planned on the driver from the
  brokers' low and high marks (:func:`reconcile`, :func:`admit`);
* a micro-batch's frame is a row per topic-partition range with records
  (:func:`plan_ranges`): ``foreachBatch`` spreads them over its tasks (:func:`spread_ranges`,
  :func:`spark_jobs.apply_loop.apply_ranges`), and a task reads each of its ranges
  (:func:`read_range`), parses, reduces and applies it. One partition holds every event of
  its keys, so a range's reduction is whole, as with one task per Kafka partition on the
  Kafka source.

What Spark's Kafka source does with ``failOnDataLoss=false`` is done here too: a partition
whose log start passed the next offset (retention, or a topic deleted and made again)
goes on from its log start, and says so; a new partition or topic is read from its start;
a topic that is gone is dropped from the offsets.

Planning asks the brokers for the marks before each batch. A broker that restarts (or a
leader election) makes those requests fail for a while: the planning asks again, with a
backoff, for up to ``spark.kafka_unavailable_s``, one WARNING line saying so, and only then
fails the query with one line (a job started again resumes from its checkpoint).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_jobs.parse import KafkaRecord

log = logging.getLogger(__name__)

# {topic: {partition (as text: the offsets are JSON): next offset to read}}
Offsets = dict[str, dict[str, int]]
# {topic: {partition: (log start offset, high mark)}}
Marks = dict[str, dict[str, tuple[int, int]]]

SOURCE_NAME = "cdc_kafka_direct"
RANGE_SCHEMA = "topic string, partition int, start long, end long"
# consume() waits until it has as many records as asked or this long: a range's last call
# asks for more than remain (a compacted range has gaps), so at 1 s every task of every
# micro-batch waited a second at its tail (a 10-record range took 1,001 ms, measured).
_POLL_S = 0.05
# A task's memory while it reads (the prefetch is C memory, the batch Python objects): with
# librdkafka's 64 MiB prefetch, a 10 MiB fetch and 5,000 records a call, reading 33,000
# records of 4 kB with nothing kept raised a process's peak RSS by 116 MiB, 16 with these,
# at less CPU (3 µs a record against 6). A full prefetch queue holds the next fetch back
# for fetch.queue.backoff.ms, 1 s by default: with 30 µs of work a record, the same read
# then took 7.4 s (2.7 s before); 10 ms keeps it fed (2.2-2.4 s).
_PREFETCH_KB = 16 * 1024  # queued.max.messages.kbytes (a larger record still comes whole)
_REFETCH_MS = 10  # fetch.queue.backoff.ms
_FETCH_WAIT_MS = 10  # fetch.wait.max.ms
_CONSUME = 500  # records a consume() call
# A consumer that has read one topic and is given a partition of another it holds no
# metadata of fetched nothing for a second (librdkafka's next look-up of the topic's leader):
# the reader's heartbeat range, then a table's, took 0.95 s in the first batch of every job,
# against 11 ms with the topic looked up first (a fresh consumer looks its first one up
# itself). How long that look-up may take before the read goes on without it.
_LOOKUP_S = 1.0
_STALL_S = 120.0  # a range that yields nothing for this long fails its task (Spark retries)
_ASK_S = 10.0  # how long one request for the marks waits for the brokers
_ASK_AGAIN_S = (0.5, 5.0)  # the backoff between asks, first and at most
_new_record: Final = tuple.__new__


@dataclass(frozen=True)
class Subscription:
    """What the job reads: named topics, or every topic whose whole name matches a pattern
    (anchored for Spark's ``subscribePattern``, which finds a pattern anywhere in a name:
    :func:`spark_jobs.source.subscription`); the heartbeat topic joins either."""

    topics: tuple[str, ...]
    pattern: str | None

    def wants(self, topic: str) -> bool:
        if self.topics:
            return topic in self.topics
        return self.pattern is not None and re.fullmatch(self.pattern, topic) is not None


class Range(InputPartition):
    """One task's records: ``topic``/``partition`` offsets ``start`` (included) to ``end``."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def __repr__(self) -> str:
        return f"{self.topic}[{self.partition}] {self.start}..{self.end}"

    @classmethod
    def of(cls, row: Any) -> Range:
        """The range of a collected row of :data:`RANGE_SCHEMA`."""
        return cls(row["topic"], row["partition"], row["start"], row["end"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Range) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((self.topic, self.partition, self.start, self.end))


def starting_offsets(marks: Marks, how: str) -> Offsets:
    """The first batch's start: each partition's log start (``earliest``), its high mark
    (``latest``), or the JSON offsets Spark's Kafka source takes (-2 earliest, -1 latest)."""
    if how in ("earliest", "latest"):
        i = 0 if how == "earliest" else 1
        return {t: {p: m[i] for p, m in parts.items()} for t, parts in marks.items()}
    import json

    given = json.loads(how)
    out: Offsets = {}
    for t, parts in marks.items():
        wanted = given.get(t, {})
        out[t] = {}
        for p, (low, high) in parts.items():
            o = int(wanted.get(p, -2))
            out[t][p] = low if o == -2 else high if o == -1 else o
    return out


def reconcile(start: Offsets, marks: Marks) -> tuple[Offsets, list[str]]:
    """``start`` made to fit the partitions as the brokers hold them now, and a line for each
    loss (the rules in the module's docstring)."""
    out: Offsets = {}
    lost: list[str] = []
    for t, parts in marks.items():
        had = start.get(t)
        out[t] = {}
        for p, (low, high) in parts.items():
            o = had.get(p) if had is not None else None
            if o is None:
                out[t][p] = low  # a new topic or partition: from its start
            elif o < low:
                lost.append(f"{t}[{p}]: offsets {o}..{low - 1} are gone (log start {low})")
                out[t][p] = low
            elif o > high:
                lost.append(f"{t}[{p}]: offset {o} is past the end {high} (topic made again?)")
                out[t][p] = low
            else:
                out[t][p] = o
    return out, lost


def admit(start: Offsets, latest: Offsets, max_rows: int | None) -> Offsets:
    """The batch's end: ``latest``, or under ``max_rows`` each partition's share of it in
    proportion to its backlog (as Spark's Kafka source spreads ``maxOffsetsPerTrigger``)."""
    backlog = {
        (t, p): latest[t][p] - start.get(t, {}).get(p, latest[t][p])
        for t in latest
        for p in latest[t]
    }
    total = sum(n for n in backlog.values() if n > 0)
    if max_rows is None or total <= max_rows:
        return {t: dict(parts) for t, parts in latest.items()}
    out: Offsets = {}
    for t, parts in latest.items():
        out[t] = {}
        for p, high in parts.items():
            begin = start.get(t, {}).get(p, high)
            n = backlog[(t, p)]
            share = max(1, n * max_rows // total) if n > 0 else 0
            out[t][p] = min(high, begin + share)
    return out


def plan_ranges(start: Offsets, end: Offsets) -> list[Range]:
    """A task per partition with records between ``start`` and ``end``."""
    out = []
    for t, parts in sorted(end.items()):
        for p, stop in sorted(parts.items(), key=lambda kv: int(kv[0])):
            begin = start.get(t, {}).get(p, stop)
            if stop > begin:
                out.append(Range(t, int(p), begin, stop))
    return out


def kafka_source_ranges(start: Offsets, end: Offsets) -> tuple[list[Range], list[str]]:
    """The ranges of a batch Spark's Kafka source planned (``spark.direct_planner = kafka``)
    from its logged ``start`` and ``end`` offsets, and a line for each partition that
    started over; as :func:`reconcile` would have them: a partition new to the offsets is
    read from its log start (so is one the Kafka source plans); one whose offsets went back
    (a topic deleted and made again), which the Kafka source would skip, from its log start
    too. Offset 0 stands for the log start: the tasks' consumers go on from there
    (``auto.offset.reset``)."""
    out: list[Range] = []
    again: list[str] = []
    for t, parts in sorted(end.items()):
        for p, stop in sorted(parts.items(), key=lambda kv: int(kv[0])):
            begin = start.get(t, {}).get(p, 0)
            if begin > stop:
                again.append(f"{t}[{p}]: offset {begin} is past the end {stop} (topic made again?)")
                begin = 0
            if stop > begin:
                out.append(Range(t, int(p), begin, stop))
    return out, again


def spread_ranges(ranges: Sequence[Range], tasks: int) -> list[list[int]]:
    """``ranges`` (by index) spread over at most ``tasks`` tasks so that each holds about as
    many records: each range, the most records first, to the task that holds the fewest so
    far (the first such task on a tie); each task's ranges in that order. No task is empty.
    A range's records are counted as its offsets span (a compacted one holds fewer)."""
    groups: list[list[int]] = [[] for _ in range(max(1, min(tasks, len(ranges))))]
    load = [0] * len(groups)
    for i in sorted(range(len(ranges)), key=lambda i: (-(ranges[i].end - ranges[i].start), i)):
        least = load.index(min(load))
        groups[least].append(i)
        load[least] += ranges[i].end - ranges[i].start
    return [g for g in groups if g]


def range_starts(ranges: Iterable[Range]) -> Offsets:
    """Where each range starts, as offsets."""
    out: Offsets = {}
    for r in ranges:
        out.setdefault(r.topic, {})[str(r.partition)] = r.start
    return out


class RangeMessages:
    """The messages of one range as ``Consumer.consume`` lists them (:meth:`next`), from a
    consumer of the process's (:func:`_consumer`), which :meth:`close` keeps for the next
    range or, after a failure, closes. What a message means is its reader's to say:
    :func:`read_range`'s, or the native module's (``FastChanges.add_messages``)."""

    def __init__(self, conf: Mapping[str, str], r: Range, stall_s: float = _STALL_S, keep: int = 1):
        from confluent_kafka import KafkaException, TopicPartition

        self.range, self._stall_s, self._keep = r, stall_s, keep
        self._key, self._consumer = _consumer(conf)
        self._healthy = True
        self._closed = False
        try:
            consumer = self._consumer
            if consumer.topics and r.topic not in consumer.topics:
                with contextlib.suppress(KafkaException):  # unanswered: the fetch looks it up later
                    consumer.list_topics(r.topic, timeout=_LOOKUP_S)
            consumer.topics.add(r.topic)
            consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        except BaseException:
            self.close(healthy=False)
            raise

    def next(self, expect: int) -> list[Any]:
        """The next messages consumed (at most what is left of the range were there no gaps
        from offset ``expect`` on, and :data:`_CONSUME`), waiting for some; TimeoutError
        when none came for the stall time."""
        quiet_since = time.monotonic()
        want = min(_CONSUME, max(1, self.range.end - expect))
        while True:
            try:
                msgs: list[Any] = self._consumer.consume(want, _POLL_S)
            except BaseException:
                self._healthy = False
                raise
            if msgs:
                return msgs
            if time.monotonic() - quiet_since > self._stall_s:
                self._healthy = False
                raise TimeoutError(f"Kafka gave no record of {self.range} for {self._stall_s:.0f}s")

    def failed(self) -> None:
        """What was read is of no use: the consumer is closed, not kept."""
        self._healthy = False

    def close(self, healthy: bool = True) -> None:
        """Release the consumer (:func:`_release`): kept when it and the read are sound."""
        if not self._closed:
            self._closed = True
            _release(self._key, self._consumer, self._healthy and healthy, self._keep)


def read_range(
    conf: Mapping[str, str], r: Range, stall_s: float = _STALL_S, keep: int = 1
) -> Generator[KafkaRecord, None, None]:
    """The records of ``r`` from Kafka, in offset order (a compacted topic has gaps), a few
    hundred at a time and at most :data:`_PREFETCH_KB` prefetched (one larger record, up to
    the broker's limit, still comes whole).

    The process keeps its consumer for the next range (:func:`_consumer`): making one and
    closing it cost each range 1.5 ms of CPU and 5-7 ms, however few its records. One that
    failed is closed instead. Up to ``keep`` are kept (the ranges a task reads at once)."""
    messages = RangeMessages(conf, r, stall_s, keep)
    try:
        topic, partition, end = r.topic, r.partition, r.end  # locals: read for every record
        expect = r.start  # the next offset, were there no gaps: at most this many remain
        while True:
            for m in messages.next(expect):
                if m.error() is not None:
                    if partition_end(m, r):
                        return
                    continue
                offset = m.offset()
                if offset is None or m.topic() != topic or m.partition() != partition:
                    continue  # not of this range (librdkafka drops an earlier one's)
                if offset >= end:
                    return
                expect = offset + 1
                # KafkaRecord(...) without its __new__'s Python call: this runs a record.
                yield _new_record(
                    KafkaRecord, (topic, partition, offset, m.key(), m.value(), m.headers())
                )
                if offset == end - 1:
                    return
    except GeneratorExit:  # the reader stopped early: the consumer is sound
        raise
    except BaseException:
        messages.failed()
        raise
    finally:
        messages.close()


def partition_end(m: Any, r: Range) -> bool:
    """Whether message ``m``, which carries an error, is the end of ``r``'s partition (the
    end when the batch was planned was at most this high mark: the range is read); raises
    its error when it is no partition's end. False: another partition's end."""
    from confluent_kafka import KafkaError, KafkaException

    err = m.error()
    if err.code() != KafkaError._PARTITION_EOF:
        raise KafkaException(err)
    return bool(m.topic() == r.topic and m.partition() == r.partition)


def range_end(messages: RangeMessages, m: Any) -> bool:
    """:func:`partition_end` of a message of ``messages``' range, the consumer marked failed
    (closed, not kept) when the message's error is raised."""
    try:
        return partition_end(m, messages.range)
    except BaseException:
        messages.failed()
        raise


# The process's idle consumers, under their client configuration: of one configuration only
# (a Python worker reads its tasks' ranges with its job's configuration), as many as it
# reads ranges at once.
_IDLE: dict[tuple[tuple[str, str], ...], list[Any]] = {}
_IDLE_LOCK = threading.Lock()


def _consumer(conf: Mapping[str, str]) -> tuple[tuple[tuple[str, str], ...], Any]:
    """(its key, a consumer for ``conf``): the process's idle one, else a new one. Its
    ``topics`` are those it has been given a range of (it holds their metadata)."""
    from confluent_kafka import Consumer

    class _Reader(Consumer):
        topics: set[str]

    key = tuple(sorted(conf.items()))
    with _IDLE_LOCK:
        kept = _IDLE.get(key)
        idle = kept.pop() if kept else None
        if kept is not None and not kept:
            del _IDLE[key]
    if idle is not None:
        return key, idle
    consumer = _Reader(
        {
            **conf,
            "group.id": "cdc-direct-read",  # nothing is committed: the checkpoint holds offsets
            "enable.auto.commit": "false",
            "enable.partition.eof": "true",
            # An offset no longer held (retention) or past a remade topic's end: its start.
            "auto.offset.reset": "earliest",
            "queued.max.messages.kbytes": str(_PREFETCH_KB),
            "fetch.queue.backoff.ms": str(_REFETCH_MS),
            # A fetch the broker holds for new records (500 ms by default) when the range is
            # read to its end would hold the next range's first fetch on the same connection.
            "fetch.wait.max.ms": str(_FETCH_WAIT_MS),
        }
    )
    consumer.topics = set()
    return key, consumer


def _release(key: tuple[tuple[str, str], ...], consumer: Any, healthy: bool, keep: int = 1) -> None:
    """Keep ``consumer`` for the next range, its partition unassigned (what it fetched of it
    is dropped), in place of those kept for another configuration; or close it: one that
    failed, or one more than ``keep`` for the same configuration."""
    from confluent_kafka import KafkaException

    if healthy:
        try:
            consumer.unassign()
        except (KafkaException, RuntimeError):
            healthy = False
    closing = [consumer]
    if healthy:
        with _IDLE_LOCK:
            closing = [c for k in [k for k in _IDLE if k != key] for c in _IDLE.pop(k)]
            kept = _IDLE.setdefault(key, [])
            if len(kept) < keep:
                kept.append(consumer)
            else:
                closing.append(consumer)
    for c in closing:
        c.close()


class DirectReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream reader (see the module's docstring). It is built in the driver's source
    process and pickled into each task, so it holds no client: those are made where used."""

    def __init__(
        self,
        conf: Mapping[str, str],
        subscription: Subscription,
        starting: str,
        max_rows: int | None,
        unavailable_s: float = 300.0,
    ) -> None:
        # The client configuration (pgcdc.core.kafka_config.client_config), not the settings:
        # the source's processes (its runner, its planner) then import no settings module
        # (pydantic and the rest: 0.2 s of CPU each, at every job's start).
        self.conf = dict(conf)
        self.subscription = subscription
        self.starting = starting
        self.max_rows = max_rows
        self.unavailable_s = unavailable_s  # how long the marks are asked for again
        self.ask_s = _ASK_S  # how long one request for them waits
        self.target: Offsets | None = None  # --available-now: where the run ends
        self.latest: Offsets | None = None  # the high marks at the last planning
        self._admin: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_admin"] = None
        return state

    def marks(self) -> Marks:
        """The subscribed partitions' log start and high marks, from the brokers; asked
        again while they do not answer (a restart, a leader election), for up to
        ``unavailable_s`` (the module's docstring)."""
        from confluent_kafka import KafkaException

        started = time.monotonic()
        pause, said = _ASK_AGAIN_S[0], False
        while True:
            try:
                got = self._marks_once()
            except (KafkaException, TimeoutError) as e:
                waited = time.monotonic() - started
                reason = str(e.args[0]) if e.args else type(e).__name__
                if waited + pause > self.unavailable_s:
                    raise RuntimeError(
                        f"Kafka ({self.conf.get('bootstrap.servers')}) did not answer the direct "
                        f"read's requests for its offsets for {waited:.0f} s "
                        f"(spark.kafka_unavailable_s): {reason}; start the job again once "
                        "it answers (it resumes from its checkpoint)"
                    ) from e
                if not said:
                    log.warning(
                        "Kafka does not answer the direct read's requests for its offsets "
                        "(%s): asking again for up to %.0f s (spark.kafka_unavailable_s)",
                        reason,
                        self.unavailable_s,
                    )
                    said = True
                time.sleep(pause)
                pause = min(pause * 2, _ASK_AGAIN_S[1])
                continue
            if said:
                log.info(
                    "Kafka answers the direct read's requests for its offsets again, after %.0f s",
                    time.monotonic() - started,
                )
            return got

    def _marks_once(self) -> Marks:
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

        if self._admin is None:
            self._admin = AdminClient(dict(self.conf))
        meta = self._admin.list_topics(timeout=self.ask_s)
        parts = [
            TopicPartition(t, p)
            for t, tm in meta.topics.items()
            if tm.error is None and self.subscription.wants(t)
            for p in tm.partitions
        ]
        if not parts:
            return {}
        earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        # The last stable offset: a transactional reader's records (kafka.exactly_once) are
        # planned once committed, as the tasks' consumers (read_committed) read them.
        committed = IsolationLevel.READ_COMMITTED
        low = self._admin.list_offsets(dict.fromkeys(parts, earliest), isolation_level=committed)
        high = self._admin.list_offsets(dict.fromkeys(parts, latest), isolation_level=committed)
        out: Marks = {}
        for tp in parts:
            lo = low[tp].result(self.ask_s).offset
            hi = high[tp].result(self.ask_s).offset
            out.setdefault(tp.topic, {})[str(tp.partition)] = (lo, hi)
        return out

    def initialOffset(self) -> Offsets:
        return starting_offsets(self.marks(), self.starting)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {t: {p: m[1] for p, m in parts.items()} for t, parts in self.marks().items()}

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        marks = self.marks()
        begin, lost = reconcile(start, marks)
        for line in lost:
            log.warning("records lost before they were read: %s", line)
        latest = {t: {p: m[1] for p, m in parts.items()} for t, parts in marks.items()}
        self.latest = latest
        if self.target is not None:  # nothing written after the run began
            latest = {
                t: {p: min(h, self.target.get(t, {}).get(p, begin[t][p])) for p, h in ps.items()}
                for t, ps in latest.items()
            }
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = admit(begin, latest, max_rows)
        for t, parts in begin.items():
            for p, o in parts.items():
                if start.get(t, {}).get(p) != o:
                    # A partition new to the offsets or started over: this batch records
                    # where it starts (Spark hands the next batch this end as its start).
                    end[t][p] = o
                else:
                    end[t][p] = max(end[t][p], o)  # offsets never move back
        return end

    def reportLatestOffset(self) -> Offsets | None:
        """The high marks met at the last planning, for the query's progress (the jobs'
        lag, their ``--available-now`` progress and whether a batch reached the end)."""
        return self.latest

    def partitions(self, start: Offsets, end: Offsets) -> list[Range]:
        return plan_ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int, int, int]]:
        """The range itself: the batch's task reads it (no record goes through Spark)."""
        assert isinstance(partition, Range)
        yield (partition.topic, partition.partition, partition.start, partition.end)

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint."""


def direct_source(
    conf: Mapping[str, str],
    subscription: Subscription,
    starting: str,
    max_rows: int | None,
    unavailable_s: float = 300.0,
) -> type[DataSource]:
    """A data source class for one job (register it, then ``readStream.format(SOURCE_NAME)``):
    the class carries the job's Kafka client configuration (``conf``), so it reaches the
    driver's source process pickled, never as options (which plans and the UI show)."""

    class CdcKafkaDirect(DataSource):
        @classmethod
        def name(cls) -> str:
            return SOURCE_NAME

        def schema(self) -> str:
            return RANGE_SCHEMA

        def streamReader(self, schema: Any) -> DirectReader:
            return DirectReader(conf, subscription, starting, max_rows, unavailable_s)

    return CdcKafkaDirect
