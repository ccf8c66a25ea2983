"""The measurements, each a function that can run alone, and the order a full run uses.

Every function takes a :class:`Bench` (the run's environment, record and systems) and adds
figures to ``bench.record``. A system that is not available yields "not measured: <reason>".

Order of a full run (:func:`run_all`), chosen so every system reads the *same* WAL:

1. :func:`setup_tables` — snapshot tables (N and N/10 rows) and the streaming table;
2. :func:`snapshot_ours` / :func:`snapshot_debezium` — each on its own slot;
3. :func:`create_stream_slots` — our slot and Debezium's exist, both stopped;
4. :func:`catchup_phase` per transaction size — a ceiling slot, a backlog written with every
   reader stopped, then the ceilings (peek, pg_recvlogical), our catch-up and Debezium's;
5. :func:`streaming` per system — commit→Kafka latency at a fixed rate, then rate steps
   until the slot's lag is no longer flat;
6. :func:`envelope` and :func:`followers`.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from benchmarks import ceilings, workload
from benchmarks.debezium import DebeziumServer
from benchmarks.env import BenchEnv
from benchmarks.kafka import (
    CountWatcher,
    LatencyConsumer,
    end_offsets,
    span_timestamps,
    wait_for_marker,
)
from benchmarks.lag import LagSampler, trend
from benchmarks.ours import OursReader
from benchmarks.params import FULL, QUICK, Params
from benchmarks.proc import Measured
from benchmarks.results import BenchRecord, Figure, NotMeasured, Series

log = logging.getLogger(__name__)

BIG = "public.orders_big"
SMALL = "public.orders_small"
STREAM = "public.orders"


class System(Protocol):
    name: str
    slot: str
    prefix: str

    def topic(self, table: str) -> str: ...
    def available(self) -> str | None: ...
    def prepare(self) -> None: ...
    def log_tail(self, lines: int = 15) -> str: ...


@dataclass
class Bench:
    """One run: where it runs, what it measured, and the systems under test."""

    env: BenchEnv
    params: Params
    record: BenchRecord
    ours: OursReader | None = None
    dbz: DebeziumServer | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    dbz_streaming: bool = False  # Debezium's slot exists and it has streamed (see snapshot)
    dbz_live: Measured | None = None  # quick run: the catch-up instance, kept for latency
    fol_reader: OursReader | None = None  # the follower run's reader (not yet started)
    fol_jobs: Any = None  # its Spark jobs (benchmarks.followers.SparkJobs), once started
    next_id: int = 10**9  # ids of rows inserted by loads start here and only grow

    @classmethod
    def create(cls, env: BenchEnv) -> Bench:
        params = QUICK if env.quick else FULL
        return cls(env, params, BenchRecord(env.run_id, env.quick))

    def take_ids(self, n: int) -> int:
        """Reserve ``n`` fresh ids (generous: loads may insert fewer)."""
        first = self.next_id
        self.next_id += max(n, 1) * 2 + 1000
        return first


# --- 1. tables ----------------------------------------------------------------------------


def setup_tables(b: Bench) -> None:
    """Create this run's database and tables, and load them."""
    b.env.create_database()
    p = b.params
    with b.env.connect() as conn:
        for table, rows in ((BIG, p.big_rows), (SMALL, p.small_rows), (STREAM, p.stream_rows)):
            workload.create_table(conn, table)
            secs = workload.bulk_load(conn, table, rows)
            log.info("loaded %s with %d rows in %.1fs", table, rows, secs)
        b.record.environment["row_bytes"] = workload.avg_row_bytes(conn, STREAM)
        b.record.environment["columns"] = 10


def probe_systems(b: Bench) -> None:
    """Find out which systems can run here (reasons go into the report)."""
    b.ours = OursReader(b.env, [STREAM])
    reason = b.ours.available()
    if reason:
        b.unavailable["ours"] = reason
    b.dbz = DebeziumServer(b.env, [STREAM])
    reason = b.dbz.available()
    if reason:
        b.unavailable["debezium"] = reason
    for name, why in b.unavailable.items():
        b.record.notes.append(f"{name} not measured: {why}")


