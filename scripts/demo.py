"""`make demo`: the whole pipeline, live, on a sample product catalog.

Steps: remove what a previous demo left; create the ``demo`` database and load the sample
catalog; start the reader (``cdc run``) and both sync jobs (spark-submit) as real
subprocesses in their own process groups; run a live workload of inserts, updates, deletes
and primary-key changes while the screen shows events/s, lags, watermarks and a running
search; wait for the followers to converge; compare PostgreSQL, Redis and OpenSearch row by
row; stop everything and exit 0 only if all tables are equal.

On a terminal the screen is a rich Live layout; with CI=true or when stdout is not a
terminal it prints plain progress lines. Options: ``--workload-seconds`` (default 60),
``--tx-per-second`` (default 25), ``--toasted-key-changes`` (see demo/workload.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this file is scripts/demo.py; `demo` must be the package

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from demo import resources, sample  # noqa: E402
from demo.monitor import Monitor, Sample  # noqa: E402
from demo.processes import Child, start_job, start_reader  # noqa: E402
from demo.resources import DemoNames  # noqa: E402
from demo.screen import Screen, fmt_bytes  # noqa: E402
from demo.verify import TableCheck, check_all  # noqa: E402
from demo.workload import LiveWorkload  # noqa: E402
from pgcdc.core.contract import JOBS  # noqa: E402
from pgcdc.core.settings import load_settings  # noqa: E402

TICK_S = 1.0


class DemoFailed(Exception):
    """The demo cannot go on; the message says why and where to look."""


class Demo:
    def __init__(self, names: DemoNames, screen: Screen, args: argparse.Namespace) -> None:
        self.names = names
        self.screen = screen
        self.args = args
        self.children: dict[str, Child] = {}
        self.monitor: Monitor | None = None
        self.workload: LiveWorkload | None = None
        self.last: Sample | None = None

    # -- the loop every wait goes through ------------------------------------------------

    def tick(self) -> Sample:
        """Sample the servers, check the children are alive, refresh the screen."""
        assert self.monitor is not None
        s = self.monitor.sample()
        for name, child in self.children.items():
            if not child.alive():
                raise DemoFailed(
                    f"{name} exited with status {child.proc.returncode}; "
                    f"log {child.log.relative_to(ROOT)}:\n{child.tail()}"
                )
            self.screen.view.processes[name] = f"pid {child.proc.pid}"
        if self.workload is not None:
            self.screen.view.workload = self.workload.counts.copy()
            self.screen.view.transactions = self.workload.transactions
            if self.workload.error is not None:
                raise DemoFailed(f"the workload failed: {self.workload.error!r}")
        self.screen.update(s)
        self.last = s
        return s

    def wait_for(self, what: str, cond: Callable[[Sample], bool], timeout_s: float) -> Sample:
        """Tick until ``cond`` holds for a sample; DemoFailed at the deadline."""
        self.screen.phase(what)
        deadline = time.monotonic() + timeout_s
        while True:
            t0 = time.monotonic()
            s = self.tick()
            if cond(s):
                return s
            if time.monotonic() > deadline:
                raise DemoFailed(f"gave up after {timeout_s:.0f}s {what}")
            time.sleep(max(0.0, TICK_S - (time.monotonic() - t0)))

    # -- the steps -----------------------------------------------------------------------

    def run(self) -> list[TableCheck]:
        n = self.names
        self.screen.phase("removing leftovers of a previous demo run")
        for line in resources.clean(n):
            self.screen.note(line)

        self.screen.phase("creating database 'demo' and loading the sample catalog")
        t0 = time.monotonic()
        sample.create_database(n.admin_dsn, n.database)
        counts = sample.load(n.dsn)
        toasted, toast_bytes = sample.toast_report(n.dsn)
        self.screen.note(
            f"loaded {sum(counts.values()):,} rows in {time.monotonic() - t0:.1f}s: "
            + ", ".join(f"{t.split('.')[1]} {c:,}" for t, c in counts.items())
        )
        self.screen.note(
            f"{toasted} product descriptions > 8 kB stored out of line uncompressed "
            f"(TOAST table {fmt_bytes(toast_bytes)}); stock_levels is REPLICA IDENTITY FULL"
        )
        if toasted == 0:
            raise DemoFailed("no description was TOASTed out of line; the sample is wrong")

        self.monitor = Monitor(n)
        env = n.env()
        n.log_dir.mkdir(parents=True, exist_ok=True)
        _write_env_file(n, env)
        self.children["reader"] = start_reader(env, n.log_dir / "reader.log")
        resources.remember_pids(n, [c.proc.pid for c in self.children.values()])
        snapshot_rows = sum(counts.values())
        self.wait_for(
            f"reader: snapshot of {snapshot_rows:,} rows into Kafka",
            lambda s: s.kafka_total >= snapshot_rows and s.slot_active,
            timeout_s=300,
        )

        job_args = ("--trigger-interval", "200 milliseconds")
        for job in JOBS:
            self.children[job] = start_job(job, env, n.log_dir / f"{job}.log", *job_args)
        resources.remember_pids(n, [c.proc.pid for c in self.children.values()])
        for job in JOBS:
            self.wait_for(
                f"waiting for {job} to start (Spark takes 20-60 s here)…",
                lambda _s, job=job: self.children[job].log_has(f"started {job}"),
                timeout_s=420,
            )
        self.wait_for(
            "followers: applying the snapshot",
            lambda s: all(s.behind(j) == 0 for j in JOBS),
            timeout_s=420,
        )

        seconds = self.args.workload_seconds
        self.workload = LiveWorkload(
            n.dsn,
            tx_per_s=self.args.tx_per_second,
            toasted_key_changes=self.args.toasted_key_changes,
        )
        self.workload.start(seconds)
        self.wait_for(
            f"live workload: {self.args.tx_per_second:g} transactions/s for {seconds:g}s",
            lambda _s: not self.workload.running,  # type: ignore[union-attr]
            timeout_s=seconds + 120,
        )
        self.screen.note(
            f"workload done: {self.workload.transactions:,} transactions, "
            + ", ".join(f"{k} {v:,}" for k, v in sorted(self.workload.counts.items()))
        )

        # Everything committed so far must reach Kafka and then both followers.
        end_lsn = self.tick().wal_lsn
        self.wait_for(
            "reader: acknowledging the last transactions",
            lambda s: s.flush_lsn is not None and s.flush_lsn >= end_lsn,
            timeout_s=300,
        )
        self.wait_for(
            "followers: catching up with Kafka",
            lambda s: all(s.behind(j) == 0 for j in JOBS),
            timeout_s=420,
        )

        self.screen.phase("comparing PostgreSQL, Redis and OpenSearch row by row")
        checks = check_all(n)
        self.screen.phase(
            "all followers equal the database"
            if all(c.ok for c in checks)
            else "followers DIFFER from the database"
        )
        self.tick()
        return checks

    def stop(self) -> None:
        """SIGTERM the reader (it acknowledges and exits); end the jobs' process groups."""
        if self.workload is not None:
            self.workload.stop()
        for name in ("reader", *JOBS):
            child = self.children.get(name)
            if child is None:
                continue
            if name == "reader":
                rc = child.terminate(grace_s=30)
                self.screen.console.print(f"stopped reader (SIGTERM): exit status {rc}")
            else:
                child.kill_group(grace_s=10)
                self.screen.console.print(f"stopped {name}: process group {child.proc.pid} ended")
        with contextlib.suppress(FileNotFoundError):
            self.names.pid_file.unlink()
        if self.monitor is not None:
            self.monitor.close()


