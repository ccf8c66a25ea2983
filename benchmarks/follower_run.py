"""The followers' run: commit→Redis and commit→searchable through both Spark jobs, at a
steady rate, then rate steps until a follower no longer keeps up (see
:mod:`benchmarks.followers` for the jobs and the prober)."""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from benchmarks import followers as fol
from benchmarks import servers, workload
from benchmarks.context import STREAM, Bench
from benchmarks.ours import OursReader
from benchmarks.probes import wait_slot_active
from benchmarks.results import Figure, NotMeasured, Series
from pgcdc.core.contract import CACHE_JOB, JOBS, SEARCH_JOB
from pgcdc.core.settings import load_settings

log = logging.getLogger(__name__)


MODES = {  # mode -> (jobs, the prober's followers, label)
    "shared": (("sync:cache,search",), ("redis", "search"), "shared job"),
    "both": (tuple(JOBS), ("redis", "search"), "both jobs"),
    "redis": ((CACHE_JOB,), ("redis",), "Redis job alone"),
    "search": ((SEARCH_JOB,), ("search",), "search job alone"),
}
LABEL = {"redis": "Redis", "search": "searchable"}
# On the standalone cluster: each job's cores (one executor of one core on each worker).
CORES_PER_JOB = 2


def spark_masters() -> list[str]:
    """``BENCH_SPARK_MASTERS`` (comma-separated; default ``local[2]``). ``standalone``
    stands for a two-worker standalone cluster: the local stack's
    (:class:`pgcdc.stack.spark_cluster.SparkCluster`), or what
    ``BENCH_SPARK_CLUSTER=module:function`` starts (it returns ``(master_url, stop)``)."""
    raw = os.environ.get("BENCH_SPARK_MASTERS", "local[2]")
    return [m.strip() for m in raw.split(",") if m.strip()]


def _start_cluster(apps: int = 1) -> tuple[str, Callable[[], None]]:
    """A two-worker cluster with room for ``apps`` jobs at once: each worker gets a core and
    768 MiB per job, so that every job gets an executor on both workers (an application
    takes every free core by default, and a second one would wait for ever; each job is
    capped by :data:`CORES_PER_JOB`)."""
    hook = os.environ.get("BENCH_SPARK_CLUSTER")
    if not hook:  # the local stack's two-worker cluster (scripts/stack, pgcdc.stack)
        from pgcdc.stack.spark_cluster import SparkCluster

        cluster = SparkCluster(worker_cores=apps, worker_memory=f"{768 * apps}m")
        cluster.start()
        return cluster.master_url, cluster.stop
    module, _, func = hook.partition(":")
    start = getattr(importlib.import_module(module), func)
    url, stop = start()
    return str(url), stop


def metric_names(params: Any, masters: list[str]) -> list[str]:
    """Every figure the follower run reports (the names ``guarded`` falls back on)."""
    out = []
    for master in masters:
        for mode in params.follower_modes:
            _jobs, wanted, label = MODES[mode]
            for rate in params.follower_rates:
                for f in wanted:
                    out += [f"commit→{LABEL[f]} p50 @{rate:,.0f}/s ({label}, {master})",
                            f"commit→{LABEL[f]} p99 @{rate:,.0f}/s ({label}, {master})"]  # fmt: skip
            for f in wanted:
                out.append(f"max sustained changes/s ({LABEL[f]} follower, {label}, {master})")
    return out


def start_followers(b: Bench) -> None:
    """Create the follower run's topics and start the first mode's Spark jobs (they take
    20–90 s to start; idle until the follower reader runs). The quick run calls this first,
    so the start overlaps the other measurements (said in the notes)."""
    if b.fol_jobs is not None or fol.followers_unavailable() or "ours" in b.unavailable:
        return
    try:
        fol.create_probe_table(b.env)
        reader = OursReader(b.env, [STREAM, fol.PROBE], role="fol")
        reader.prepare()
        masters = spark_masters()
        mode = b.params.follower_modes[0]
        jobs = fol.SparkJobs(
            b.env, reader.prefix, reader.workdir, jobs=MODES[mode][0],
            follower_prefix=f"{reader.prefix}_0",
            master=None if masters[0] == "local[2]" else masters[0],
        )  # fmt: skip
        if masters[0] != "standalone":
            jobs.start()
    except Exception as e:  # followers() reports it
        log.exception("starting the Spark jobs failed")
        b.unavailable["followers"] = f"starting the Spark jobs failed: {e}"
        return
    b.fol_reader, b.fol_jobs = reader, jobs


