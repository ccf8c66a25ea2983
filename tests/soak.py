"""``make soak``: a chaos soak with ``cdc verify`` as its oracle (not in CI).

    .venv/bin/python -m tests.soak [--minutes 30] [--seed N] [--tps 100] [--keep]

A pgbench-like load runs against a database of its own while a nemesis injects faults at
random times drawn from a seed it prints first (the same seed gives the same faults at the
same offsets): the reader and the shared sync job killed with SIGKILL and started again;
Kafka, PostgreSQL and OpenSearch restarted (``scripts/stack down``/``up``); the soak's own
Redis restarted; each follower cut off from the job through a TCP proxy for a while. At the
end the faults are healed, the load stops, and ``cdc verify`` must find both followers equal
to PostgreSQL: the soak prints the faults injected by kind, the changes made, the processes
that ended by themselves (started again, as a supervisor would), and the divergent keys
found, and exits 0 only if there are none.

It restarts the stack's servers: run it alone on the machine, with no test run beside it.
Redis is a server of the soak's own (``appendfsync always``), since the stack's keeps
nothing across a restart: a follower that forgets what it applied is a lost follower
(``cdc verify --repair`` is its remedy, docs/verify.md), not the drift this soak looks for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.conftest import ROOT, STACK, Endpoints, _native_stack
from tests.e2e.pipeline import CDC, Pipeline, kill_group, new_pipeline, start_reader
from tests.e2e.proxy import Proxy
from tests.ports import free_port as _free_port

SCHEMA = """
CREATE TABLE branches (bid int PRIMARY KEY, bbalance bigint NOT NULL);
CREATE TABLE tellers (tid int PRIMARY KEY, bid int NOT NULL, tbalance bigint NOT NULL);
CREATE TABLE accounts (aid int PRIMARY KEY, bid int NOT NULL, abalance bigint NOT NULL,
                       filler text NOT NULL);
CREATE TABLE history (hid bigserial PRIMARY KEY, tid int, bid int, aid int, delta int,
                      mtime timestamptz NOT NULL DEFAULT now());
INSERT INTO branches SELECT b, 0 FROM generate_series(1, 4) b;
INSERT INTO tellers SELECT t, 1 + t % 4, 0 FROM generate_series(1, 40) t;
INSERT INTO accounts SELECT a, 1 + a % 4, 0, repeat('x', 84) FROM generate_series(1, 20000) a;
"""
ACCOUNTS = 20_000
SPARK_SUBMIT = str(ROOT / "scripts" / "spark-submit")

# What the nemesis does, and how long a cut lasts (seconds, drawn per fault).
KINDS = (
    "kill_reader",
    "kill_job",
    "restart_kafka",
    "restart_postgres",
    "restart_redis",
    "restart_opensearch",
    "cut_cache",
    "cut_search",
)
CUT_S = (5.0, 45.0)


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


class OwnRedis:
    """A redis-server of the soak's own that keeps every write it acknowledged across a
    restart (append-only file, fsync on every write)."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.port = _free_port()
        self.argv = [
            exe,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(workdir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--logfile", str(workdir / "redis.log"),
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, start_new_session=True)
        _wait(lambda: _answers("127.0.0.1", self.port), 60, "the soak's Redis")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
            self.proc = None


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _wait(ok: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"soak: {what} did not come back within {timeout:.0f} s")
        time.sleep(0.5)


def _stack(*args: str) -> None:
    out = subprocess.run([str(STACK), *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"soak: scripts/stack {' '.join(args)} failed:\n{out.stdout}{out.stderr}")


@dataclass
class Load:
    """pgbench's TPC-B-like transaction (an account, its teller and branch updated, a
    history row inserted), and every 20th one an account deleted and inserted again, from
    ``threads`` connections at ``tps`` transactions a second in all; a connection lost to a
    restart is made again and the transaction it held is not counted."""

    dsn: str
    tps: float
    seed: int
    threads: int = 2
    stop: threading.Event = field(default_factory=threading.Event)
    changes: int = 0
    transactions: int = 0
    lost: int = 0  # transactions whose connection broke (retried as new ones)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._run, args=(i,), name=f"load-{i}", daemon=True)
            for i in range(self.threads)
        ]
        for t in threads:
            t.start()
        return threads

    def _run(self, n: int) -> None:
        rng = random.Random(self.seed * 1000 + n)
        every = self.threads / self.tps
        next_at = time.monotonic()
        conn: psycopg.Connection[Any] | None = None
        while not self.stop.is_set():
            next_at += every
            self.stop.wait(max(0.0, next_at - time.monotonic()))
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, connect_timeout=5)
                made = self._transaction(conn, rng)
            except psycopg.Error:
                with self._lock:
                    self.lost += 1
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
                self.stop.wait(0.5)
                next_at = time.monotonic()
                continue
            with self._lock:
                self.transactions += 1
                self.changes += made
        if conn is not None:
            conn.close()

    def _transaction(self, conn: psycopg.Connection[Any], rng: random.Random) -> int:
        aid, tid, bid = rng.randint(1, ACCOUNTS), rng.randint(1, 40), rng.randint(1, 4)
        delta = rng.randint(-5000, 5000)
        with conn.transaction():
            if rng.random() < 0.05:
                conn.execute("DELETE FROM accounts WHERE aid = %s", (aid,))
                conn.execute(
                    "INSERT INTO accounts VALUES (%s, %s, %s, %s)",
                    (aid, 1 + aid % 4, delta, rng.choice("abcdef") * 84),
                )
                return 2
            conn.execute(
                "UPDATE accounts SET abalance = abalance + %s WHERE aid = %s", (delta, aid)
            )
            conn.execute("UPDATE tellers SET tbalance = tbalance + %s WHERE tid = %s", (delta, tid))
            conn.execute(
                "UPDATE branches SET bbalance = bbalance + %s WHERE bid = %s", (delta, bid)
            )
            conn.execute(
                "INSERT INTO history (tid, bid, aid, delta) VALUES (%s, %s, %s, %s)",
                (tid, bid, aid, delta),
            )
            return 4