def _write_env_file(names: DemoNames, env: dict[str, str]) -> None:
    """The demo's CDC_* settings, for `cdc status` afterwards (owner-only: it holds the DSN)."""
    path = names.home / "demo.env"
    lines = [f"{k}='{v}'" for k, v in sorted(env.items()) if k.startswith("CDC_")]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def verification_table(checks: list[TableCheck]) -> Table:
    t = Table(title="verification: rows per table, contents compared")
    for col in ("table", "PostgreSQL", "Redis", "OpenSearch", "contents"):
        t.add_column(col, justify="left" if col in ("table", "contents") else "right")
    for c in checks:
        t.add_row(
            c.table,
            f"{c.leader:,}",
            f"{c.redis:,}",
            f"{c.search:,}",
            "[green]equal[/]" if c.ok else "[red]DIFFERENT[/]",
        )
    return t


NEXT_STEPS = """\
Where to look next (the demo's data stays until the next `make demo`):
  reader status   set -a; . .stack/demo/demo.env; set +a; .venv/bin/cdc status
  logs            .stack/demo/logs/{reader,cache_sync,search_sync}.log; servers: .stack/logs/
  Kafka topics    .venv/bin/python -m demo.peek demo.public.products 3   (last 3 events)
  Redis           redis-cli -p 56379 --scan --pattern 'demo:public.products:*' | head -3
                  redis-cli -p 56379 HGETALL demo:public.products:<id>
  OpenSearch      curl -s '127.0.0.1:19200/demo-public.products/_search?q=title:waterproof&size=3&pretty'
  PostgreSQL      (after sourcing demo.env as above) psql "$CDC_POSTGRES__DSN" -c '\\d+ products'
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload-seconds", type=float, default=60.0)
    p.add_argument("--tx-per-second", type=float, default=25.0)
    p.add_argument(
        "--toasted-key-changes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also change the primary key of products with TOASTed descriptions (default on;\n"
        "the reader carries the unchanged description over to the new key)",
    )
    args = p.parse_args(argv)

    settings = load_settings()
    names = DemoNames(
        admin_dsn=settings.postgres.dsn.get_secret_value(),
        kafka_bootstrap=settings.kafka.bootstrap_servers,
        redis_url=settings.redis.url.get_secret_value(),
        search_url=settings.search.url.get_secret_value(),
    )
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    console = Console()
    live = sys.stdout.isatty() and not ci
    screen = Screen(live=live, console=console)
    demo = Demo(names, screen, args)
    checks: list[TableCheck] = []
    failure: str | None = None
    t0 = time.monotonic()
    try:
        with screen:
            checks = demo.run()
    except DemoFailed as e:
        failure = str(e)
    except KeyboardInterrupt:
        failure = "interrupted"
    finally:
        demo.stop()
    if not live and demo.last is not None:
        console.print(screen.plain_line(), markup=False, highlight=False, soft_wrap=True)
    if checks:
        console.print(verification_table(checks))
        for c in checks:
            for follower, d in (("Redis", c.redis_diff), ("OpenSearch", c.search_diff)):
                if d:
                    console.print(f"[red]{follower} differs from {c.table}:[/]\n{d}")
    console.print(NEXT_STEPS, markup=False, highlight=False, soft_wrap=True)
    took = time.monotonic() - t0
    if failure:
        console.print(f"[red]demo failed after {took:.0f}s:[/] {failure}", highlight=False)
        return 2
    ok = bool(checks) and all(c.ok for c in checks)
    console.print(
        f"[green]all followers equal PostgreSQL[/] ({took:.0f}s)"
        if ok
        else f"[red]followers differ from PostgreSQL[/] ({took:.0f}s)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
