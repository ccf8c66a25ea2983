"""How fast ``cdc verify`` proves both followers equal to a table, and finds scattered drift
(issue 32), beside PostgreSQL's own ``count(*)`` of the same table as the ceiling.

    .venv/bin/python -m benchmarks.verify_speed [--rows 1000000] [--divergent 1000] [--passes 3]

One table of the backlog's shape (10 columns, about 200 bytes a row), ``--rows`` rows, the
reader streaming (heartbeats each second) and the shared job streaming into both followers,
as users run them, until both hold every row. Then, with the pipeline still running:

1. ``cdc verify --json`` of the table, nothing differing (``verify.max_rows_per_second = 0``:
   unpaced), ``--passes`` times (3): each pass's wall time, and the median pass's wall time
   and CPU as the figure;
2. ``--divergent`` keys made to differ in each follower by another client, scattered over
   the key space (a third deleted, a third changed, a third extra), and ``cdc verify``
   again: the run fails unless it finds exactly those;
3. ``SELECT count(*)`` of the table, the ceiling: what reading PostgreSQL's side alone costs.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import resource
import subprocess
import sys
import time
from typing import Any

import orjson
import redis
from opensearchpy import OpenSearch, helpers

from benchmarks.context import Bench
from benchmarks.env import ROOT, BenchEnv, run_alone
from benchmarks.followers_backlog import held_counts
from benchmarks.index_rebuild import shared_job_on
from benchmarks.results import Figure
from pgcdc.core.settings import load_settings
from sinks.search_index import index_name

log = logging.getLogger("bench.verify_speed")

TABLE = "public.orders_verify"


def _verify(env: dict[str, str]) -> tuple[float, float, dict[str, Any]]:
    """One ``cdc verify --json`` of the table: (wall s, CPU s, report)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cdc", "verify", "--json", "--fence-timeout", "120", TABLE],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise RuntimeError(f"cdc verify exited {done.returncode}: {done.stderr[-2000:]}") from None
    if done.returncode not in (0, 3) or "results" not in report:
        raise RuntimeError(f"cdc verify exited {done.returncode}: {report} {done.stderr[-2000:]}")
    return wall, cpu, report


