#!/usr/bin/env python3
"""``make bench``: our reader against PostgreSQL's own ceilings and Debezium Server.

Environment: BENCH_QUICK=1 for the short CI run; BENCH_KEEP=1 keeps the run's database and
topics (slots are always dropped); BENCH_ONLY=name,name runs only those measurements (see
``benchmarks.runner``); CDC_POSTGRES__DSN / CDC_KAFKA__BOOTSTRAP_SERVERS point elsewhere.
Results go to bench-results/<run id>/ and bench-results/latest.*.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import runner
from benchmarks.env import BenchEnv
from benchmarks.report import print_table, write_all

log = logging.getLogger("bench")

# Measurements that BENCH_ONLY may pick (setup and slot creation run as needed).
ONLY = {
    "snapshot": lambda b: (runner.snapshot_ceiling(b, runner.BIG),
                           runner.snapshot_ceiling(b, runner.SMALL),
                           runner.snapshot_ours(b, runner.BIG),
                           runner.snapshot_ours(b, runner.SMALL),
                           runner.snapshot_debezium(b, runner.SMALL)),
    "catchup": lambda b: (runner.create_stream_slots(b),
                          [runner.catchup_phase(b, t) for t in b.params.catchup_txn_rows]),
    "streaming": lambda b: (runner.create_stream_slots(b), runner.streaming(b, "ours"),
                            runner.streaming(b, "debezium")),
    "envelope": runner.envelope,
    "followers": runner.followers,
}  # fmt: skip


def main() -> int:
    logging.basicConfig(
        level=os.environ.get("BENCH_LOG", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    env = BenchEnv.from_environ()
    bench = runner.Bench.create(env)
    bench.record.environment.update(
        {"cpus": os.cpu_count(), "python": platform.python_version(),
         "machine": platform.machine(), "database": env.database, "quick": env.quick}
    )  # fmt: skip
    only = [x for x in os.environ.get("BENCH_ONLY", "").split(",") if x]
    unknown = [x for x in only if x not in ONLY]
    if unknown:
        print(f"error: BENCH_ONLY knows {', '.join(ONLY)}; not {', '.join(unknown)}")
        return 2
    t0 = time.time()
    status = 0
    try:
        if only:
            runner.setup_tables(bench)
            runner.probe_systems(bench)
            for name in only:
                ONLY[name](bench)
        else:
            runner.run_all(bench)
    except Exception as e:  # setup failed: still write what we have
        log.exception("bench run failed")
        bench.record.notes.append(f"run aborted: {type(e).__name__}: {e}")
        status = 1
    finally:
        runner.stop_background(bench)
        problems = env.cleanup()
        for p in problems:
            bench.record.notes.append(f"cleanup: {p}")
        bench.record.environment["duration_s"] = round(time.time() - t0, 1)
    paths = write_all(bench.record, env.run_dir)
    print_table(bench.record)
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return status


if __name__ == "__main__":
    sys.exit(main())
