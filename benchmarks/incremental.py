"""Incremental snapshot while streaming: rows/s of a watermarked chunked snapshot of the
big table while a fixed 1,000 changes/s load streams on the stream table, the commit→Kafka
latency of those streamed changes during the snapshot, the worst gap between them (the
stream must not stall), the reader's peak RSS and the slot's lag (confirmed as it goes).

A second, longer row (group ``incremental_large``, not part of the full run): a table of
``BENCH_INCREMENTAL_LARGE_ROWS`` rows (10M by default) snapshotted incrementally while a
light load (200 changes/s) streams: the reader's RSS at the start, peak and end of the
snapshot (flat memory) and how far the slot's ``confirmed_flush_lsn`` advanced meanwhile
(bounded WAL), with the longest stretch it did not move.

The reader runs as ``cdc run`` with its default chunk size (``incremental_chunk_rows``);
the snapshot is requested the way ``cdc snapshot`` does, with a signal in the WAL.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import re
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from pydantic import SecretStr

from benchmarks import workload
from benchmarks.context import BIG, STREAM, Bench, require
from benchmarks.kafka import LatencyConsumer, end_offsets
from benchmarks.lag import LagSample, LagSampler
from benchmarks.ours import OursReader
from benchmarks.probes import ready_probe, wait_slot_active, write_marker
from benchmarks.results import Figure, Series
from cdc.incremental.auth import key_of
from cdc.incremental.send import emit_signed
from cdc.incremental.signals import execute_document, split_table
from pgcdc.core.settings import PostgresSettings

log = logging.getLogger(__name__)

RATE = 1_000.0  # streamed changes/s during the snapshot (1-row transactions)
LARGE_RATE = 200.0  # the light load beside the large snapshot
LARGE = "public.orders_large"
SEGMENT_S = 30.0  # the load runs in back-to-back segments until the snapshot is done
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
METRICS = [
    "incremental snapshot rows/s (1,000 changes/s streaming)",
    "commit→Kafka p99 during incremental snapshot",
    "worst gap between streamed events during incremental snapshot",
    "incremental snapshot peak RSS",
    "slot lag during incremental snapshot (max)",
]
LARGE_METRICS = [
    "large incremental snapshot rows/s (200 changes/s streaming)",
    "large incremental snapshot reader RSS at start",
    "large incremental snapshot reader RSS peak",
    "large incremental snapshot reader RSS at end",
    "large incremental snapshot confirmed_flush_lsn advance",
    "large incremental snapshot longest time confirmed_flush_lsn stood still",
    "large incremental snapshot slot lag (max)",
    "worst gap between streamed events during large incremental snapshot",
]


def _log_time(stamp: str) -> float:
    """A log line's time (local time, as logging writes it) as a UNIX time."""
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclass
class _Run:
    """One incremental snapshot measured while a load streamed."""

    t0: float  # the snapshot's start and end (the reader's log)
    t1: float
    rows: int
    events: list[float]  # broker append times (ms) of streamed events during the snapshot
    latencies: list[float]  # their commit→Kafka latencies (ms)
    lag: list[LagSample]
    rss: list[tuple[float, int]]  # (time, bytes) of the reader during the snapshot
    peak_rss_mb: float | None
    changes: int  # what the load achieved
    load_seconds: float
    loadavg: list[float] = field(default_factory=list)  # 1-minute load average, sampled

    @property
    def seconds(self) -> float:
        return max(1e-6, self.t1 - self.t0)

    def worst_gap_ms(self) -> float | None:
        if not self.events:
            return None
        gaps = [later - earlier for earlier, later in itertools.pairwise(self.events)]
        edges = [self.events[0] - self.t0 * 1000, self.t1 * 1000 - self.events[-1]]
        return max(gaps + edges)

    def load_text(self) -> str:
        rate = self.changes / max(1e-6, self.load_seconds)
        avg = sum(self.loadavg) / len(self.loadavg) if self.loadavg else float("nan")
        peak = max(self.loadavg) if self.loadavg else float("nan")
        return f"load achieved {rate:,.0f} changes/s; load average {avg:.1f} (max {peak:.1f})"


def _has_records(b: Bench, topic: str) -> bool:
    """Whether ``topic`` has records (a topic just created may have no leader yet)."""
    try:
        return bool(end_offsets(b.env.bootstrap, [topic]))
    except KafkaException:
        return False


