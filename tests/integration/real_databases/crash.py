"""Case 9's machinery: a mixed workload (single rows, key changes, bulk transactions,
truncates) in a thread that survives a PostgreSQL restart, the reader as a killable process,
and restarts of the stack's Kafka and PostgreSQL that never leave them down."""

from __future__ import annotations

import contextlib
import random
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.conftest import ROOT
from tests.e2e.pipeline import CDC
from tests.integration.real_databases.support import Pipeline, Table

ITEMS = Table("public", "items")
SIDE = Table("public", "side")
SEED_ITEMS = 20_000
SEED_SIDE = 500


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in (ITEMS, SIDE):
            conn.execute(
                sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text, n int)").format(t.ident)
            )
        conn.execute(
            "INSERT INTO items SELECT g, 'seed ' || g, g FROM generate_series(1, %s) g",
            (SEED_ITEMS,),
        )
        conn.execute(
            "INSERT INTO side SELECT g, 'seed ' || g, g FROM generate_series(1, %s) g",
            (SEED_SIDE,),
        )


class MixedWorkload(threading.Thread):
    """Transactions of every kind until stopped; reconnects when PostgreSQL goes away."""

    # A truncate costs the reader a scan of the table's topic, and the sync jobs pay for
    # every record of a bulk transaction: one of each every few seconds (a busy database,
    # not a benchmark), single-row changes as fast as they come (paced a little). A bulk
    # transaction of 450 changes spans many of the reader's Kafka batches as 1,500 did, at a
    # third of the records the catch-up and the jobs then read (case 9 ran 213 s, 60 of them in
    # the final job).
    TRUNCATE_EVERY_S = 3.0
    BULK_EVERY_S = 2.0
    BULK_ROWS = 300

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.done: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.next_id = 10_000_000
        self.last_truncate = self.last_bulk = time.monotonic()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive(), "the workload did not stop"

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    while not self.stop_event.is_set():
                        kind = self._one(conn)
                        self.done[kind] += 1
            except psycopg.OperationalError:
                self.failed["disconnected"] += 1  # PostgreSQL restarting: try again
                time.sleep(0.5)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _one(self, conn: psycopg.Connection[Any]) -> str:
        r = self.rng.random()
        some = self.rng.randint(1, SEED_ITEMS)
        if r < 0.55:
            time.sleep(0.002)
            conn.execute(
                "INSERT INTO items VALUES (%s, 'row', 0) ON CONFLICT (id) DO UPDATE "
                "SET v = 'upsert', n = items.n + 1",
                (some,),
            )
            return "upsert"
        if r < 0.75:
            conn.execute("DELETE FROM items WHERE id = %s", (some,))
            return "delete"
        if r < 0.85:
            # A key change: the old key's row moves to a new key.
            conn.execute(
                "UPDATE items SET id = %s, v = 'moved' WHERE id = %s", (self._new_id(), some)
            )
            return "key change"
        now = time.monotonic()
        if r < 0.90 and now - self.last_bulk >= self.BULK_EVERY_S:
            self.last_bulk = now
            with conn.transaction():
                first = self.next_id + 1
                self.next_id += self.BULK_ROWS
                conn.execute(
                    "INSERT INTO items SELECT g, 'bulk', g FROM generate_series(%s, %s) g",
                    (first, self.next_id),
                )
                start = self.rng.randint(1, SEED_ITEMS - self.BULK_ROWS)
                conn.execute(
                    "UPDATE items SET n = n + 1 WHERE id BETWEEN %s AND %s",
                    (start, start + self.BULK_ROWS // 2),
                )
            return "bulk"
        if now - self.last_truncate < self.TRUNCATE_EVERY_S:
            time.sleep(0.005)
            return "pause"
        self.last_truncate = now
        if r < 0.965:
            with conn.transaction():  # a truncate with inserts before and after it
                conn.execute("INSERT INTO side VALUES (%s, 'before', 1)", (self._new_id(),))
                conn.execute("TRUNCATE side")
                conn.execute(
                    "INSERT INTO side SELECT g, 'after', g FROM generate_series(1, %s) g",
                    (self.rng.randint(1, 300),),
                )
            return "truncate in a transaction"
        conn.execute("TRUNCATE side")
        return "truncate"


def catch_up(p: Pipeline, log: Path, timeout: float = 600) -> None:
    """``cdc run --until current``, output appended to ``log``; fails with its tail."""
    with log.open("ab") as out:
        try:
            rc = subprocess.run(
                [*CDC, "run", "--until", "current"],
                env=p.env(PYTHONUNBUFFERED="1"),
                cwd=ROOT,
                stdout=out,
                stderr=out,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = None
    text = log.read_text(errors="replace")[-4000:]
    assert rc == 0, f"cdc run --until current: {'timed out' if rc is None else rc}\n{text}"


def start_reader(p: Pipeline, log: Path) -> subprocess.Popen[bytes]:
    """``cdc run`` (streaming until killed), its output appended to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [*CDC, "run"], env=p.env(PYTHONUNBUFFERED="1"), cwd=ROOT, stdout=out, stderr=out
        )


def pending_wal(dsn: str, slot: str) -> int:
    """Bytes of WAL the slot has not confirmed yet (the reader still has work)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait(30)
