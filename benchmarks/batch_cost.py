"""What one micro-batch costs the shared job when it carries almost nothing (issue 30):
``python -m benchmarks.batch_cost [--seconds 60] [--every-ms 250] [--variants default,...]``.

A change is produced to a table topic every ``--every-ms`` (the reader's own encoding and
version headers, as ``benchmarks.transfer`` makes them), so the shared job
(``spark_jobs/sync.py --followers cache,search``, ``local[2]``, the direct read, its 200 ms
trigger) runs a batch of one or two changes after each. Over ``--seconds`` after its first
batches, the figure is the CPU seconds of the job's process tree (JVM and Python) per batch:
Spark's fixed cost of a micro-batch (planning, two Spark jobs, the checkpoint's files, the
tasks' start), which at 1,000 changes/s is most of what the job spends.

Each variant is a set of settings the job runs with, one after the other in the same run:
``default``; ``filecontext`` and ``filesystem`` (``spark.checkpoint_files``; the default,
``auto``, is ``filesystem`` on the local checkpoint here); ``sequential``
(``spark.concurrent_followers = false``).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import threading
import time
from typing import Any

from benchmarks.env import BenchEnv, run_alone
from benchmarks.followers import SparkJobs
from benchmarks.transfer import records
from pgcdc.core.settings import load_settings

log = logging.getLogger("bench.batch_cost")

VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "filecontext": {"CDC_SPARK__CHECKPOINT_FILES": "filecontext"},
    "filesystem": {"CDC_SPARK__CHECKPOINT_FILES": "filesystem"},
    "sequential": {"CDC_SPARK__CONCURRENT_FOLLOWERS": "false"},
}
_BATCH = re.compile(r" spark_jobs\.apply_loop: batch (\d+): ")


def _producer(bootstrap: str, topic: str, every_s: float, stop: threading.Event) -> int:
    from confluent_kafka import Producer

    recs = records(10_000, 1, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    sent = 0
    while not stop.wait(every_s):
        key, value, _t, _p, _o, _ts, headers = recs[sent % len(recs)]
        producer.produce(topic, value, key, headers=headers)
        producer.poll(0)
        sent += 1
    producer.flush(30)
    return sent


def _batches(text: str) -> set[int]:
    return {int(m.group(1)) for m in _BATCH.finditer(text)}


def measure_variant(
    env: BenchEnv, prefix: str, topic: str, name: str, seconds: float, every_s: float
) -> dict[str, Any]:
    """Run the shared job with variant ``name``'s settings; its CPU per batch."""
    import os

    saved = {k: os.environ.get(k) for k in VARIANTS[name]}
    os.environ.update(VARIANTS[name])
    stop = threading.Event()
    sender = threading.Thread(
        target=_producer, args=(env.bootstrap, topic, every_s, stop), daemon=True
    )
    jobs = SparkJobs(
        env, prefix, env.run_dir, jobs=("sync:cache,search",),
        follower_prefix=env.name(f"bc_{name}"), starting_offsets="latest", read="direct",
    )  # fmt: skip
    try:
        jobs.start()
        sender.start()
        (job,) = jobs.procs
        m = jobs.procs[job]
        deadline = time.monotonic() + 300
        # Warm: the first batches (the JVM's JIT, the workers' start) are not counted.
        while len(_batches(jobs.log_path(job).read_text(errors="replace"))) < 10:
            if time.monotonic() > deadline or not m.running():
                raise RuntimeError(f"{name}: the job ran no batches: {jobs.first_error(job)}")
            time.sleep(0.5)
        cpu0, b0 = m.cpu_now(), _batches(jobs.log_path(job).read_text(errors="replace"))
        t0 = time.time()
        time.sleep(seconds)
        cpu1, b1 = m.cpu_now(), _batches(jobs.log_path(job).read_text(errors="replace"))
        batches = len(b1 - b0)
        time.sleep(0.5)  # a sample after the window's end
        return {
            "by_process": m.cpu_parts_between(t0, t0 + seconds),
            "variant": name,
            "batches": batches,
            "cpu_s": round(cpu1 - cpu0, 2),
            "cpu_ms_per_batch": round((cpu1 - cpu0) / max(batches, 1) * 1e3, 1),
            "job_cores": round((cpu1 - cpu0) / seconds, 2),
        }
    finally:
        stop.set()
        jobs.stop()
        if not env.keep:
            settings = load_settings()
            for problem in jobs.drop_follower_state(
                settings.redis.url.get_secret_value(), settings.search.url.get_secret_value()
            ):
                log.warning("cleanup: %s", problem)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(env: BenchEnv, variants: list[str], seconds: float, every_s: float) -> dict[str, Any]:
    prefix = env.name("bc")
    table_topic = records(1, 1, 1)[0][2]
    topic = f"{prefix}.{table_topic.split('.', 1)[1]}"
    env.create_topics([topic])
    out = []
    for name in variants:
        r = measure_variant(env, prefix, topic, name, seconds, every_s)
        log.info(
            "%s: %d batches in %.0f s, %.1f ms of CPU a batch (the job kept %.2f cores busy; "
            "by process: %s)",
            name, r["batches"], seconds, r["cpu_ms_per_batch"], r["job_cores"], r["by_process"],
        )  # fmt: skip
        out.append(r)
    return {"seconds": seconds, "every_ms": every_s * 1e3, "variants": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.batch_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--every-ms", type=float, default=250.0)
    p.add_argument("--variants", default="default,filecontext", help=", ".join(VARIANTS))
    p.add_argument("--keep", action="store_true", help="keep the topics and keys")
    a = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("opensearch").setLevel(logging.WARNING)  # a line per request
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; the variants are {', '.join(VARIANTS)}")
    return run_alone(
        a.keep, "batch_cost", lambda env: run(env, variants, a.seconds, a.every_ms / 1e3)
    )


if __name__ == "__main__":
    sys.exit(main())