def _snapshot_while_loaded(b: Bench, table: str, rate: float, role: str) -> _Run:
    """``cdc snapshot table`` while the stream table takes ``rate`` changes/s."""
    reader = OursReader(b.env, [table, STREAM], role=role)
    m = reader.launch(until_current=False, drop_slot=True)
    sampler = LagSampler(b.env.dsn, reader.slot)
    sampler.start()
    loads: list[workload.OpenLoopLoad] = []
    loadavg: list[float] = []
    try:
        wait_slot_active(b, reader.slot, m)
        # The stream table's topic appears with its first change; then the probe.
        write_marker(b, f"{role}-topic")
        deadline = time.time() + 120
        while not _has_records(b, reader.topic(STREAM)):
            if time.time() > deadline or not m.running():
                raise RuntimeError(f"no stream topic: {reader.log_tail(3)}")
            time.sleep(0.2)
        ready_probe(b, reader, m)
        consumer = LatencyConsumer(b.env.bootstrap, [reader.topic(STREAM)])
        consumer.start()

        def segment(delay_s: float) -> workload.OpenLoopLoad:
            ids = b.take_ids(int(rate * SEGMENT_S * 2))
            load = workload.OpenLoopLoad(b.env.dsn, STREAM, rate, 1, SEGMENT_S, id_base=ids)
            load.start(delay_s)
            loads.append(load)
            return load

        current = segment(1.0)
        while time.time() < current.t0 + 1.0:  # the load's schedule starts at t0
            time.sleep(0.05)
        found = key_of(PostgresSettings(dsn=SecretStr(b.env.dsn)))  # the reader's key
        if found.key is None:
            raise RuntimeError(f"the bench cannot sign its signal: {found.source}")
        with b.env.connect() as conn:
            emit_signed(conn, found.key, execute_document([split_table(table)]), reader.slot)
        name = ".".join(split_table(table))
        done = re.compile(
            _STAMP + rf".*incremental snapshot of {re.escape(name)} complete: (\d+) rows"
        )
        started = re.compile(_STAMP + rf".*incremental snapshot of {re.escape(name)} started")
        text = ""
        last_progress = time.time()
        seen = 0
        while not done.search(text):
            if time.time() - last_progress > 600 or not m.running():
                raise RuntimeError(f"the incremental snapshot did not finish: {reader.log_tail(3)}")
            # The next segment is spawned ahead so that its schedule follows on without a gap.
            end = current.t0 + SEGMENT_S
            if time.time() > end - 8.0:
                current = segment(max(0.0, end - time.time()))
            loadavg.append(os.getloadavg()[0])
            time.sleep(1.0)
            text = (reader.workdir / "reader.log").read_text(errors="replace")
            if len(text) != seen:
                seen, last_progress = len(text), time.time()
        changes, load_seconds, errors = 0, 0.0, []
        for load in loads:
            res = load.join()
            changes += res.changes
            load_seconds += res.seconds
            errors += res.errors
        if errors:
            raise RuntimeError(f"load generator failed: {errors[0]}")
        samples = consumer.stop()
    finally:
        lag = sampler.stop()
        reader.finish(m)
    end_m = done.search(text)
    begin = started.search(text)
    assert end_m is not None and begin is not None
    t0, t1 = _log_time(begin.group(1)), _log_time(end_m.group(1))
    during = sorted(pt for pt in samples.points if t0 * 1000 <= pt[0] <= t1 * 1000)
    return _Run(
        t0,
        t1,
        int(end_m.group(2)),
        [t for t, _ in during],
        sorted(lat for _, lat in during),
        [s for s in lag if t0 <= s.t <= t1],
        [(t, rss) for t, rss in m.rss_samples if t0 <= t <= t1],
        m.stats.peak_rss_mb if m.stats is not None else None,
        changes,
        load_seconds,
        loadavg,
    )


