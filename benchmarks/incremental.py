"""Incremental snapshot while streaming: rows/s of a watermarked chunked snapshot of the
big table while a fixed 1,000 changes/s load streams on the stream table, the commit→Kafka
latency of those streamed changes during the snapshot, the worst gap between them (the
stream must not stall), the reader's peak RSS and the slot's lag (confirmed as it goes).

The reader runs as ``cdc run`` with its default chunk size (``incremental_chunk_rows``);
the snapshot is requested the way ``cdc snapshot`` does, with a signal in the WAL.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import re
import time

from benchmarks import workload
from benchmarks.context import BIG, STREAM, Bench, require
from benchmarks.kafka import LatencyConsumer, end_offsets
from benchmarks.lag import LagSampler
from benchmarks.ours import OursReader
from benchmarks.probes import ready_probe, wait_slot_active, write_marker
from benchmarks.results import Figure, Series
from cdc.signals import emit_wal_signal, execute_document, split_table

log = logging.getLogger(__name__)

RATE = 1_000.0  # streamed changes/s during the snapshot (1-row transactions)
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
METRICS = [
    "incremental snapshot rows/s (1,000 changes/s streaming)",
    "commit→Kafka p99 during incremental snapshot",
    "worst gap between streamed events during incremental snapshot",
    "incremental snapshot peak RSS",
    "slot lag during incremental snapshot (max)",
]


def _log_time(stamp: str) -> float:
    """A log line's time (local time, as logging writes it) as a UNIX time."""
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def incremental_snapshot(b: Bench) -> None:
    """``cdc snapshot`` of the big table while the stream table takes 1,000 changes/s."""
    with b.record.guarded("ours", METRICS):
        require(b, "ours")
        reader = OursReader(b.env, [BIG, STREAM], role="incremental")
        m = reader.launch(until_current=False, drop_slot=True)
        sampler = LagSampler(b.env.dsn, reader.slot)
        sampler.start()
        t_start = time.time()
        try:
            wait_slot_active(b, reader.slot, m)
            # The stream table's topic appears with its first change; then the probe.
            write_marker(b, "incremental-topic")
            deadline = time.time() + 120
            while not end_offsets(b.env.bootstrap, [reader.topic(STREAM)]):
                if time.time() > deadline or not m.running():
                    raise RuntimeError(f"no stream topic: {reader.log_tail(3)}")
                time.sleep(0.2)
            ready_probe(b, reader, m)
            consumer = LatencyConsumer(b.env.bootstrap, [reader.topic(STREAM)])
            consumer.start()
            rows_expected = b.params.big_rows
            # The load outlasts the snapshot (guessed at >= 10k rows/s); it is checked below.
            seconds = max(10.0, rows_expected / 10_000 + 10)
            load = workload.OpenLoopLoad(
                b.env.dsn, STREAM, RATE, 1, seconds, id_base=b.take_ids(int(RATE * seconds * 2))
            )
            load.start()
            while time.time() < load.t0 + 1.0:  # the load's schedule starts at t0
                time.sleep(0.05)
            with b.env.connect() as conn:
                emit_wal_signal(conn, execute_document([split_table(BIG)]))
            name = ".".join(split_table(BIG))
            done = re.compile(
                _STAMP + rf".*incremental snapshot of {re.escape(name)} complete: (\d+) rows"
            )
            started = re.compile(_STAMP + rf".*incremental snapshot of {re.escape(name)} started")
            deadline = time.time() + max(600.0, seconds * 4)
            text = ""
            while not done.search(text):
                if time.time() > deadline or not m.running():
                    raise RuntimeError(
                        f"the incremental snapshot did not finish: {reader.log_tail(3)}"
                    )
                time.sleep(0.2)
                text = (reader.workdir / "reader.log").read_text(errors="replace")
            res = load.join()
            if res.errors:
                raise RuntimeError(f"load generator failed: {res.errors[0]}")
            samples = consumer.stop()
        finally:
            lag = sampler.stop()
            reader.finish(m)
        end = done.search(text)
        begin = started.search(text)
        assert end is not None and begin is not None
        t0, t1, rows = _log_time(begin.group(1)), _log_time(end.group(1)), int(end.group(2))
        detail = f"{rows:,} rows, default chunk size, {RATE:,.0f} changes/s offered"
        if load.t0 + res.seconds < t1:
            detail += " (the load ended before the snapshot)"
        b.record.add(Figure("ours", METRICS[0], rows / max(1e-6, t1 - t0), "rows/s", detail,
                            extra={"seconds": t1 - t0, "rows": rows}))  # fmt: skip
        during = sorted(pt for pt in samples.points if t0 * 1000 <= pt[0] <= t1 * 1000)
        if during:
            lats = sorted(lat for _, lat in during)
            p99 = lats[min(len(lats) - 1, int(len(lats) * 0.99))]
            b.record.add(Figure("ours", METRICS[1], p99, "ms",
                                f"{len(lats):,} streamed events during the snapshot"))  # fmt: skip
            times = [t for t, _ in during]
            gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
            edges = [times[0] - t0 * 1000, t1 * 1000 - times[-1]]
            b.record.add(Figure("ours", METRICS[2], max(gaps + edges), "ms",
                                f"broker append times, {RATE:,.0f} changes/s offered"))  # fmt: skip
        else:
            b.record.not_measured("ours", METRICS[1], "no streamed event during the snapshot")
        if m.stats is not None:
            b.record.add(Figure("ours", METRICS[3], m.stats.peak_rss_mb, "MiB",
                                "whole run (streaming, then the snapshot)"))  # fmt: skip
        window = [s for s in lag if t0 <= s.t <= t1]
        if window:
            b.record.add(Figure("ours", METRICS[4], max(s.lag_bytes for s in window) / 2**20,
                                "MiB", "pg_current_wal_lsn() - confirmed_flush_lsn"))  # fmt: skip
        b.record.series.append(
            Series("ours slot lag during incremental snapshot", "MiB",
                   [(s.t - t_start, s.lag_bytes / 2**20) for s in lag])
        )  # fmt: skip