def followers(b: Bench) -> None:
    """For each Spark master and each mode (both jobs, each alone): commit→Redis and
    commit→searchable at each steady rate, then rate steps until a follower's latency
    grows (it no longer keeps up). One reader and one prober serve every mode; each mode
    has its own follower prefix and starts its jobs at the topics' end."""
    masters = spark_masters()
    with b.record.guarded("followers", metric_names(b.params, masters)):
        why = fol.followers_unavailable() or b.unavailable.get("ours")
        if why:
            raise NotMeasured(why)
        settings = load_settings()
        redis_url = settings.redis.url.get_secret_value()
        search_url = settings.search.url.get_secret_value()
        start_followers(b)
        if b.fol_jobs is None or b.fol_reader is None:
            raise NotMeasured(b.unavailable.get("followers", "the Spark jobs did not start"))
        reader, first = b.fol_reader, b.fol_jobs
        prober = fol.Prober(
            b.env, first.follower_prefix, redis_url, search_url, b.params.follower_probe_hz
        )
        m = reader.launch(until_current=False)
        prober.start()
        try:
            wait_slot_active(b, reader.slot, m)
            n = 0
            for master in masters:
                for mode in b.params.follower_modes:
                    names = [x for x in metric_names(b.params, [master]) if MODES[mode][2] in x]
                    with b.record.guarded("followers", names):
                        jobs = first if n == 0 else None
                        _mode(b, reader, m, prober, master, mode, n, jobs, redis_url, search_url)
                    n += 1
        finally:
            prober.stop()
            b.fol_jobs = None
            reader.finish(m)


def _mode(
    b: Bench, reader: Any, m: Any, prober: Any, master: str, mode: str, n: int,
    jobs: Any, redis_url: str, search_url: str,
) -> None:  # fmt: skip
    """One master and mode: start its jobs (unless started), measure, stop them."""
    job_names, wanted, label = MODES[mode]
    stop_cluster: Callable[[], None] | None = None
    url = None if master == "local[2]" else master
    if master == "standalone":
        url, stop_cluster = _start_cluster(len(job_names))
    if jobs is None or master == "standalone":
        jobs = fol.SparkJobs(
            b.env, reader.prefix, reader.workdir, jobs=job_names,
            follower_prefix=f"{reader.prefix}_{n}", master=url,
            starting_offsets="latest" if n else None,
            total_cores=CORES_PER_JOB if master == "standalone" else None,
        )  # fmt: skip
        jobs.start()
    b.fol_jobs = jobs
    prober.retarget(jobs.follower_prefix, wanted)
    where = f"{label}, {master}"
    rss: dict[str, float] = {}

    def dead() -> str | None:
        if not m.running():
            return f"reader exited: {reader.log_tail(3)}"
        why: str | None = jobs.dead()
        return why

    try:
        # Ready: a probe through the followers. Jobs of a later mode start at the topics'
        # end once their query runs, which is a minute or more after spark-submit: a probe
        # written before that is never applied, so one is written every 5 s until one is.
        deadline = time.monotonic() + 300
        ready = False
        with b.env.connect() as conn:
            while not ready and time.monotonic() < deadline:
                first = prober.write_one(conn)
                ready = prober.wait_seen([first], 5, alive=dead)
        if not ready:
            raise TimeoutError(f"no probe reached the followers in 300s ({where})")
        b.record.notes.append(
            f"followers ({where}): the jobs applied their first change "
            f"{time.time() - jobs.started:.0f}s after spark-submit (trigger {fol.TRIGGER})"
        )
        # Warm-up: the first loaded micro-batches pay for Python workers and connections.
        prober.writing(True)
        t_warm = time.time()
        _follower_load(b, b.params.follower_rates[0], 3 if b.env.quick else 8)
        prober.writing(False)
        prober.wait_seen(prober.between(t_warm, time.time()), 30, alive=dead)
        for rate in b.params.follower_rates:
            _follower_latency(b, prober, dead, rate, wanted, where, jobs)
        if b.params.follower_step_rates:
            _follower_steps(b, prober, dead, wanted, where)
        else:
            for f in wanted:
                b.record.not_measured("followers", f"max sustained changes/s ({LABEL[f]} "
                                      f"follower, {where})",
                                      "not measured in quick mode (BENCH_QUICK=1)")  # fmt: skip
    finally:
        rss = jobs.stop()
        b.fol_jobs = None
        for p in jobs.drop_follower_state(redis_url, search_url):
            b.record.notes.append(f"cleanup: {p}")
        if stop_cluster is not None:
            stop_cluster()
    for job, mb in rss.items():
        b.record.add(Figure("followers", f"{job} peak RSS ({where})", mb, "MiB",
                            "spark-submit process tree, sum of RSS, --driver-memory 512m"))  # fmt: skip
        if job in jobs.peak_pss:
            b.record.add(Figure("followers", f"{job} peak PSS ({where})", jobs.peak_pss[job],
                                "MiB", "spark-submit process tree, sum of PSS (pages shared by "
                                f"forked workers counted once); at the peak: "
                                f"{jobs.peak_parts[job]}"))  # fmt: skip