def incremental_snapshot(b: Bench) -> None:
    """``cdc snapshot`` of the big table while the stream table takes 1,000 changes/s."""
    with b.record.guarded("ours", METRICS):
        require(b, "ours")
        t_start = time.time()
        run = _snapshot_while_loaded(b, BIG, RATE, "incremental")
        detail = f"{run.rows:,} rows, default chunk size, {RATE:,.0f} changes/s offered"
        b.record.add(Figure("ours", METRICS[0], run.rows / run.seconds, "rows/s",
                            f"{detail}; {run.load_text()}",
                            extra={"seconds": run.seconds, "rows": run.rows}))  # fmt: skip
        if run.latencies:
            lats = run.latencies
            p99 = lats[min(len(lats) - 1, int(len(lats) * 0.99))]
            b.record.add(Figure("ours", METRICS[1], p99, "ms",
                                f"{len(lats):,} streamed events during the snapshot"))  # fmt: skip
            b.record.add(Figure("ours", METRICS[2], run.worst_gap_ms() or 0.0, "ms",
                                f"broker append times, {RATE:,.0f} changes/s offered; "
                                f"{run.load_text()}"))  # fmt: skip
        else:
            b.record.not_measured("ours", METRICS[1], "no streamed event during the snapshot")
        if run.peak_rss_mb is not None:
            b.record.add(Figure("ours", METRICS[3], run.peak_rss_mb, "MiB",
                                "whole run (streaming, then the snapshot)"))  # fmt: skip
        if run.lag:
            b.record.add(Figure("ours", METRICS[4], max(s.lag_bytes for s in run.lag) / 2**20,
                                "MiB", "pg_current_wal_lsn() - confirmed_flush_lsn"))  # fmt: skip
            b.record.series.append(
                Series("ours slot lag during incremental snapshot", "MiB",
                       [(s.t - t_start, s.lag_bytes / 2**20) for s in run.lag])
            )  # fmt: skip


def incremental_large(b: Bench) -> None:
    """A large table (10M rows by default) snapshotted incrementally under a light load:
    flat reader RSS, and the slot confirmed as the stream advances."""
    with b.record.guarded("ours", LARGE_METRICS):
        require(b, "ours")
        rows = int(os.environ.get("BENCH_INCREMENTAL_LARGE_ROWS", "10000000"))
        with b.env.connect() as conn:
            workload.create_table(conn, LARGE)
            secs = workload.bulk_load(conn, LARGE, rows)
        log.info("loaded %s with %d rows in %.1fs", LARGE, rows, secs)
        try:
            run = _snapshot_while_loaded(b, LARGE, LARGE_RATE, "incremental_large")
        finally:
            with b.env.connect() as conn:  # gigabytes: not kept until the run's cleanup
                conn.execute(f"DROP TABLE {LARGE}")
        what = f"{run.rows:,} rows, default chunk size"
        b.record.add(Figure("ours", LARGE_METRICS[0], run.rows / run.seconds, "rows/s",
                            f"{what}, {run.seconds:,.0f} s; {run.load_text()}",
                            extra={"seconds": run.seconds, "rows": run.rows}))  # fmt: skip
        if run.rss:
            mib = [r / 2**20 for _, r in run.rss]
            # The start: the first 10 s of the snapshot (the first chunks are in memory).
            first = [r / 2**20 for t, r in run.rss if t <= run.t0 + 10] or mib[:1]
            b.record.add(Figure("ours", LARGE_METRICS[1], max(first), "MiB",
                                "largest sample of the snapshot's first 10 s"))  # fmt: skip
            b.record.add(Figure("ours", LARGE_METRICS[2], max(mib), "MiB",
                                f"{len(mib):,} samples every 0.2 s"))  # fmt: skip
            b.record.add(Figure("ours", LARGE_METRICS[3], mib[-1], "MiB",
                                "last sample before the snapshot completed"))  # fmt: skip
        if len(run.lag) >= 2:
            confirmed = [(s.t, s.wal_bytes - s.lag_bytes) for s in run.lag]
            advance = (confirmed[-1][1] - confirmed[0][1]) / 2**20
            moves = sum(1 for a, c in itertools.pairwise(confirmed) if c[1] > a[1])
            still, since = 0.0, confirmed[0][0]
            for a, c in itertools.pairwise(confirmed):
                if c[1] > a[1]:
                    since = c[0]
                still = max(still, c[0] - since)
            b.record.add(Figure("ours", LARGE_METRICS[4], advance, "MiB",
                                f"{moves:,} advances in {len(confirmed):,} samples "
                                "every 0.25 s"))  # fmt: skip
            b.record.add(Figure("ours", LARGE_METRICS[5], still, "s",
                                "longest stretch between two advances"))  # fmt: skip
            b.record.add(Figure("ours", LARGE_METRICS[6],
                                max(s.lag_bytes for s in run.lag) / 2**20, "MiB",
                                "pg_current_wal_lsn() - confirmed_flush_lsn"))  # fmt: skip
        gap = run.worst_gap_ms()
        if gap is not None:
            b.record.add(Figure("ours", LARGE_METRICS[7], gap, "ms",
                                f"broker append times, {LARGE_RATE:,.0f} changes/s offered; "
                                f"{run.load_text()}"))  # fmt: skip