@dataclass
class Soak:
    p: Pipeline
    redis: OwnRedis
    cache_proxy: Proxy
    search_proxy: Proxy
    logs: Path
    reader: subprocess.Popen[bytes] | None = None
    job: subprocess.Popen[bytes] | None = None
    faults: Counter[str] = field(default_factory=Counter)
    exits: Counter[str] = field(default_factory=Counter)  # processes that ended on their own

    def start_reader(self) -> None:
        self.reader = start_reader(self.p, self.logs / "reader.log")

    def start_job(self) -> None:
        env = self.p.env(
            CDC_REDIS__URL=self.cache_proxy.url("redis"),
            CDC_SEARCH__URL=self.search_proxy.url("http"),
        )
        with (self.logs / "sync.log").open("ab") as f:
            self.job = subprocess.Popen(
                [SPARK_SUBMIT, "spark_jobs/sync.py", "--followers", "cache,search"],
                env=env,
                cwd=ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def supervise(self) -> None:
        """Start again a reader or a job that ended by itself, as a supervisor would."""
        for name, proc, start in (
            ("reader", self.reader, self.start_reader),
            ("job", self.job, self.start_job),
        ):
            if proc is not None and proc.poll() is not None:
                self.exits[name] += 1
                log(f"the {name} ended by itself (exit {proc.returncode}): started again")
                start()

    def inject(self, kind: str, rng: random.Random) -> None:
        self.faults[kind] += 1
        n = sum(self.faults.values())
        if kind == "kill_reader" and self.reader is not None:
            log(f"fault {n}: kill -9 the reader (pid {self.reader.pid})")
            kill_group(self.reader)
            self.start_reader()
        elif kind == "kill_job" and self.job is not None:
            log(f"fault {n}: kill -9 the sync job (pid {self.job.pid})")
            kill_group(self.job)
            self.start_job()
        elif kind.startswith("restart_") and kind != "restart_redis":
            service = kind.removeprefix("restart_")
            log(f"fault {n}: restart {service}")
            _stack("down", service)
            _stack("up", service)
        elif kind == "restart_redis":
            log(f"fault {n}: restart the followers' Redis")
            self.redis.stop()
            self.redis.start()
        elif kind.startswith("cut_"):
            proxy = self.cache_proxy if kind == "cut_cache" else self.search_proxy
            seconds = rng.uniform(*CUT_S)
            log(f"fault {n}: cut the {kind.removeprefix('cut_')} follower off for {seconds:.0f} s")
            proxy.cut()
            time.sleep(seconds)
            proxy.restore()


def _setup(workdir: Path) -> tuple[Soak, Endpoints]:
    found = _native_stack()
    redis = OwnRedis(workdir)
    redis.start()
    endpoints = replace(found, redis_url=f"redis://127.0.0.1:{redis.port}/0")
    host, port = found.search_url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    p = new_pipeline(endpoints, "soak", SCHEMA, workdir / "checkpoints")
    p = replace(p, settings_env=(("CDC_SPARK__TRIGGER_INTERVAL", "500 milliseconds"),))
    soak = Soak(
        p,
        redis,
        Proxy("127.0.0.1", redis.port),
        Proxy(host, int(port)),
        workdir,
    )
    return soak, endpoints


def _drop(p: Pipeline, endpoints: Endpoints) -> None:
    """The soak's slot (so that PostgreSQL keeps no WAL for it) and database."""
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            (p.name,),
        )
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(p.name))
        )


