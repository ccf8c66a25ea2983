"""`make demo-docker`: the demo on the compose stack (``docker-compose.yml``).

The reader and the sync job (both followers) are compose services, started by ``docker compose up``; this
loads the sample catalog into the stack's database (``cdc``), runs the live workload (and,
with ``--kill-reader-after``, kills the reader's process mid-stream: the container's
restart policy brings it back, and it resumes from its slot), waits until every row of
PostgreSQL is in Redis and OpenSearch, and prints the comparison. Exit 0 only if all tables
are equal. The tests' compose module (``tests/e2e/test_docker_compose.py``) runs the same
steps on a project of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console

from demo import sample
from demo.changes import live_changes
from demo.resources import DemoNames
from demo.verify import TableCheck, check_all, verification_table
from pgcdc.core.ports import HOST, KAFKA_CONTROLLER_PORT, PORTS
from pgcdc.stack import docker

Say = Callable[[str], None]


@dataclass(frozen=True)
class ComposeStack:
    """A compose project of docker-compose.yml, the host ports it publishes and the compose
    profiles it runs (``registry``)."""

    project: str = docker.PROJECT
    ports: dict[str, int] = field(
        default_factory=lambda: {**PORTS, "kafka_controller": KAFKA_CONTROLLER_PORT}
    )
    profiles: tuple[str, ...] = ()

    def compose(self, *args: str, timeout: float = 1800, check: bool = True) -> str:
        return docker.compose(
            *args,
            project=self.project,
            ports=self.ports,
            profiles=self.profiles,
            timeout=timeout,
            check=check,
        ).stdout

    def names(self) -> DemoNames:
        """The pipeline's names inside the stack (compose's defaults), seen from the host."""
        return DemoNames(
            admin_dsn=f"postgresql://cdc:cdc@{HOST}:{self.ports['postgres']}/postgres",
            kafka_bootstrap=f"{HOST}:{self.ports['kafka']}",
            redis_url=f"redis://{HOST}:{self.ports['redis']}/0",
            search_url=f"http://{HOST}:{self.ports['opensearch']}",
            database="cdc",
            slot="cdc_slot",
            publication="cdc_pub",
            topic_prefix="cdc",
            index_prefix="cdc",
            key_prefix="cdc",
        )

    def inspect(self, service: str) -> dict[str, Any]:
        """``docker inspect`` of the service's (only) container."""
        cid = self.compose("ps", "-q", service).strip()
        if not cid:
            raise RuntimeError(f"no container runs {service} in project {self.project}")
        found = json.loads(docker.docker("inspect", cid).stdout)
        assert isinstance(found, list) and len(found) == 1
        info = found[0]
        assert isinstance(info, dict)
        return info

    def restarts(self, service: str) -> int:
        return int(self.inspect(service)["RestartCount"])

    def kill(self, service: str) -> int:
        """SIGKILL the service's main process, as a crash would end it (so the restart
        policy applies, which it does not to `docker kill`); returns the pid killed."""
        pid = int(self.inspect(service)["State"]["Pid"])
        if not Path(f"/proc/{pid}").exists():  # an engine in a VM: its pids are not ours
            raise RuntimeError(f"{service}'s pid {pid} is not visible here; cannot crash it")
        os.kill(pid, signal.SIGKILL)
        return pid


@dataclass
class Outcome:
    """What a run did, for the screen and the tests' assertions."""

    loaded: dict[str, int] = field(default_factory=dict)
    changes: dict[str, int] = field(default_factory=dict)
    transactions: int = 0
    # At the kill: the reader's slot's confirmed position and PostgreSQL's WAL position.
    killed_at: tuple[int, int] | None = None
    restarts: tuple[int, int] = (0, 0)  # the reader's restart count before and after
    converge_s: float = 0.0  # from the workload's end to equal followers
    after_kill_s: float = 0.0  # from the kill to equal followers
    checks: list[TableCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def _lsns(dsn: str, slot: str) -> tuple[int, int]:
    """(the slot's confirmed_flush_lsn, pg_current_wal_lsn()) as integers."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn - '0/0', pg_current_wal_lsn() - '0/0' "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    if row is None:
        raise RuntimeError(f"no replication slot {slot}: is the reader running?")
    return int(row[0]), int(row[1])


def _kafka_records(names: DemoNames) -> str:
    """Records in the pipeline's table topics (end offsets summed), to show where rows are;
    ``?`` while a partition has no leader known yet (a topic just created)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": names.kafka_bootstrap, "group.id": "demo-compose-peek"})
    try:
        md = c.list_topics(timeout=10)
        total = 0
        for name, topic in md.topics.items():
            if name.startswith(f"{names.topic_prefix}.public."):
                for p in topic.partitions:
                    total += c.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1]
        return f"{total:,}"
    except KafkaException:
        return "?"
    finally:
        c.close()


