"""Streaming: commit→Kafka latency at a fixed rate, then rate steps until the lag (Kafka's,
in seconds) is no longer flat."""

from __future__ import annotations

import logging
import time
from typing import Any

from benchmarks import workload
from benchmarks.context import STREAM, Bench, require, system_of
from benchmarks.kafka import CountWatcher, KafkaLagSampler, LatencyConsumer, LatencySamples
from benchmarks.lag import LagSampler, time_trend, trend
from benchmarks.probes import drain, ready_probe, wait_slot_active
from benchmarks.proc import Measured
from benchmarks.results import Figure, Series
from benchmarks.workload import LoadResult

log = logging.getLogger(__name__)


def streaming(b: Bench, name: str) -> None:
    """Start ``name`` streaming; measure commit→Kafka latency, then step the rate up."""
    metrics = ["commit→Kafka p50", "commit→Kafka p99"] + [
        f"max flat streaming changes/s ({t}-row txns)" for t in b.params.step_rates
    ]
    with b.record.guarded(name, metrics):
        require(b, name)
        system: Any = system_of(b, name)
        if name == "debezium" and b.dbz_live is not None:
            m, b.dbz_live = b.dbz_live, None  # still running since its catch-up
        else:
            m = system.launch(until_current=False) if name == "ours" else system.launch()
        sampler = LagSampler(b.env.dsn, system.slot)
        sampler.start()
        t_start = time.time()
        try:
            wait_slot_active(b, system.slot, m)
            ready_probe(b, system, m)
            for rate in b.params.latency_rates:
                with b.record.guarded(name, ["commit→Kafka p50", "commit→Kafka p99"]):
                    latency(b, name, system, m, t_start, rate)
            for txn_rows, rates in b.params.step_rates.items():
                if name != "ours" and txn_rows not in b.params.peer_step_txn_rows:
                    # The peer's rate steps cost minutes of JVM-side drain each.
                    why = (
                        "not measured in quick mode (BENCH_QUICK=1)"
                        if b.env.quick
                        else "not run for the peer (time budget of the full run)"
                    )
                    b.record.not_measured(name, f"max flat streaming changes/s ({txn_rows}-row txns)",
                                          why)  # fmt: skip
                    continue
                with b.record.guarded(
                    name, [f"max flat streaming changes/s ({txn_rows}-row txns)"]
                ):
                    rate_steps(b, name, system, m, sampler, txn_rows, rates)
        finally:
            samples = sampler.stop()
            system.finish(m)
        st = m.stats
        if st is not None:
            b.record.add(Figure(name, "streaming peak RSS", st.peak_rss_mb, "MiB",
                                "whole streaming phase"))  # fmt: skip
        b.record.series.append(
            Series(f"{name} slot lag", "MiB",
                   [(s.t - t_start, s.lag_bytes / 2**20) for s in samples])
        )  # fmt: skip


def offered_latency(
    dsn: str,
    bootstrap: str,
    topic: str,
    table: str,
    rate: float,
    seconds: float,
    id_base: int,
    *,
    on_receipt: bool = False,
) -> tuple[LatencySamples, LoadResult, int]:
    """Commit→Kafka latency at a fixed rate (changes/s, single-row transactions with
    durable commits, PostgreSQL's default): the event's source commit time against the
    broker's append time (``on_receipt``: a consumer's receipt). Returns the samples of
    events committed during the load, its result, and how many replayed events of earlier
    phases were left out."""
    consumer = LatencyConsumer(bootstrap, [topic], on_receipt=on_receipt)
    consumer.start()
    load = workload.OpenLoopLoad(
        dsn,
        table,
        rate,
        1,
        seconds,
        id_base=id_base,
        # Durable commits: an asynchronous one reaches any logical reader only at the WAL
        # writer's next flush (up to wal_writer_delay, 200 ms), which measured as ~130 ms of
        # every reader's commit→Kafka p50 at 1,000/s.
        durable=True,
    )
    res = load.run()
    if res.errors:
        consumer.stop()
        raise RuntimeError(f"load generator failed: {res.errors[0]}")
    consumer.wait_for(res.changes, timeout_s=120)
    samples = consumer.stop()
    # Events committed before the load began are replays of earlier phases, not this run.
    old = [pt for pt in samples.points if pt[0] - pt[1] < (load.t0 - 1) * 1000]
    samples.points = [pt for pt in samples.points if pt[0] - pt[1] >= (load.t0 - 1) * 1000]
    if not samples.points:
        raise RuntimeError("no change events arrived")
    return samples, res, len(old)