def _verify(p: Pipeline) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [*CDC, "verify", "--json", "--fence-timeout", "900"],
        env=p.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    try:
        return out.returncode, json.loads(out.stdout)
    except ValueError:
        raise SystemExit(f"soak: cdc verify printed no JSON (exit {out.returncode}):\n"
                         f"{out.stderr[-3000:]}") from None  # fmt: skip


def _schedule(
    rng: random.Random, seconds: float, kinds: tuple[str, ...] = KINDS
) -> Iterator[tuple[float, str]]:
    """Fault times (seconds from the start) and kinds: every kind once in a random order
    first, then any kind, 20-70 s apart, until ``seconds`` less two minutes of quiet."""
    at, first = 30.0, list(kinds)
    rng.shuffle(first)
    while at < seconds - 120:
        yield at, first.pop() if first else rng.choice(kinds)
        at += rng.uniform(20, 70)


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    a.add_argument("--minutes", type=float, default=30.0, help="how long the load runs (30)")
    a.add_argument("--seed", type=int, default=None, help="the faults' seed (default: random)")
    a.add_argument("--tps", type=float, default=100.0, help="load transactions a second (100)")
    a.add_argument("--keep", action="store_true", help="keep the logs and the Redis folder")
    a.add_argument(
        "--faults",
        default=",".join(KINDS),
        help="the kinds of fault to inject, comma-separated (default: all of them: "
        + ", ".join(KINDS)
        + ")",
    )
    args = a.parse_args(argv)
    kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    if not kinds or set(kinds) - set(KINDS):
        a.error(f"--faults: name one or more of {', '.join(KINDS)}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    seconds = args.minutes * 60
    log(f"soak: seed {seed} (python -m tests.soak --seed {seed} replays these faults), "
        f"{args.minutes:g} minutes, {args.tps:g} transactions a second")  # fmt: skip
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="pgcdc-soak-"))
    soak, endpoints = _setup(workdir)
    load = Load(soak.p.dsn, args.tps, seed)
    log(f"database {soak.p.name}; logs in {workdir}")
    try:
        soak.start_reader()
        soak.start_job()
        threads = load.start()
        start = time.monotonic()
        for at, kind in _schedule(rng, seconds, kinds):
            while time.monotonic() - start < at:
                soak.supervise()
                time.sleep(1)
            soak.inject(kind, rng)
        while time.monotonic() - start < seconds:
            soak.supervise()
            time.sleep(1)
        load.stop.set()
        for t in threads:
            t.join(60)
        log(f"load stopped: {load.transactions} transactions, {load.changes} changes "
            f"({load.lost} transactions lost to a broken connection)")  # fmt: skip
        soak.supervise()
        code, found = _verify(soak.p)
        soak.supervise()
    finally:
        for proc in (soak.reader, soak.job):
            if proc is not None and proc.poll() is None:
                kill_group(proc, signal.SIGTERM)
        soak.cache_proxy.close()
        soak.search_proxy.close()
        soak.redis.stop()
        if not args.keep:
            _drop(soak.p, endpoints)
    divergent = {
        f"{r['table']} {r['follower']}": sum(r[k]["count"] for k in ("missing", "extra", "differ"))
        for r in found["results"]
    }
    print(
        json.dumps(
            {
                "seed": seed,
                "minutes": args.minutes,
                "faults": dict(sorted(soak.faults.items())),
                "faults_total": sum(soak.faults.values()),
                "ended_by_themselves": dict(soak.exits),
                "transactions": load.transactions,
                "changes": load.changes,
                "verify_exit": code,
                "divergent_keys": divergent,
                "divergent_total": sum(divergent.values()),
                # How the oracle compared: folded inside the stores, or read back.
                "verify_folded": {
                    f"{r['table']} {r['follower']}": r.get("folded") for r in found["results"]
                },
            },
            indent=2,
        )
    )
    if not args.keep and code == 0:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