def wait_converged(names: DemoNames, timeout_s: float, say: Say) -> list[TableCheck]:
    """Compare every table until Redis and OpenSearch hold exactly PostgreSQL's rows."""
    deadline = time.monotonic() + timeout_s
    while True:
        checks = check_all(names)
        if all(c.ok for c in checks):
            return checks
        if time.monotonic() > deadline:
            return checks
        behind = [f"{c.table} {c.leader}/{c.redis}/{c.search}" for c in checks if not c.ok]
        say(
            f"  not yet equal (rows PostgreSQL/Redis/OpenSearch): {', '.join(behind)}; "
            f"Kafka holds {_kafka_records(names)} records"
        )
        time.sleep(3)


def run(
    stack: ComposeStack,
    *,
    workload_seconds: float,
    tx_per_s: float,
    kill_reader_after: float | None,
    converge_timeout_s: float = 600,
    say: Say = print,
) -> Outcome:
    """Load, change live (killing the reader once if asked), converge, compare."""
    names = stack.names()
    out = Outcome()
    with psycopg.connect(names.dsn) as conn:
        if conn.execute("SELECT to_regclass('public.products')").fetchone() != (None,):
            raise RuntimeError(
                "the stack's database already holds the sample; `make docker-down` first "
                "(it removes the compose project's volumes)"
            )
    t0 = time.monotonic()
    out.loaded = sample.load(names.dsn)
    say(f"loaded {sum(out.loaded.values()):,} rows in {time.monotonic() - t0:.1f}s: {out.loaded}")
    t0 = time.monotonic()
    out.checks = wait_converged(names, converge_timeout_s, say)
    if not out.ok:
        return out
    say(f"followers hold the sample ({time.monotonic() - t0:.0f}s)")

    out.restarts = (stack.restarts("reader"), out.restarts[1])
    load = live_changes(names.dsn, tx_per_s=tx_per_s, seconds=workload_seconds)
    load.start()
    say(f"live workload: {tx_per_s:g} transactions/s for {workload_seconds:g}s")
    killed = None
    if kill_reader_after is not None:
        time.sleep(kill_reader_after)
        # The kill is for a reader holding changes it has not acknowledged: wait (briefly)
        # for a moment when the slot is behind the WAL, as it is whenever writes go on.
        deadline = time.monotonic() + 30
        while (at := _lsns(names.dsn, names.slot))[0] >= at[1] and time.monotonic() < deadline:
            time.sleep(0.01)
        out.killed_at = at
        pid = stack.kill("reader")
        killed = time.monotonic()
        say(
            f"killed the reader (pid {pid}, SIGKILL) {kill_reader_after:g}s into the workload; "
            f"slot at {out.killed_at[0]:,}, WAL at {out.killed_at[1]:,}"
        )
    while load.running:
        time.sleep(0.5)
    if load.error is not None:
        raise RuntimeError(f"the workload failed: {load.error!r}")
    out.transactions = load.transactions
    out.changes = dict(load.counts)
    ended = time.monotonic()
    say(f"workload done: {out.transactions:,} transactions, {out.changes}")
    out.checks = wait_converged(names, converge_timeout_s, say)
    done = time.monotonic()
    out.converge_s = done - ended
    out.after_kill_s = done - killed if killed is not None else 0.0
    out.restarts = (out.restarts[0], stack.restarts("reader"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.compose", description=__doc__)
    p.add_argument("--workload-seconds", type=float, default=30.0)
    p.add_argument("--tx-per-second", type=float, default=25.0)
    p.add_argument(
        "--kill-reader-after",
        type=float,
        default=10.0,
        metavar="S",
        help="SIGKILL the reader S seconds into the workload (negative: never; default 10)",
    )
    p.add_argument("--project", default=os.environ.get("COMPOSE_PROJECT_NAME", docker.PROJECT))
    args = p.parse_args(argv)
    console = Console()
    ports = {**PORTS, "kafka_controller": KAFKA_CONTROLLER_PORT}
    for name in ports:  # the same variables docker-compose.yml reads
        ports[name] = int(os.environ.get(f"PGCDC_{name.upper()}_PORT", ports[name]))
    stack = ComposeStack(project=args.project, ports=ports)
    out = run(
        stack,
        workload_seconds=args.workload_seconds,
        tx_per_s=args.tx_per_second,
        kill_reader_after=args.kill_reader_after if args.kill_reader_after >= 0 else None,
        say=lambda line: console.print(line, markup=False, highlight=False),
    )
    console.print(verification_table(out.checks))
    if out.killed_at is not None:
        console.print(
            f"the reader was killed mid-stream and restarted by its policy "
            f"(restarts {out.restarts[0]} -> {out.restarts[1]}); equal again "
            f"{out.after_kill_s:.0f}s after the kill, {out.converge_s:.0f}s after the workload"
        )
    console.print(
        "[green]all followers equal PostgreSQL[/]" if out.ok else "[red]followers differ[/]"
    )
    console.print(
        "next: docker compose run --rm reader cdc status; docker compose logs reader; "
        "make docker-down"
    )
    return 0 if out.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
