"""The followers' run: commit→Redis and commit→searchable through both Spark jobs, at a
steady rate, then rate steps until a follower no longer keeps up (see
:mod:`benchmarks.followers` for the jobs and the prober)."""

from __future__ import annotations

import logging
import time
from typing import Any

from benchmarks import followers as fol
from benchmarks import workload
from benchmarks.context import STREAM, Bench
from benchmarks.ours import OursReader
from benchmarks.probes import wait_slot_active
from benchmarks.results import Figure, NotMeasured, Series
from pgcdc.core.settings import load_settings

log = logging.getLogger(__name__)


FOLLOWER_METRICS = ["commit→Redis p50", "commit→Redis p99", "commit→searchable p50",
                    "commit→searchable p99", "max sustained changes/s (Redis follower)",
                    "max sustained changes/s (search follower)"]  # fmt: skip


def start_followers(b: Bench) -> None:
    """Create the follower run's topics and start both Spark jobs (they take 20–90 s to
    start; idle until the follower reader runs). The quick run calls this first, so the
    start overlaps the other measurements (said in the notes)."""
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
            why: str | None = jobs.dead()
            return why

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
