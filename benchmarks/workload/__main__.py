"""Run the marked workload from the command line (see :mod:`benchmarks.workload.marked`)::

    .venv/bin/python -m benchmarks.workload --dsn postgresql://... --table public.items \\
        --rows 20000 --writers 4 --seconds 30 --log /tmp/changes.jsonl
"""

from __future__ import annotations

import argparse
import time

from benchmarks.workload.marked import Workload, write_log


def main(argv: list[str] | None = None) -> int:
    """Load the table if asked, run the writers for ``--seconds``, write the log."""
    p = argparse.ArgumentParser(description="Concurrent writers with a committed-change log.")
    p.add_argument("--dsn", required=True)
    p.add_argument("--table", default="public.workload")
    p.add_argument("--rows", type=int, default=None, help="(re)create and load this many rows")
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--ops-per-txn", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--pause", type=float, default=0.0, help="pause after each transaction")
    p.add_argument("--log", default=None, help="write the committed-change log (JSON lines)")
    a = p.parse_args(argv)
    wl = Workload(a.dsn, a.table, writers=a.writers, ops_per_txn=a.ops_per_txn, pause_s=a.pause)
    if a.rows is not None:
        wl.setup(a.rows)
    wl.start()
    time.sleep(a.seconds)  # the CLI runs for a fixed duration by design
    changes = wl.stop()
    if a.log:
        write_log(changes, a.log)
    print(f"{len(changes)} committed changes by {a.writers} writers in {a.seconds}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
