"""Rebuild a follower from offset 0 of a big compacted topic with bounded memory (issue 12,
case 6): ``python -m benchmarks.rebuild [--rows 1000000] [--cluster]``.

The run makes its own database, loads ``--rows`` rows of the benchmark's 10-column table
(``benchmarks/workload/orders.py``), snapshots them into a compacted topic with ``cdc run
--until current``, then runs ``spark_jobs/cache_sync.py --available-now`` into a brand-new
Redis key prefix with a bounded driver (``--driver-memory 512m``) and bounded micro-batches
(``--max-offsets-per-trigger``, default 100,000). It reports the job's wall time, rows/s and
the peak RSS of its whole process tree (the driver JVM and its Python workers, sampled with
psutil); with ``--cluster`` the job runs on a two-worker standalone cluster
(:class:`pgcdc.stack.spark_cluster.SparkCluster`, executors with ``--executor-memory 512m``)
and the workers' trees (their executors and Python workers) are sampled too. The follower
must hold exactly the table's row count at the end. The database, slot, topic and keys are
dropped at the end (``--keep`` keeps them).

Figures taken on a shared, loaded machine: the wall time is indicative; the peak RSS is what
the memory bounds hold it to.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import redis

from benchmarks.env import BenchEnv, dead_letter_topic, unlink_matching
from benchmarks.ours import OursReader
from benchmarks.proc import Measured
from benchmarks.workload.orders import bulk_load, create_table
from pgcdc.stack import common
from pgcdc.stack.spark_cluster import SparkCluster

log = logging.getLogger("bench.rebuild")

ROOT = Path(__file__).resolve().parents[1]
TABLE = "public.orders_rebuild"


class TreeSampler:
    """Peak of the summed RSS of some process trees, sampled every ``every`` seconds."""

    def __init__(self, pids: list[int], every: float = 0.5) -> None:
        self.pids = pids
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._done.wait(every):
            total = 0
            for pid in self.pids:
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(pid)
                    for p in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            total += p.memory_info().rss
            self.peak = max(self.peak, total)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(5)


def held_rows(redis_url: str, prefix: str) -> int:
    r = redis.Redis.from_url(redis_url)
    try:
        return sum(1 for _ in r.scan_iter(match=f"{prefix}:public.*", count=10_000))
    finally:
        r.close()


def drop_keys(redis_url: str, prefix: str) -> None:
    unlink_matching(redis_url, f"{prefix}:*")


def run(rows: int, max_offsets: int, cluster: SparkCluster | None, env: BenchEnv) -> dict[str, Any]:
    """Load, snapshot, rebuild; the figures."""
    redis_url = os.environ.get("CDC_REDIS__URL", "redis://127.0.0.1:56379/0")
    env.create_database()
    with env.connect() as conn:
        create_table(conn, TABLE)
        bulk_load(conn, TABLE, rows)
    reader = OursReader(env, [TABLE], role="rb")
    t0 = time.perf_counter()
    m = reader.launch(until_current=True, snapshot_mode="initial")
    reader.finish(m, timeout_s=3600)
    log.info("snapshot of %d rows in %.0f s", rows, time.perf_counter() - t0)

    workdir = reader.workdir
    key_prefix = env.name("rb_cache")
    job_env = dict(os.environ)
    job_env.update(
        {
            "CDC_KAFKA__BOOTSTRAP_SERVERS": env.bootstrap,
            "CDC_KAFKA__TOPIC_PREFIX": reader.prefix,
            "CDC_KAFKA__DEAD_LETTER_TOPIC": dead_letter_topic(reader.prefix),
            "CDC_REDIS__URL": redis_url,
            "CDC_REDIS__KEY_PREFIX": key_prefix,
            "CDC_SPARK__CHECKPOINT_DIR": str(workdir / "checkpoints"),
        }
    )
    env.create_topics([dead_letter_topic(reader.prefix)])
    submit = [str(ROOT / "scripts" / "spark-submit"), "--driver-memory", "512m"]
    if cluster is not None:
        submit += ["--master", cluster.master_url, "--executor-memory", "512m"]
        submit += ["--total-executor-cores", "2"]
    cmd = [
        *submit,
        "spark_jobs/cache_sync.py",
        "--available-now",
        "--starting-offsets",
        "earliest",
        "--max-offsets-per-trigger",
        str(max_offsets),
    ]
    workers = []
    if cluster is not None:
        workers = [p for i in (1, 2) if (p := cluster.pid(f"worker-{i}")) is not None]
    try:
        with TreeSampler(workers) as executors:
            job = Measured(cmd, env=job_env, cwd=ROOT, log_path=workdir / "cache_sync.log")
            st = job.wait(4 * 3600)
        if st.returncode != 0:
            raise RuntimeError(
                f"cache_sync exited {st.returncode}; log {workdir / 'cache_sync.log'}"
            )
        held = held_rows(redis_url, key_prefix)
        return {
            "rows": rows,
            "held_rows": held,
            "converged": held == rows,
            "master": cluster.master_url if cluster else "local[2]",
            "driver_memory": "512m",
            "executor_memory": "512m" if cluster else "(in the driver)",
            "max_offsets_per_trigger": max_offsets,
            "job_wall_s": round(st.wall_s, 1),
            "rows_per_s": round(rows / st.wall_s),
            "job_cpu_s": round(st.cpu_s, 1),
            "peak_rss_job_tree_mib": round(st.peak_rss_mb),
            "peak_rss_largest_process_mib": round(st.maxrss_mb),
            "peak_rss_worker_trees_mib": round(executors.peak / 2**20) if cluster else None,
        }
    finally:
        if not env.keep:
            drop_keys(redis_url, key_prefix)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rebuild", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
    p.add_argument("--cluster", action="store_true", help="on a two-worker standalone cluster")
    p.add_argument("--keep", action="store_true", help="keep the database, topics and keys")
    a = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    env = BenchEnv.from_environ()
    env.keep = env.keep or a.keep
    result: dict[str, Any] = {}
    try:
        if a.cluster:
            with SparkCluster(common.paths()).running() as cluster:
                result = run(a.rows, a.max_offsets_per_trigger, cluster, env)
        else:
            result = run(a.rows, a.max_offsets_per_trigger, None, env)
    finally:
        if not env.keep:
            env.cleanup()
    out = env.run_dir / "rebuild.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    log.info("written %s", out)
    return 0 if result.get("converged") else 1


if __name__ == "__main__":
    sys.exit(main())