def _require(b: Bench, name: str) -> None:
    if name in b.unavailable:
        raise NotMeasured(b.unavailable[name])


# --- 2. snapshots -------------------------------------------------------------------------


def snapshot_ceiling(b: Bench, table: str = BIG) -> None:
    """COPY ... (FORMAT binary) of a snapshot table, read raw: the snapshot ceiling for a
    table of that size (ratios compare equal sizes)."""
    with b.record.guarded("postgres", ["COPY binary rows/s"]), b.env.connect() as conn:
        d = ceilings.copy_binary(conn, table)
        b.record.add(Figure("postgres", "COPY binary rows/s", d.rows_per_s, "rows/s",
                            f"{d.rows:,} rows"))  # fmt: skip


def _snapshot_figures(
    b: Bench,
    system: str,
    rows: int,
    wall: float,
    cpu: float,
    rss: float,
    span: tuple[int, int, int],
) -> None:
    first, last, count = span
    detail = f"{rows:,} rows"
    b.record.add(Figure(system, "snapshot rows/s", rows / wall, "rows/s", detail,
                        extra={"wall_s": wall, "records": count}))  # fmt: skip
    if last > first:
        b.record.add(Figure(system, "snapshot rows/s (first→last record)",
                            count / ((last - first) / 1000), "rows/s", detail))  # fmt: skip
    b.record.add(Figure(system, "snapshot CPU-s per 1M rows", cpu / rows * 1e6, "CPU-s", detail))
    b.record.add(Figure(system, "snapshot peak RSS", rss, "MiB", detail))


SNAP_METRICS = ["snapshot rows/s", "snapshot CPU-s per 1M rows", "snapshot peak RSS"]


def snapshot_ours(b: Bench, table: str = BIG, rows: int | None = None) -> None:
    """Our reader snapshots ``table`` (own slot, dropped after) with ``--until current``."""
    rows = (
        rows if rows is not None else (b.params.big_rows if table == BIG else b.params.small_rows)
    )
    with b.record.guarded("ours", SNAP_METRICS, f"{rows:,} rows"):
        _require(b, "ours")
        r = OursReader(b.env, [table], role="snap_" + table.split(".")[-1].removeprefix("orders_"))
        r.prepare()
        # The reader's --drop-slot-on-exit raced its own walsender ("slot in use"): drop
        # the slot here once it is inactive.
        m = r.launch(until_current=True, snapshot_mode="initial")
        try:
            r.finish(m, timeout_s=1800)
        finally:
            b.env.drop_slot(r.slot)
        st = m.stats
        assert st is not None
        span = span_timestamps(b.env.bootstrap, {(r.topic(table), 0): 0})
        if span[2] < rows:
            raise RuntimeError(f"only {span[2]} of {rows} snapshot records reached Kafka")
        _snapshot_figures(b, "ours", rows, st.wall_s, st.cpu_s, st.peak_rss_mb, span)


def snapshot_debezium(b: Bench, table: str = SMALL, rows: int | None = None) -> None:
    """Debezium Server snapshots ``table``; the same JVM start then becomes the streaming
    instance: its slot also covers the streaming table (not snapshotted), so once every
    row is in Kafka a marker on the streaming table proves it streams, and it stops with
    its slot and offsets kept for catch-up (one JVM start saved)."""
    rows = rows if rows is not None else b.params.small_rows
    with b.record.guarded("debezium", SNAP_METRICS, f"{rows:,} rows"):
        _require(b, "debezium")
        d = DebeziumServer(b.env, [table, STREAM], role="dbz", snapshot_mode="initial",
                           snapshot_tables=[table])  # fmt: skip
        b.dbz = d
        d.prepare()
        watcher = CountWatcher(b.env.bootstrap, [d.topic(table)])
        m = d.launch()
        try:
            done = watcher.wait_for(rows, timeout_s=1800, alive=m.running)
            wall = done - m.t0
            cpu = m.cpu_now()
            ready_probe(b, d, m)
            b.dbz_streaming = True
        except Exception as e:
            raise RuntimeError(f"{e}; log: {d.log_tail(3)}") from e
        finally:
            watcher.close()
            d.finish(m)
        st = m.stats
        assert st is not None
        span = span_timestamps(b.env.bootstrap, {(d.topic(table), 0): 0})
        _snapshot_figures(b, "debezium", rows, wall, cpu, st.peak_rss_mb, span)


