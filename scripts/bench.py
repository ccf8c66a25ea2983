#!/usr/bin/env python3
"""``make bench``: our reader against PostgreSQL's own ceilings and Debezium Server.

Environment (the flags below override it): BENCH_QUICK=1 for the short CI run; BENCH_KEEP=1
keeps the run's database and topics (slots are always dropped); BENCH_ONLY=name,name runs
only those measurement groups (see ``benchmarks.runner.GROUPS``); CDC_POSTGRES__DSN /
CDC_KAFKA__BOOTSTRAP_SERVERS point elsewhere. Results go to bench-results/<run id>/ and
bench-results/latest.*.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time

from benchmarks import runner
from benchmarks.context import Bench
from benchmarks.env import BenchEnv
from benchmarks.report import print_table, write_all

log = logging.getLogger("bench")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (all of it, or the groups asked for); write and print the report."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="the short CI run (as BENCH_QUICK=1)")
    p.add_argument("--keep", action="store_true", help="keep the database and topics")
    p.add_argument(
        "--only",
        default=os.environ.get("BENCH_ONLY", ""),
        help=f"comma-separated groups: {', '.join(runner.GROUPS)} (as BENCH_ONLY)",
    )
    args = p.parse_args(argv)
    only = [x for x in args.only.split(",") if x]
    unknown = [x for x in only if x not in runner.GROUPS]
    if unknown:
        p.error(f"--only/BENCH_ONLY knows {', '.join(runner.GROUPS)}; not {', '.join(unknown)}")
    logging.basicConfig(
        level=os.environ.get("BENCH_LOG", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if logging.getLogger().level > logging.DEBUG:
        # A line per request from the OpenSearch client (the warm-up's bulk requests, the
        # followers' checks): BENCH_LOG=DEBUG shows them.
        logging.getLogger("opensearch").setLevel(logging.WARNING)
    env = BenchEnv.from_environ()
    env.quick = env.quick or args.quick
    env.keep = env.keep or args.keep
    bench = Bench.create(env)
    bench.record.environment.update(
        {"cpus": os.cpu_count(), "python": platform.python_version(),
         "machine": platform.machine(), "database": env.database, "quick": env.quick}
    )  # fmt: skip
    t0 = time.time()
    status = 0
    try:
        if only:
            runner.run_groups(bench, only)
        else:
            runner.run_all(bench)
    except Exception as e:  # setup failed: still write what we have
        log.exception("bench run failed")
        bench.record.notes.append(f"run aborted: {type(e).__name__}: {e}")
        status = 1
    finally:
        runner.stop_background(bench)
        problems = env.cleanup()
        for problem in problems:
            bench.record.notes.append(f"cleanup: {problem}")
        bench.record.environment["duration_s"] = round(time.time() - t0, 1)
    paths = write_all(bench.record, env.run_dir)
    print_table(bench.record)
    print("written: " + ", ".join(str(path) for path in paths.values()))
    return status


if __name__ == "__main__":
    sys.exit(main())
