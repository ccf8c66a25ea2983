"""The reader tests' workload: concurrent writers whose every committed change is logged.

Writers run inserts, updates, deletes and primary-key updates against one table and log
every change they *committed* (after ``COMMIT`` returned), each carrying a unique marker.
A test can then check that every logged marker reached Kafka / a follower, and that the
final state equals the table.

Table layout (created by :meth:`Workload.setup`)::

    id bigint PRIMARY KEY, marker text NOT NULL, n integer, val text, payload text

Each writer owns the ids with ``id % writers == writer``, so writers never wait on each
other's row locks and every writer knows its live keys without asking the database.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.workload.engine import Pacing, ident
from benchmarks.workload.keys import LiveKeys
from benchmarks.workload.threads import ThreadedLoad

OPS = ("insert", "update", "delete", "pk_update")


@dataclass(frozen=True)
class Change:
    """One committed change. ``id`` is the key before, ``new_id`` the key after (pk_update)."""

    writer: int
    seq: int
    op: str
    id: int
    new_id: int | None
    marker: str | None  # the marker written by this change (None for a delete)
    txn: int  # writer-local transaction number
    committed_at: float


class MarkedMix:
    """One writer's transactions of 1..``ops_per_txn`` marked changes."""

    one_statement = False

    def __init__(self, load: Workload, writer: int, writers: int) -> None:
        self.load = load
        self.writer = writer
        self.writers = writers
        self.ident = ident(load.table)
        self.live: LiveKeys[int] = LiveKeys()
        self.next_id = writer
        self.seq = 0
        self.txn = 0
        self.pending: list[tuple[int, str, int, int | None, str | None]] = []

    def prepare(self, conn: psycopg.Connection[Any]) -> None:
        """This writer's live ids, and its first new id above every existing one."""
        own = sql.SQL("SELECT id FROM {} WHERE id %% %s = %s").format(self.ident)
        for (key,) in conn.execute(own, (self.writers, self.writer)):
            self.live.add(key)
        row = conn.execute(
            sql.SQL("SELECT coalesce(max(id), -1) FROM {}").format(self.ident)
        ).fetchone()
        top = row[0] if row else -1
        self.next_id = (top // self.writers + 1) * self.writers + self.writer

    def write(self, conn: psycopg.Connection[Any], rnd: random.Random) -> Counter[str]:
        """1..ops_per_txn changes, each with a fresh marker ``w<writer>-<seq>``."""
        load, tbl = self.load, self.ident
        counts: Counter[str] = Counter()
        for _ in range(rnd.randint(1, load.ops_per_txn)):
            op = rnd.choices(OPS, weights=load.weights)[0]
            if op != "insert" and not self.live:
                op = "insert"
            self.seq += 1
            marker = f"w{self.writer}-{self.seq}"
            new_id: int | None = None
            if op == "insert":
                key = self._take_new_id()
                conn.execute(
                    sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, md5(%s), repeat('x', %s))").format(
                        tbl
                    ),
                    (key, marker, self.seq % 1000, marker, load.payload_bytes),
                )
                self.live.add(key)
            else:
                key = self.live.pick(rnd)
                if op == "update":
                    conn.execute(
                        sql.SQL(
                            "UPDATE {} SET marker = %s, n = coalesce(n, 0) + 1, val = md5(%s) "
                            "WHERE id = %s"
                        ).format(tbl),
                        (marker, marker, key),
                    )
                elif op == "delete":
                    conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(tbl), (key,))
                    self.live.discard(key)
                else:
                    new_id = self._take_new_id()
                    conn.execute(
                        sql.SQL("UPDATE {} SET id = %s, marker = %s WHERE id = %s").format(tbl),
                        (new_id, marker, key),
                    )
                    self.live.replace(key, new_id)
            self.pending.append((self.seq, op, key, new_id, None if op == "delete" else marker))
            counts[op] += 1
        return counts

    def committed(self, at: float) -> None:
        """Only now do the pending changes count as committed: log them."""
        self.txn += 1
        changes = [Change(self.writer, *p, self.txn, at) for p in self.pending]
        self.pending.clear()
        self.load.record(changes)

    def _take_new_id(self) -> int:
        key = self.next_id
        self.next_id += self.writers
        return key


@dataclass
class Workload:
    """Concurrent writers against ``table`` with a log of committed changes."""

    dsn: str
    table: str = "public.workload"
    writers: int = 4
    ops_per_txn: int = 3
    weights: tuple[int, int, int, int] = (4, 4, 1, 1)  # insert, update, delete, pk_update
    payload_bytes: int = 64
    seed: int | None = None
    max_txns: int | None = None  # per writer; None = until stop()
    pause_s: float = 0.0
    log: list[Change] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._load = ThreadedLoad(
            self.dsn,
            lambda w, n: MarkedMix(self, w, n),
            workers=self.writers,
            pacing=Pacing(pause_s=self.pause_s, max_txns=self.max_txns),
            seed=self.seed,
            name="w",
        )

    @property
    def errors(self) -> list[BaseException]:
        """The writers' errors (also raised by :meth:`join`)."""
        return self._load.errors

    def record(self, changes: list[Change]) -> None:
        """Append a writer's committed changes to the log (thread-safe)."""
        with self._lock:
            self.log.extend(changes)

    def setup(self, rows: int, *, replica_identity_full: bool = False) -> None:
        """(Re)create the table and load ``rows`` rows with ids 0..rows-1."""
        tbl = ident(self.table)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(tbl))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id bigint PRIMARY KEY, marker text NOT NULL, "
                    "n integer, val text, payload text)"
                ).format(tbl)
            )
            if replica_identity_full:
                conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(tbl))
            if rows:
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} SELECT g, 'init-' || g, g %% 1000, md5(g::text), "
                        "repeat(md5(g::text), %s) FROM generate_series(0, %s) g"
                    ).format(tbl),
                    (max(1, self.payload_bytes // 32), rows - 1),
                )

    def start(self) -> None:
        """Start the writer threads (they run until :meth:`stop` or ``max_txns``)."""
        self._load.start()

    def stop(self, timeout: float = 60.0) -> list[Change]:
        """Stop the writers, wait for them, and return the log of committed changes."""
        self._load.stop(timeout)
        self.join(0)
        return list(self.log)

    def join(self, timeout: float = 60.0) -> None:
        """Wait for the writers (useful with ``max_txns``); re-raise a writer's error."""
        self._load.join(timeout)


def write_log(changes: Iterable[Change], path: str | Path) -> None:
    """Write the change log as JSON lines."""
    with open(path, "w") as f:
        for c in changes:
            f.write(json.dumps(asdict(c)) + "\n")


def read_log(path: str | Path) -> list[Change]:
    """Read a change log written by :func:`write_log`."""
    out: list[Change] = []
    with open(path) as f:
        for line in f:
            if line.strip():
                d: dict[str, Any] = json.loads(line)
                out.append(Change(**d))
    return out