# --- 3. stream slots ----------------------------------------------------------------------


def wait_slot_active(b: Bench, slot: str, m: Measured, timeout_s: float = 180) -> None:
    """Wait until a process holds ``slot`` (it exists and is active)."""
    deadline = time.time() + timeout_s
    with b.env.connect() as conn:
        while time.time() < deadline:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if row and row[0]:
                return
            if not m.running():
                raise RuntimeError(f"process exited before it took slot {slot}")
            time.sleep(0.2)
    raise TimeoutError(f"slot {slot} not active after {timeout_s:.0f}s")


def create_stream_slots(b: Bench) -> None:
    """Create our and Debezium's streaming slots now (no snapshot), then stop both."""
    if b.ours and "ours" not in b.unavailable:
        try:
            b.ours.prepare()
            m = b.ours.launch(until_current=True, snapshot_mode="no_data")
            b.ours.finish(m, timeout_s=300)
        except Exception as e:
            b.unavailable["ours"] = f"creating its slot failed: {e}"
    if b.dbz and "debezium" not in b.unavailable and not b.dbz_streaming:
        try:
            # The snapshot instance did not get to streaming: a plain streaming instance.
            b.dbz = DebeziumServer(b.env, [STREAM], role="dbzs")
            b.dbz.prepare()
            m = b.dbz.launch()
            try:
                wait_slot_active(b, b.dbz.slot, m)
                ready_probe(b, b.dbz, m)  # streaming for real, offsets committed
            finally:
                b.dbz.finish(m)
        except Exception as e:
            b.unavailable["debezium"] = f"creating its slot failed: {e}: {b.dbz.log_tail(3)}"


def write_marker(b: Bench, tag: str) -> bytes:
    """Change one row so its event carries a unique marker; returns the marker."""
    marker = f"mark-{b.env.run_id}-{tag}-{time.time_ns()}"
    with b.env.connect() as conn:
        conn.execute(
            "UPDATE public.orders SET status = %s, version = version + 1 WHERE id = 1", (marker,)
        )
    return marker.encode()


def ready_probe(b: Bench, system: Any, m: Measured, timeout_s: float = 300) -> None:
    """Change one row and wait until its event is in Kafka: the system is streaming (and
    past anything it replays first)."""
    start = end_offsets(b.env.bootstrap, [system.topic(STREAM)])
    marker = write_marker(b, "ready")
    wait_for_marker(b.env.bootstrap, start, marker, timeout_s, alive=m.running)


# --- 4. catch-up on the same WAL ---------------------------------------------------------