def _redis_cpu(url: str) -> float:
    """The Redis server's CPU seconds so far (its fold runs there)."""
    r = redis.Redis.from_url(url)
    try:
        cpu = r.info("cpu")
    finally:
        r.close()
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _diverge(
    redis_url: str, search_url: str, prefix: str, rows: int, n: int
) -> dict[str, dict[str, set[str]]]:
    """``n`` keys made to differ in each follower (a third each missing, differing, extra),
    scattered; what each follower now holds wrongly, by kind."""
    rnd = random.Random(32)
    made: dict[str, dict[str, set[str]]] = {}
    r = redis.Redis.from_url(redis_url)
    client = OpenSearch(hosts=[search_url])
    index = index_name(prefix, TABLE)
    try:
        for follower in ("cache", "search"):
            keys = [str(k) for k in rnd.sample(range(rows), 2 * n // 3)]
            missing, differ = set(keys[: n // 3]), set(keys[n // 3 :])
            extra = {str(rows + 1_000_000 + i) for i in rnd.sample(range(rows), n - len(keys))}
            made[follower] = {"missing": missing, "differ": differ, "extra": extra}
            if follower == "cache":
                pipe = r.pipeline(transaction=False)
                for k in missing:
                    pipe.delete(f"{prefix}:{TABLE}:{k}")
                for k in differ:
                    pipe.hset(f"{prefix}:{TABLE}:{k}", "status", orjson.dumps("by hand"))
                for k in extra:
                    pipe.hset(f"{prefix}:{TABLE}:{k}", mapping={"id": k, "status": b'"stray"'})
                pipe.execute()
                continue
            actions: list[dict[str, Any]] = [
                {"_op_type": "delete", "_index": index, "_id": k} for k in missing
            ]
            actions += [
                {"_op_type": "update", "_index": index, "_id": k, "doc": {"status": "by hand"}}
                for k in differ
            ]
            actions += [
                {"_op_type": "index", "_index": index, "_id": k, "_source": {"id": int(k)}}
                for k in extra
            ]
            helpers.bulk(client, actions, refresh=True)
    finally:
        r.close()
        client.close()
    return made


def _found(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {
        x["follower"]: {kind: x[kind]["count"] for kind in ("missing", "differ", "extra")}
        for x in report["results"]
    }


def run(env: BenchEnv, rows: int, divergent: int, clean_passes: int = 3) -> dict[str, Any]:
    """Load, follow, verify clean (``clean_passes`` times: the median pass is the figure),
    verify with drift, count(*): every figure of the run."""
    settings = load_settings()
    redis_url = settings.redis.url.get_secret_value()
    search_url = settings.search.url.get_secret_value()
    reader, prefix, jobs = shared_job_on(env, TABLE, rows, "vf")
    streaming = reader.launch(until_current=False, snapshot_mode="initial")
    try:
        jobs.start()
        t0 = time.monotonic()
        while (held := held_counts(redis_url, search_url, prefix, TABLE)) != {
            "redis": rows,
            "search": rows,
        }:
            if time.monotonic() - t0 > 3600:
                raise RuntimeError(f"the followers hold {held} of {rows} rows after an hour")
            if (dead := jobs.dead()) is not None:
                raise RuntimeError(dead)
            time.sleep(5)
        log.info("both followers hold %d rows after %.0f s", rows, time.monotonic() - t0)
        verify_env = {
            **jobs.environ(),
            "CDC_POSTGRES__DSN": env.dsn,
            "CDC_POSTGRES__PUBLICATION_NAME": reader.publication,
            "CDC_POSTGRES__SLOT_NAME": reader.slot,
            "CDC_VERIFY__MAX_ROWS_PER_SECOND": "0",
        }
        passes = []  # (wall, CPU, Redis CPU, phases) of each clean pass
        for _ in range(clean_passes):
            redis_cpu = _redis_cpu(redis_url)
            wall, cpu, clean = _verify(verify_env)
            redis_cpu = _redis_cpu(redis_url) - redis_cpu
            if not clean["clean"]:
                raise RuntimeError(f"the clean pipeline did not verify clean: {_found(clean)}")
            phases = {x["follower"]: x.get("seconds", {}) for x in clean["results"]}
            log.info("clean: %.1f s (%.1f s CPU; Redis %.1f s CPU); phases %s", wall, cpu,
                     redis_cpu, phases)  # fmt: skip
            passes.append((wall, cpu, redis_cpu, phases))
        # The median pass (by wall time) is the figure; each pass's wall time is reported.
        clean_s, clean_cpu, redis_cpu, phases = sorted(passes)[len(passes) // 2]
        made = _diverge(redis_url, search_url, prefix, rows, divergent)
        drift_s, drift_cpu, drift = _verify(verify_env)
        want = {f: {kind: len(keys) for kind, keys in m.items()} for f, m in made.items()}
        if _found(drift) != want:
            raise RuntimeError(f"verify found {_found(drift)}, not the {want} made")
        log.info("%d divergent keys a follower: %.1f s (%.1f s CPU)", divergent, drift_s,
                 drift_cpu)  # fmt: skip
        with env.connect() as conn:
            t1 = time.perf_counter()
            conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
            count_s = time.perf_counter() - t1
    finally:
        jobs.stop()
        reader.finish(streaming)
        if not env.keep:
            for problem in jobs.drop_follower_state(redis_url, search_url):
                log.warning("cleanup: %s", problem)
    return {
        "rows": rows,
        "divergent_per_follower": divergent,
        "clean_s": round(clean_s, 1),
        "clean_passes_s": [round(p[0], 1) for p in passes],
        "clean_cpu_s": round(clean_cpu, 1),
        "clean_redis_cpu_s": round(redis_cpu, 1),
        "clean_phases_s": phases,
        "clean_rows_per_s": round(rows / clean_s),
        "drift_s": round(drift_s, 1),
        "drift_cpu_s": round(drift_cpu, 1),
        "count_s": round(count_s, 2),
        "clean_per_million_s": round(clean_s / rows * 1e6, 1),
    }


def verify_speed(b: Bench) -> None:
    """The ``verify_speed`` group: 1,000,000 rows (quick: 20,000); figures under ``verify``."""
    rows = 20_000 if b.env.quick else 1_000_000
    detail = (
        f"{rows:,}-row table (10 columns), both followers by the shared job while it streams; "
        "cdc verify --json, unpaced, target ≤ 15 s for 1M rows"
    )
    names = ["cdc verify, nothing differing, s", "cdc verify, 1,000 divergent keys, s",
             "count(*) of the table, s"]  # fmt: skip
    with b.record.guarded("verify", names, detail):
        got = run(b.env, rows, 1_000)
        each = ", ".join(f"{x:.1f}" for x in got["clean_passes_s"])
        b.record.add(Figure("verify", names[0], got["clean_s"], "s",
                            f"{detail}; the median of {len(got['clean_passes_s'])} passes"
                            f" ({each} s); {got['clean_cpu_s']:.1f} s CPU"))  # fmt: skip
        b.record.add(Figure("verify", names[1], got["drift_s"], "s",
                            f"{detail}; 1,000 keys a follower; {got['drift_cpu_s']:.1f} s CPU"))  # fmt: skip
        b.record.add(Figure("verify", names[2], got["count_s"], "s", detail))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.verify_speed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--divergent", type=int, default=1_000, help="keys made to differ a follower")
    p.add_argument("--passes", type=int, default=3, help="clean passes (the median is the figure)")
    p.add_argument("--keep", action="store_true", help="keep the database, topics and keys")
    a = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A line per request, and a 404 for each look at the index before the job made it.
    logging.getLogger("opensearch").setLevel(logging.ERROR)

    def measure(env: BenchEnv) -> dict[str, Any]:
        started = time.monotonic()
        result = run(env, a.rows, a.divergent, a.passes)
        return {**result, "bench_s": round(time.monotonic() - started, 1)}

    return run_alone(a.keep, "verify_speed", measure)


if __name__ == "__main__":
    sys.exit(main())