def _follower_load(b: Bench, rate: float, seconds: float) -> workload.LoadResult:
    """The steady background load of a follower run: 10-row transactions (cheap to generate
    at these rates; the followers' cost is per change, not per transaction)."""
    load = workload.OpenLoopLoad(b.env.dsn, STREAM, rate, 10, seconds,
                                 id_base=b.take_ids(int(rate * seconds * 2)))  # fmt: skip
    res = load.run()
    if res.errors:
        raise RuntimeError(f"load generator failed: {res.errors[0]}")
    return res


def _follower_latency(
    b: Bench,
    prober: Any,
    dead: Any,
    rate: float,
    wanted: tuple[str, ...],
    where: str,
    jobs: fol.SparkJobs,
) -> None:
    p = b.params
    prober.writing(True)
    t0 = time.time()
    cpu0 = servers.cpu_seconds()
    jobs0 = {j: m.cpu_sampled() for j, m in jobs.procs.items()}
    res = _follower_load(b, rate, p.follower_s)
    busy = servers.cores_used(cpu0, servers.cpu_seconds(), time.time() - t0)
    # The jobs' own CPU while the load ran, over the changes it committed meanwhile: what a
    # running job costs a change (no start in it, unlike the backlog's).
    spent = {j: m.cpu_sampled() - jobs0[j] for j, m in jobs.procs.items()}
    t1 = time.time()
    busy += "; the jobs' CPU a change: " + ", ".join(
        f"{j} {c / max(res.changes, 1) * 1e6:.0f} µs ({c / (t1 - t0):.2f} cores: "
        f"{jobs.procs[j].cpu_parts_between(t0, t1)})"
        for j, c in spent.items()
    )
    prober.writing(False)
    probes = prober.between(t0, time.time())
    grace = 20 if b.env.quick else 60
    prober.wait_seen(probes, grace, alive=dead)
    detail = (f"offered {rate:,.0f}/s, achieved {res.achieved_rate:,.0f}/s, "
              f"10-row txns, {p.follower_s:.0f}s; {len(probes)} probes; "
              f"servers' cores during the load: {busy}")  # fmt: skip
    log.info("followers @%s/s (%s): servers' cores during the load: %s", rate, where, busy)
    for follower in wanted:
        label = LABEL[follower]
        name = f"commit→{label} %s @{rate:,.0f}/s ({where})"
        lat = fol.latency_of(probes, follower)
        d = detail + (f", {lat.missing} not seen {grace}s after the load" if lat.missing else "")
        if lat.p50_ms is None:
            b.record.not_measured("followers", name % "p50", "no probe arrived", d)
            b.record.not_measured("followers", name % "p99", "no probe arrived", d)
            continue
        b.record.add(Figure("followers", name % "p50", lat.p50_ms, "ms", d))
        b.record.add(Figure("followers", name % "p99", lat.p99_ms, "ms", d))
        b.record.series.append(Series(
            f"followers commit→{label} latency @{rate:,.0f}/s ({where})", "ms",
            [(q.committed - t0, (q.seen[follower] - q.committed) * 1000)
             for q in probes if follower in q.seen]))  # fmt: skip


def _follower_steps(b: Bench, prober: Any, dead: Any, wanted: tuple[str, ...], where: str) -> None:
    p = b.params
    best: dict[str, float | None] = dict.fromkeys(wanted)
    limit = dict.fromkeys(wanted, "")
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
        for follower in wanted:
            if limit[follower]:
                continue
            lat = fol.latency_of(probes, follower)
            step[follower] = {"p50_ms": lat.p50_ms, "p99_ms": lat.p99_ms, "slope": lat.slope,
                              "missing": lat.missing, "flat": lat.flat()}  # fmt: skip
            log.info("followers step %s/s (%s): %s p50 %s ms slope %.3f missing %d", rate, where,
                     follower, lat.p50_ms, lat.slope, lat.missing)  # fmt: skip
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
    for follower in wanted:
        metric = f"max sustained changes/s ({LABEL[follower]} follower, {where})"
        value = best[follower]
        why = limit[follower] or "kept up at every step: the ceiling is higher"
        if value is None:
            b.record.not_measured(
                "followers", metric, f"not keeping up even at the first step: {why}"
            )
        else:
            b.record.add(Figure("followers", metric, value, "changes/s", why,
                                extra={"steps": steps}))  # fmt: skip