def catchup_phase(b: Bench, txn_rows: int, *, keep_peer: bool = False) -> None:
    """A backlog of mixed changes in ``txn_rows``-row transactions, written while every
    reader is stopped; then the ceilings, our catch-up and Debezium's, on that WAL."""
    p = b.params
    detail = f"{p.backlog_changes:,} changes, {txn_rows}-row txns"
    ceil_slot = b.env.register_slot(b.env.name(f"ceil{txn_rows}"))
    ceil_pub = b.env.name("ceil_pub")
    with b.env.connect() as conn:
        conn.execute(f"DROP PUBLICATION IF EXISTS {ceil_pub}")
        conn.execute(f"CREATE PUBLICATION {ceil_pub} FOR TABLE {STREAM}")
        ceilings.create_slot(conn, ceil_slot)
        backlog = workload.write_backlog(
            conn, STREAM, p.backlog_changes, txn_rows,
            first_new_id=b.take_ids(p.backlog_changes), update_ids=p.stream_rows,
        )  # fmt: skip
        endpos = ceilings.current_lsn(conn)
    marker = write_marker(b, f"catchup{txn_rows}")
    expected = backlog.changes + backlog.deletes  # a delete is an event and a tombstone
    b.record.notes.append(
        f"backlog {txn_rows}-row txns: {backlog.changes:,} changes ({backlog.inserts:,} I, "
        f"{backlog.updates:,} U, {backlog.deletes:,} D) in {backlog.txns:,} txns, "
        f"written in {backlog.seconds:.1f}s"
    )
    with b.record.guarded("postgres", ["pgoutput decode rows/s"], detail), b.env.connect() as c:
        d = ceilings.peek_decode(c, ceil_slot, ceil_pub)
        if d.rows != backlog.changes:
            b.record.notes.append(f"peek decoded {d.rows} rows, backlog wrote {backlog.changes}")
        b.record.add(Figure("postgres", "pgoutput decode rows/s", d.rows_per_s, "rows/s", detail))
    with b.record.guarded("pg_recvlogical", ["pg_recvlogical rows/s"], detail):
        r = ceilings.recvlogical_decode(b.env.dsn, ceil_slot, ceil_pub, endpos, backlog.changes)
        b.record.add(Figure("pg_recvlogical", "pg_recvlogical rows/s", r.rows_per_s, "rows/s",
                            detail))  # fmt: skip
    b.env.drop_slot(ceil_slot)
    for name in ("ours", "debezium"):
        with b.record.guarded(name, ["catch-up events/s"], detail):
            _require(b, name)
            catchup(b, name, marker, expected, backlog.changes, detail, keep=keep_peer)


def catchup(
    b: Bench,
    name: str,
    marker: bytes,
    expected: int,
    changes: int,
    detail: str,
    keep: bool = False,
) -> None:
    """Start ``name`` on its stopped slot and time until the backlog (and the marker
    written after it) is in Kafka."""
    system: Any = b.ours if name == "ours" else b.dbz
    topic = system.topic(STREAM)
    start = end_offsets(b.env.bootstrap, [topic])
    m = system.launch(until_current=True) if name == "ours" else system.launch()
    kept = False
    try:
        if name == "ours":
            system.finish(m)
            reached, seen = wait_for_marker(b.env.bootstrap, start, marker, 30)
            reached = m.t0 + (m.stats.wall_s if m.stats else 0.0)
        else:
            reached, seen = wait_for_marker(b.env.bootstrap, start, marker, 1800, alive=m.running)
            if keep:  # the quick run measures its latency next, without another JVM start
                b.dbz_live = m
                kept = True
    finally:
        if name != "ours" and not kept:
            system.finish(m)
    if seen != expected + 1:
        b.record.notes.append(
            f"{name} catch-up ({detail}): {seen:,} records up to the marker, expected "
            f"{expected + 1:,} (events + tombstones + marker); duplicates or gaps"
        )
    if kept:
        cpu_s, rss = m.cpu_now(), m.peak_rss_mb()
    else:
        assert m.stats is not None
        cpu_s, rss = m.stats.cpu_s, m.stats.peak_rss_mb
    wall = reached - m.t0
    first, last, count = span_timestamps(b.env.bootstrap, start)
    extra = {"wall_s": wall, "records": count, "cpu_s": cpu_s}
    b.record.add(Figure(name, "catch-up events/s (incl. startup)", changes / wall, "events/s",
                        detail, extra=extra))  # fmt: skip
    if last > first:
        b.record.add(Figure(name, "catch-up events/s", changes / ((last - first) / 1000),
                            "events/s", detail, extra=extra))  # fmt: skip
    b.record.add(Figure(name, "catch-up CPU-s per 1M changes", cpu_s / changes * 1e6,
                        "CPU-s", detail))  # fmt: skip
    b.record.add(Figure(name, "catch-up peak RSS", rss, "MiB", detail))


# --- 5. streaming: latency and the sustained rate -----------------------------------------


