"""Reading what reached Kafka: record counts, first/last timestamps, commit→Kafka latency.

Bench topics use ``LogAppendTime`` (see :mod:`benchmarks.env`), so a record's timestamp is
when the broker appended it, the same clock for every system measured.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition

log = logging.getLogger(__name__)


def _consumer(bootstrap: str, **more: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.max.bytes": 50 * 2**20,
            **more,
        }
    )


def partitions(c: Consumer, topics: Sequence[str]) -> list[TopicPartition]:
    """Every partition of ``topics`` that exists (missing topics have none)."""
    md = c.list_topics(timeout=10)
    out: list[TopicPartition] = []
    for t in topics:
        tm = md.topics.get(t)
        if tm is None or tm.error is not None:
            continue
        out.extend(TopicPartition(t, p) for p in tm.partitions)
    return out


def record_count(bootstrap: str, topics: Sequence[str]) -> int:
    """Records currently in ``topics`` (high minus low watermark, summed)."""
    c = _consumer(bootstrap)
    try:
        total = 0
        for tp in partitions(c, topics):
            lo, hi = c.get_watermark_offsets(tp, timeout=10, cached=False)
            total += hi - lo
        return total
    finally:
        c.close()


class CountWatcher:
    """Polls watermarks of ``topics`` cheaply, with one consumer kept open."""

    def __init__(self, bootstrap: str, topics: Sequence[str]) -> None:
        self.topics = list(topics)
        self._c = _consumer(bootstrap)
        self._tps: list[TopicPartition] = []

    def count(self) -> int:
        """Records now in the topics."""
        if not self._tps:
            self._tps = partitions(self._c, self.topics)
        total = 0
        for tp in self._tps:
            lo, hi = self._c.get_watermark_offsets(tp, timeout=10, cached=False)
            total += hi - lo
        return total

    def wait_for(
        self,
        target: int,
        timeout_s: float,
        *,
        alive: Callable[[], bool] | None = None,
        every_s: float = 0.2,
    ) -> float:
        """Block until ``target`` records are there; returns perf_counter() at that moment.

        Raises TimeoutError at the deadline, or RuntimeError when ``alive()`` says the
        producing process is gone before the target was reached.
        """
        deadline = time.perf_counter() + timeout_s
        while True:
            n = self.count()
            if n >= target:
                return time.perf_counter()
            if alive is not None and not alive():
                # One last look: the process may have finished right after producing.
                if self.count() >= target:
                    return time.perf_counter()
                raise RuntimeError(f"producer exited with {n} of {target} records in Kafka")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{n} of {target} records after {timeout_s:.0f}s")
            time.sleep(every_s)

    def close(self) -> None:
        self._c.close()


def _read_one(c: Consumer, tp: TopicPartition, offset: int) -> int | None:
    c.assign([TopicPartition(tp.topic, tp.partition, offset)])
    deadline = time.time() + 15
    while time.time() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            continue
        return int(m.timestamp()[1])
    return None


def span_timestamps(bootstrap: str, start: dict[tuple[str, int], int]) -> tuple[int, int, int]:
    """(first ms, last ms, count) of the records after ``start`` (from :func:`end_offsets`)."""
    c = _consumer(bootstrap)
    try:
        first: int | None = None
        last: int | None = None
        total = 0
        for (topic, part), begin in start.items():
            tp = TopicPartition(topic, part)
            _lo, hi = c.get_watermark_offsets(tp, timeout=10, cached=False)
            if hi <= begin:
                continue
            total += hi - begin
            a = _read_one(c, tp, begin)
            b = _read_one(c, tp, hi - 1)
            if a is not None:
                first = a if first is None else min(first, a)
            if b is not None:
                last = b if last is None else max(last, b)
        if first is None or last is None:
            raise RuntimeError("no new records")
        return first, last, total
    finally:
        c.close()


def end_offsets(bootstrap: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
    """High watermark of every partition."""
    c = _consumer(bootstrap)
    try:
        out = {}
        for tp in partitions(c, topics):
            out[(tp.topic, tp.partition)] = c.get_watermark_offsets(tp, timeout=10)[1]
        return out
    finally:
        c.close()


def commit_us(value: bytes) -> float | None:
    """The commit time (µs since the epoch) an event carries in ``source``."""
    doc: Any = orjson.loads(value)
    if isinstance(doc, dict) and "payload" in doc and "source" not in doc:
        doc = doc["payload"]
    src = doc.get("source") if isinstance(doc, dict) else None
    if not isinstance(src, dict):
        return None
    if src.get("ts_us") is not None:
        return float(src["ts_us"])
    if src.get("ts_ms") is not None:
        return float(src["ts_ms"]) * 1000.0
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on sorted data."""
    if not values:
        raise ValueError("no values")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100.0 * (len(s) - 1))))
    return s[k]


