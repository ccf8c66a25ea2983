"""The demo's steps: load the catalog, start the pipeline, run the live changes, compare.

:class:`Demo` drives every step through one loop (:meth:`Demo.tick`) that samples the
servers, checks the child processes and refreshes the screen; ``python -m demo`` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable

from benchmarks.workload import ThreadedLoad
from demo import documents, resources, sample
from demo.changes import live_changes
from demo.monitor import Monitor, Sample
from demo.processes import ROOT, Child, start_job, start_reader
from demo.resources import DemoNames
from demo.screen import Screen, fmt_bytes
from demo.verify import TableCheck, check_all, check_documents
from pgcdc.core.contract import DOCUMENTS_JOB, JOBS, SYNC_JOB

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
        self.workload: ThreadedLoad | None = None
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
        resources.grant_reader(n)
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
        # The products as joined documents too (demo/documents.py), for the documents' job.
        env = {**n.env(), **documents.documents_env()}
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

        # One Spark job reads the topics once and keeps both followers (spark_jobs/sync.py).
        job_args = ("--followers", "cache,search", "--trigger-interval", "200 milliseconds")
        self.children[SYNC_JOB] = start_job(SYNC_JOB, env, n.log_dir / f"{SYNC_JOB}.log", *job_args)
        resources.remember_pids(n, [c.proc.pid for c in self.children.values()])
        self.wait_for(
            f"waiting for {SYNC_JOB} to start (Spark takes 20-60 s here)…",
            lambda _s: self.children[SYNC_JOB].log_has(f"started {SYNC_JOB}"),
            timeout_s=420,
        )
        # A second query keeps the joined product documents (spark_jobs/documents_sync.py).
        log = n.log_dir / f"{DOCUMENTS_JOB}.log"
        self.children[DOCUMENTS_JOB] = start_job(
            DOCUMENTS_JOB, env, log, "--trigger-interval", "500 milliseconds"
        )
        resources.remember_pids(n, [c.proc.pid for c in self.children.values()])
        self.wait_for(
            "followers: applying the snapshot",
            lambda s: all(s.behind(j) == 0 for j in JOBS),
            timeout_s=420,
        )
        self.wait_for(
            f"waiting for {DOCUMENTS_JOB} to write the product documents",
            lambda s: s.documents_total is not None and s.documents_total > 0,
            timeout_s=420,
        )

        seconds = self.args.workload_seconds
        self.workload = live_changes(
            n.dsn,
            tx_per_s=self.args.tx_per_second,
            seconds=seconds,
            toasted_key_changes=self.args.toasted_key_changes,
        )
        self.workload.start()
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
            lambda s: all(s.behind(j) == 0 for j in JOBS) and s.documents_behind == 0,
            timeout_s=420,
        )

        self.screen.phase("comparing PostgreSQL, Redis and OpenSearch row by row")
        checks = [*check_all(n), check_documents(n)]
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
        for name in ("reader", SYNC_JOB, DOCUMENTS_JOB):
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