def streaming(b: Bench, name: str) -> None:
    """Start ``name`` streaming; measure commit→Kafka latency, then step the rate up."""
    metrics = ["commit→Kafka p50", "commit→Kafka p99"] + [
        f"max flat streaming changes/s ({t}-row txns)" for t in b.params.step_rates
    ]
    with b.record.guarded(name, metrics):
        _require(b, name)
        system: Any = b.ours if name == "ours" else b.dbz
        if name != "ours" and b.dbz_live is not None:
            m, b.dbz_live = b.dbz_live, None  # still running since its catch-up
        else:
            m = system.launch(until_current=False) if name == "ours" else system.launch()
        sampler = LagSampler(b.env.dsn, system.slot)
        sampler.start()
        t_start = time.time()
        try:
            wait_slot_active(b, system.slot, m)
            ready_probe(b, system, m)
            with b.record.guarded(name, ["commit→Kafka p50", "commit→Kafka p99"]):
                latency(b, name, system, m, t_start)
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


def latency(b: Bench, name: str, system: Any, m: Measured, t_start: float) -> None:
    """Commit→Kafka latency at the fixed rate: the event's source commit time against the
    broker's append time."""
    p = b.params
    consumer = LatencyConsumer(b.env.bootstrap, [system.topic(STREAM)])
    consumer.start()
    load = workload.OpenLoopLoad(
        b.env.dsn,
        STREAM,
        p.latency_rate,
        1,
        p.latency_s,
        id_base=b.take_ids(int(p.latency_rate * p.latency_s * 2)),
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
    if old:
        b.record.notes.append(f"{name}: {len(old):,} replayed events ignored in the latency run")
    if not samples.points:
        raise RuntimeError("no change events arrived")
    s = samples.summary()
    detail = (f"offered {p.latency_rate:,.0f}/s, achieved {res.achieved_rate:,.0f}/s, "
              f"1-row txns, {int(s['events']):,} events")  # fmt: skip
    if s["events"] < res.changes:
        detail += f" (of {res.changes:,} committed)"
    b.record.add(Figure(name, "commit→Kafka p50", s["p50_ms"], "ms", detail, extra=s))
    b.record.add(Figure(name, "commit→Kafka p99", s["p99_ms"], "ms", detail, extra=s))
    base = t_start * 1000
    b.record.series.append(
        Series(f"{name} commit→Kafka latency", "ms",
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
    """Step the offered rate up until the slot's lag trends upward; report the highest
    achieved rate whose lag stayed flat."""
    steps: list[dict[str, Any]] = []
    best: float | None = None
    limit = ""
    watcher = CountWatcher(b.env.bootstrap, [system.topic(STREAM)])
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
            tr = trend(sampler.window(load.t0, load.t0 + res.seconds))
            recs = (watcher.count() - before) / res.seconds
            steps.append({"offered": rate, "achieved": res.achieved_rate, "flat": tr.flat,
                          "lag_slope_Bps": tr.lag_slope_bps, "wal_Bps": tr.wal_rate_bps,
                          "end_lag": tr.end_lag, "kafka_records_per_s": recs,
                          "generator_kept_up": res.kept_up})  # fmt: skip
            log.info("%s step %s/s (%d-row txns): achieved %.0f/s, flat=%s, lag %d B",
                     name, rate, txn_rows, res.achieved_rate, tr.flat, tr.end_lag)  # fmt: skip
            if not tr.flat:
                limit = f"lag grew at {rate:,.0f}/s offered"
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
    metric = f"max flat streaming changes/s ({txn_rows}-row txns)"
    if best is None:
        b.record.not_measured(
            name, metric, f"lag grew already at the first step ({rates[0]:,.0f}/s offered)"
        )
        return
    b.record.add(Figure(name, metric, best, "changes/s", limit, extra={"steps": steps}))


def drain(b: Bench, slot: str, timeout_s: float) -> None:
    """Wait until the slot's lag is small again, so the next step starts clean."""
    deadline = time.time() + timeout_s
    with b.env.connect() as conn:
        while time.time() < deadline:
            row = conn.execute(
                "SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots "
                "WHERE slot_name = %s", (slot,)
            ).fetchone()  # fmt: skip
            if row is None or row[0] is None or int(row[0]) < 4 * 2**20:
                return
            time.sleep(0.5)
    log.warning("slot %s did not drain within %.0fs", slot, timeout_s)


# --- 6. envelope and followers ------------------------------------------------------------


def envelope(b: Bench) -> None:
    """Envelope build + JSON encode rate on one core, from scripts/bench_envelope.py."""
    from benchmarks.envelope import run_envelope_bench

    with b.record.guarded("envelope", ["envelope build+encode events/s"], "one core"):
        value, detail = run_envelope_bench(quick=b.env.quick)
        b.record.add(Figure("envelope", "envelope build+encode events/s", value, "events/s",
                            detail))  # fmt: skip


FOLLOWER_METRICS = ["commit→Redis p50", "commit→Redis p99", "commit→searchable p50",
                    "commit→searchable p99", "max sustained changes/s (Redis follower)",
                    "max sustained changes/s (search follower)"]  # fmt: skip


def start_followers(b: Bench) -> None:
    """Create the follower run's topics and start both Spark jobs (they take 20–90 s to
    start; idle until the follower reader runs). The quick run calls this first, so the
    start overlaps the other measurements (said in the notes)."""
    from benchmarks import followers as fol

    if b.fol_jobs is not None or fol.followers_unavailable() or "ours" in b.unavailable:
        return
    try:
        fol.create_probe_table(b.env)
        reader = OursReader(b.env, [STREAM, fol.PROBE], role="fol")
        reader.prepare()
        jobs = fol.SparkJobs(b.env, reader.prefix, reader.workdir)
        jobs.start()
    except Exception as e:  # followers() reports it
        log.exception("starting the Spark jobs failed")
        b.unavailable["followers"] = f"starting the Spark jobs failed: {e}"
        return
    b.fol_reader, b.fol_jobs = reader, jobs


def followers(b: Bench) -> None:
    """Commit→Redis and commit→searchable through the Spark jobs, at a steady rate; then
    the rate is stepped up until a follower's latency grows (it no longer keeps up)."""
    from benchmarks import followers as fol
    from pgcdc.core.settings import load_settings

    with b.record.guarded("followers", FOLLOWER_METRICS):
        why = fol.followers_unavailable() or b.unavailable.get("ours")
        if why:
            raise NotMeasured(why)
        settings = load_settings()
        redis_url = settings.redis.url.get_secret_value()
        search_url = settings.search.url.get_secret_value()
        start_followers(b)
        if b.fol_jobs is None or b.fol_reader is None:
            raise NotMeasured(b.unavailable.get("followers", "the Spark jobs did not start"))
        reader, jobs = b.fol_reader, b.fol_jobs
        t_jobs = jobs.started
        prober = fol.Prober(b.env, reader.prefix, redis_url, search_url, b.params.follower_probe_hz)
        m = reader.launch(until_current=False)
        prober.start()
        rss: dict[str, float] = {}

        def dead() -> str | None:
            if not m.running():
                return f"reader exited: {reader.log_tail(3)}"
            return jobs.dead()

        try:
            wait_slot_active(b, reader.slot, m)
            with b.env.connect() as conn:  # ready: one probe through both followers
                first = prober.write_one(conn)
            if not prober.wait_seen([first], 300, alive=dead):
                raise TimeoutError("the first probe did not reach both followers in 300s")
            b.record.notes.append(
                f"followers: both Spark jobs applied their first change {time.time() - t_jobs:.0f}s "
                f"after spark-submit (trigger {fol.TRIGGER})"
            )
            # Warm-up: the first loaded micro-batches pay for Python workers and connections.
            prober.writing(True)
            t_warm = time.time()
            _follower_load(b, b.params.follower_rate, 3 if b.env.quick else 8)
            prober.writing(False)
            prober.wait_seen(prober.between(t_warm, time.time()), 30, alive=dead)
            _follower_latency(b, fol, prober, dead)
            if b.params.follower_step_rates:
                _follower_steps(b, fol, prober, dead)
            else:
                for label in ("Redis", "search"):
                    b.record.not_measured("followers", f"max sustained changes/s ({label} follower)",
                                          "not measured in quick mode (BENCH_QUICK=1)")  # fmt: skip
        finally:
            prober.stop()
            rss = jobs.stop()
            b.fol_jobs = None
            reader.finish(m)
            for p in jobs.drop_follower_state(redis_url, search_url):
                b.record.notes.append(f"cleanup: {p}")
        for job, mb in rss.items():
            b.record.add(Figure("followers", f"{job} peak RSS", mb, "MiB",
                                "spark-submit process tree, --driver-memory 512m"))  # fmt: skip


def _follower_load(b: Bench, rate: float, seconds: float) -> workload.LoadResult:
    """The steady background load of a follower run: 10-row transactions (cheap to generate
    at these rates; the followers' cost is per change, not per transaction)."""
    load = workload.OpenLoopLoad(b.env.dsn, STREAM, rate, 10, seconds,
                                 id_base=b.take_ids(int(rate * seconds * 2)))  # fmt: skip
    res = load.run()
    if res.errors:
        raise RuntimeError(f"load generator failed: {res.errors[0]}")
    return res


def _follower_latency(b: Bench, fol: Any, prober: Any, dead: Any) -> None:
    p = b.params
    prober.writing(True)
    t0 = time.time()
    res = _follower_load(b, p.follower_rate, p.follower_s)
    prober.writing(False)
    probes = prober.between(t0, time.time())
    grace = 20 if b.env.quick else 60
    prober.wait_seen(probes, grace, alive=dead)
    detail = (f"offered {p.follower_rate:,.0f}/s, achieved {res.achieved_rate:,.0f}/s, "
              f"10-row txns, {p.follower_s:.0f}s; {len(probes)} probes")  # fmt: skip
    for follower, label in (("redis", "Redis"), ("search", "searchable")):
        lat = fol.latency_of(probes, follower)
        d = detail + (f", {lat.missing} not seen {grace}s after the load" if lat.missing else "")
        if lat.p50_ms is None:
            b.record.not_measured("followers", f"commit→{label} p50", "no probe arrived", d)
            b.record.not_measured("followers", f"commit→{label} p99", "no probe arrived", d)
            continue
        b.record.add(Figure("followers", f"commit→{label} p50", lat.p50_ms, "ms", d))
        b.record.add(Figure("followers", f"commit→{label} p99", lat.p99_ms, "ms", d))
        b.record.series.append(Series(
            f"followers commit→{label} latency", "ms",
            [(q.committed - t0, (q.seen[follower] - q.committed) * 1000)
             for q in probes if follower in q.seen]))  # fmt: skip


def _follower_steps(b: Bench, fol: Any, prober: Any, dead: Any) -> None:
    p = b.params
    best: dict[str, float | None] = {"redis": None, "search": None}
    limit = {"redis": "", "search": ""}
    steps: list[dict[str, Any]] = []
    for rate in p.follower_step_rates:
        prober.writing(True)
        t0 = time.time()
        res = _follower_load(b, rate, p.follower_step_s)
        prober.writing(False)
        probes = prober.between(t0, time.time())
        prober.wait_seen(probes, 20, alive=dead)
        step: dict[str, Any] = {"offered": rate, "achieved": res.achieved_rate,
                                "generator_kept_up": res.kept_up}  # fmt: skip
        for follower in ("redis", "search"):
            if limit[follower]:
                continue
            lat = fol.latency_of(probes, follower)
            step[follower] = {"p50_ms": lat.p50_ms, "p99_ms": lat.p99_ms, "slope": lat.slope,
                              "missing": lat.missing, "flat": lat.flat()}  # fmt: skip
            log.info("followers step %s/s: %s p50 %s ms slope %.3f missing %d", rate, follower,
                     lat.p50_ms, lat.slope, lat.missing)  # fmt: skip
            if not lat.flat():
                limit[follower] = (f"latency grew at {rate:,.0f}/s offered (slope "
                                   f"{lat.slope:.2f} s/s, {lat.missing} probes late)")  # fmt: skip
            elif not res.kept_up:
                best[follower] = max(best[follower] or 0.0, res.achieved_rate)
                limit[follower] = (f"LOWER BOUND, limited by the load generator (offered "
                                   f"{rate:,.0f}/s, achieved {res.achieved_rate:,.0f}/s)")  # fmt: skip
            else:
                best[follower] = max(best[follower] or 0.0, res.achieved_rate)
        steps.append(step)
        if all(limit.values()):
            break
        # Let a follower that fell behind drain before the next step.
        prober.wait_seen(probes, 30, alive=dead)
    for follower, label in (("redis", "Redis"), ("search", "search")):
        metric = f"max sustained changes/s ({label} follower)"
        value = best[follower]
        why = limit[follower] or "kept up at every step: the ceiling is higher"
        if value is None:
            b.record.not_measured(
                "followers", metric, f"not keeping up even at the first step: {why}"
            )
        else:
            b.record.add(Figure("followers", metric, value, "changes/s", why,
                                extra={"steps": steps}))  # fmt: skip


def stop_background(b: Bench) -> None:
    """Stop what a run left running after a failure (Spark jobs, a kept Debezium)."""
    if b.fol_jobs is not None:
        b.fol_jobs.stop()
        b.fol_jobs = None
    if b.dbz_live is not None and b.dbz is not None:
        b.dbz.finish(b.dbz_live)
        b.dbz_live = None


def rss_scaling(b: Bench) -> None:
    """How our peak RSS changes when the table or the transaction grows tenfold."""
    p = b.params
    pairs = [
        ("snapshot peak RSS", f"{p.small_rows:,} rows", f"{p.big_rows:,} rows",
         "peak RSS ×10 table rows"),
    ]  # fmt: skip
    sizes = b.params.catchup_txn_rows
    for small, big in itertools.pairwise(sizes):
        if big == small * 10:
            d = f"{p.backlog_changes:,} changes, {{}}-row txns"
            pairs.append(("catch-up peak RSS", d.format(small), d.format(big),
                          f"peak RSS ×10 txn rows ({small}→{big})"))  # fmt: skip
    for metric, d_small, d_big, label in pairs:
        a = b.record.find("ours", metric, d_small)
        c = b.record.find("ours", metric, d_big)
        if a is None or c is None or not a.value or c.value is None:
            b.record.not_measured("ours", label, "one of the two sizes was not measured")
            continue
        b.record.add(Figure("ours", label, c.value / a.value, "×",
                            f"{a.value:.0f} → {c.value:.0f} MiB ({d_small} → {d_big})"))  # fmt: skip


# --- the whole run ------------------------------------------------------------------------


def run_all(b: Bench) -> None:
    """Every measurement, in the order that lets all systems read the same WAL."""
    setup_tables(b)
    probe_systems(b)
    if b.env.quick:
        start_followers(b)
        b.record.notes.append(
            "quick run: the Spark jobs start at the beginning, so their JVM start overlaps "
            "(and slows) the other measurements"
        )
    snapshot_ceiling(b, BIG)
    snapshot_ceiling(b, SMALL)
    snapshot_ours(b, BIG, b.params.big_rows)
    snapshot_ours(b, SMALL, b.params.small_rows)
    # Debezium snapshots the small table (at its ~2k rows/s the big one would take minutes);
    # ratios only compare equal table sizes.
    snapshot_debezium(b, SMALL, b.params.small_rows)
    create_stream_slots(b)
    sizes = b.params.catchup_txn_rows
    for txn_rows in sizes:
        # Quick run: Debezium's last catch-up instance goes on to the latency run.
        catchup_phase(b, txn_rows, keep_peer=b.env.quick and txn_rows == sizes[-1])
    # Debezium streams first: a stopped slot replays everything written since, and ours
    # catches up on its load in seconds while Debezium took >300 s for ours' (full run).
    # A peer kept running from its catch-up must go first anyway (never beside ours).
    for name in ("debezium", "ours"):
        streaming(b, name)
    rss_scaling(b)
    envelope(b)
    followers(b)