@dataclass
class LatencySamples:
    """Commit→Kafka latencies: (broker append time ms, latency ms) per change event."""

    points: list[tuple[int, float]] = field(default_factory=list)
    tombstones: int = 0
    unparsed: int = 0

    def p(self, q: float) -> float:
        return percentile([lat for _t, lat in self.points], q)

    def summary(self) -> dict[str, float]:
        lats = [lat for _t, lat in self.points]
        return {
            "events": float(len(lats)),
            "p50_ms": percentile(lats, 50),
            "p99_ms": percentile(lats, 99),
            "max_ms": max(lats),
            "mean_ms": statistics.fmean(lats),
        }


class LatencyConsumer:
    """Consumes new records of ``topics`` in a thread and computes commit→Kafka latency."""

    def __init__(self, bootstrap: str, topics: Sequence[str], *, on_receipt: bool = False) -> None:
        """``on_receipt``: latency to when the consumer (``read_committed``) gets a record,
        not to the broker's append time: a transactional writer's records are appended
        before they are visible."""
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.on_receipt = on_receipt
        self.samples = LatencySamples()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="latency")
        self.error: BaseException | None = None

    def start(self) -> None:
        """Start at the current end of the topics (only new records count)."""
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("latency consumer did not get its partitions")

    def _run(self) -> None:
        # On receipt: the broker answers a fetch at once (a fetch it holds waits for bytes
        # up to the last stable offset, and may be held past the commit that makes them
        # visible), so a record's receipt is when it is visible.
        c = _consumer(self.bootstrap, **({"fetch.wait.max.ms": 5} if self.on_receipt else {}))
        try:
            tps = partitions(c, self.topics)
            if not tps:
                raise RuntimeError(f"no such topics: {self.topics}")
            c.assign([TopicPartition(tp.topic, tp.partition, OFFSET_END) for tp in tps])
            # Force the OFFSET_END resolution now, before the load starts.
            c.poll(0.5)
            for tp in tps:
                c.position([tp])
            self._ready.set()
            # consume() returns once its batch is full or its timeout ends: on receipt, a
            # short timeout, so a record's receipt is not held for a batch to fill.
            wait_s = 0.002 if self.on_receipt else 0.2
            while not self._stop.is_set():
                msgs = c.consume(10_000, wait_s)
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("latency consumer: %s", err)
                        continue
                    v = m.value()
                    if v is None:
                        self.samples.tombstones += 1
                        continue
                    ts = commit_us(v)
                    if ts is None:
                        self.samples.unparsed += 1
                        continue
                    appended = int(m.timestamp()[1])
                    seen = time.time() * 1000.0 if self.on_receipt else appended
                    self.samples.points.append((appended, seen - ts / 1000.0))
        except BaseException as e:  # surfaced by stop()
            self.error = e
            self._ready.set()
        finally:
            c.close()

    def count(self) -> int:
        return len(self.samples.points)

    def wait_for(self, n: int, timeout_s: float) -> bool:
        """Wait until ``n`` change events were seen; False at the deadline."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.count() >= n or self.error is not None:
                break
            time.sleep(0.1)
        return self.count() >= n

    def stop(self) -> LatencySamples:
        """Stop consuming and return the samples (re-raises the consumer's error)."""
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise RuntimeError(f"latency consumer failed: {self.error}") from self.error
        return self.samples


@dataclass(frozen=True)
class KafkaLagSample:
    t: float  # time.time() of the sample
    lag_s: float  # how long ago the newest change event in the topics was committed


class KafkaLagSampler:
    """Samples in a thread how far Kafka is behind the database, in seconds: now minus the
    commit time of the newest change event in ``topics`` (its last records, read a few
    times a second). A reader that keeps up holds it at its latency; one that falls short
    of the offered rate lets it grow by the share it misses (0.1 s/s at 90 %); a stalled
    one lets it grow 1 s/s. Unlike the slot's lag in bytes, it does not count other
    databases' WAL, nor depend on how often a reader confirms the slot."""

    def __init__(self, bootstrap: str, topics: Sequence[str], every_s: float = 0.25) -> None:
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.every_s = every_s
        self.samples: list[KafkaLagSample] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="kafka-lag")

    def start(self) -> None:
        self._thread.start()

    def _newest_commit_us(self, c: Consumer, tps: list[TopicPartition]) -> float | None:
        """The latest commit time among the last records of each partition."""
        newest: float | None = None
        for tp in tps:
            lo, hi = c.get_watermark_offsets(tp, timeout=10, cached=False)
            if hi <= lo:
                continue
            # The last two records: a delete's event comes before its tombstone.
            start = max(lo, hi - 2)
            c.assign([TopicPartition(tp.topic, tp.partition, start)])
            got = 0
            deadline = time.time() + 5
            while got < hi - start and time.time() < deadline:
                m = c.poll(0.5)
                if m is None or m.error() is not None:
                    continue
                got += 1
                v = m.value()
                ts = None if v is None else commit_us(v)
                if ts is not None and (newest is None or ts > newest):
                    newest = ts
        return newest

    def _run(self) -> None:
        c = _consumer(self.bootstrap)
        try:
            tps = partitions(c, self.topics)
            while not self._stop.is_set():
                ts = self._newest_commit_us(c, tps)
                now = time.time()
                if ts is not None:
                    self.samples.append(KafkaLagSample(now, max(0.0, now - ts / 1e6)))
                self._stop.wait(max(0.0, self.every_s - (time.time() - now)))
        except BaseException as e:  # surfaced by stop()
            self.error = e
        finally:
            c.close()

    def window(self, t0: float, t1: float) -> list[KafkaLagSample]:
        """Samples taken between t0 and t1 (time.time())."""
        return [s for s in self.samples if t0 <= s.t <= t1]

    def stop(self) -> list[KafkaLagSample]:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise RuntimeError(f"Kafka lag sampler failed: {self.error}") from self.error
        return self.samples


def wait_for_marker(
    bootstrap: str,
    start: dict[tuple[str, int], int],
    marker: bytes,
    timeout_s: float,
    *,
    alive: Callable[[], bool] | None = None,
) -> tuple[float, int]:
    """Read from ``start`` until a record whose value contains ``marker`` arrives.

    Returns (perf_counter() when seen, records read up to and including it). A marker
    written after a backlog proves the whole backlog is through, whatever a system
    replays first (counting records alone would be fooled by re-sent duplicates).
    """
    c = _consumer(bootstrap)
    try:
        c.assign([TopicPartition(t, p, off) for (t, p), off in start.items()])
        seen = 0
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            for m in c.consume(10_000, 0.2):
                if m.error():
                    continue
                seen += 1
                v = m.value()
                if v is not None and marker in v:
                    return time.perf_counter(), seen
            if alive is not None and not alive():
                alive = None  # it may have exited right after producing: drain once more
                deadline = min(deadline, time.perf_counter() + 10)
        raise TimeoutError(f"marker {marker.decode()} not in Kafka after {seen} records")
    finally:
        c.close()