def latency(b: Bench, name: str, system: Any, m: Measured, t_start: float, rate: float) -> None:
    """Commit→Kafka latency at a fixed rate (:func:`offered_latency`)."""
    p = b.params
    samples, res, old = offered_latency(
        b.env.dsn,
        b.env.bootstrap,
        system.topic(STREAM),
        STREAM,
        rate,
        p.latency_s,
        b.take_ids(int(rate * p.latency_s * 2)),
    )
    if old:
        b.record.notes.append(f"{name}: {old:,} replayed events ignored in the latency run")
    s = samples.summary()
    detail = (f"offered {rate:,.0f}/s, achieved {res.achieved_rate:,.0f}/s, "
              f"1-row txns, {int(s['events']):,} events")  # fmt: skip
    if s["events"] < res.changes:
        detail += f" (of {res.changes:,} committed)"
    b.record.add(Figure(name, "commit→Kafka p50", s["p50_ms"], "ms", detail, extra=s))
    b.record.add(Figure(name, "commit→Kafka p99", s["p99_ms"], "ms", detail, extra=s))
    base = t_start * 1000
    b.record.series.append(
        Series(f"{name} commit→Kafka latency at {rate:,.0f}/s", "ms",
               [((t - base) / 1000, lat) for t, lat in samples.points])
    )  # fmt: skip


def rate_steps(
    b: Bench,
    name: str,
    system: Any,
    m: Measured,
    sampler: LagSampler,
    txn_rows: int,
    rates: tuple[float, ...],
) -> None:
    """Step the offered rate up until Kafka's lag (seconds since the newest event's commit)
    trends upward; report the highest achieved rate whose lag stayed flat. The slot's byte
    lag is recorded per step too (see :mod:`benchmarks.lag` for why it does not judge)."""
    steps: list[dict[str, Any]] = []
    best: float | None = None
    limit = ""
    watcher = CountWatcher(b.env.bootstrap, [system.topic(STREAM)])
    kafka_lag = KafkaLagSampler(b.env.bootstrap, [system.topic(STREAM)])
    kafka_lag.start()
    try:
        for rate in rates:
            if not m.running():
                raise RuntimeError(f"{name} exited during the rate steps: {system.log_tail(3)}")
            before = watcher.count()
            load = workload.OpenLoopLoad(
                b.env.dsn, STREAM, rate, txn_rows, b.params.step_s,
                id_base=b.take_ids(int(rate * b.params.step_s * 2)),
            )  # fmt: skip
            res = load.run()
            if res.errors:
                raise RuntimeError(f"load generator failed: {res.errors[0]}")
            t1 = load.t0 + res.seconds
            tt = time_trend([(x.t, x.lag_s) for x in kafka_lag.window(load.t0, t1)])
            tr = trend(sampler.window(load.t0, t1))
            recs = (watcher.count() - before) / res.seconds
            steps.append({"offered": rate, "achieved": res.achieved_rate, "flat": tt.flat,
                          "kafka_lag_slope_s_per_s": tt.slope,
                          "kafka_lag_start_s": tt.start_lag_s, "kafka_lag_end_s": tt.end_lag_s,
                          "slot_lag_flat": tr.flat, "lag_slope_Bps": tr.lag_slope_bps,
                          "wal_Bps": tr.wal_rate_bps, "end_lag": tr.end_lag,
                          "kafka_records_per_s": recs,
                          "generator_kept_up": res.kept_up})  # fmt: skip
            log.info("%s step %s/s (%d-row txns): achieved %.0f/s, flat=%s (Kafka lag %.2f→%.2f s, "
                     "slope %.3f s/s; slot lag %d B)", name, rate, txn_rows, res.achieved_rate,
                     tt.flat, tt.start_lag_s, tt.end_lag_s, tt.slope, tr.end_lag)  # fmt: skip
            if not tt.flat:
                limit = f"lag grew at {rate:,.0f}/s offered ({tt.slope:.2f} s/s)"
                drain(b, system.slot, timeout_s=15 if b.env.quick else 45)
                break
            best = max(best or 0.0, res.achieved_rate)
            if not res.kept_up:
                limit = (f"LOWER BOUND, limited by the load generator (offered {rate:,.0f}/s, "
                         f"it achieved {res.achieved_rate:,.0f}/s); the reader's own ceiling "
                         "is higher")  # fmt: skip
                break
        else:
            limit = "lag flat at every step: the reader's ceiling is higher"
    finally:
        watcher.close()
        kafka_lag.stop()
    metric = f"max flat streaming changes/s ({txn_rows}-row txns)"
    if best is None:
        why = f"lag grew already at the first step ({rates[0]:,.0f}/s offered)"
        b.record.add(Figure(name, metric, None, reason=why, extra={"steps": steps}))
        return
    b.record.add(Figure(name, metric, best, "changes/s", limit, extra={"steps": steps}))
