#!/usr/bin/env python3
"""A small reusable workload generator for CDC tests and benchmarks.

Concurrent writers run inserts, updates, deletes and primary-key updates against one table and
log every change they *committed* (after COMMIT returned), each carrying a unique marker. A
test can then check that every logged marker reached Kafka / a follower, and that the final
state equals the table.

Table layout (created by :meth:`Workload.setup`)::

    id bigint PRIMARY KEY, marker text NOT NULL, n integer, val text, payload text

Each writer owns the ids with ``id % writers == writer``, so writers never wait on each other's
row locks and every writer knows its live keys without asking the database.

Use it as a library (``sys.path`` insert of ``scripts/``) or from the command line::

    python scripts/workload.py --dsn postgresql://... --table public.items --rows 20000 \\
        --writers 4 --seconds 30 --log /tmp/changes.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

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
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        schema, _, name = self.table.rpartition(".")
        self._ident = sql.Identifier(schema or "public", name)

    # --- setup --------------------------------------------------------------------------

    def setup(self, rows: int, *, replica_identity_full: bool = False) -> None:
        """(Re)create the table and load ``rows`` rows with ids 0..rows-1."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._ident))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id bigint PRIMARY KEY, marker text NOT NULL, "
                    "n integer, val text, payload text)"
                ).format(self._ident)
            )
            if replica_identity_full:
                conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(self._ident))
            if rows:
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} SELECT g, 'init-' || g, g %% 1000, md5(g::text), "
                        "repeat(md5(g::text), %s) FROM generate_series(0, %s) g"
                    ).format(self._ident),
                    (max(1, self.payload_bytes // 32), rows - 1),
                )

    # --- running ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer threads (they run until :meth:`stop` or ``max_txns``)."""
        self._stop.clear()
        for w in range(self.writers):
            t = threading.Thread(target=self._run_writer, args=(w,), daemon=True, name=f"w{w}")
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 60.0) -> list[Change]:
        """Stop the writers, wait for them, and return the log of committed changes."""
        self._stop.set()
        self.join(timeout)
        return list(self.log)

    def join(self, timeout: float = 60.0) -> None:
        """Wait for the writers (useful with ``max_txns``); re-raise a writer's error."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]
        if self.errors:
            raise RuntimeError(f"a workload writer failed: {self.errors[0]!r}") from self.errors[0]

    def _run_writer(self, w: int) -> None:
        try:
            self._writer_loop(w)
        except BaseException as e:  # surfaced by join()
            self.errors.append(e)

    def _writer_loop(self, w: int) -> None:
        rnd = random.Random(None if self.seed is None else self.seed * 1000 + w)
        with psycopg.connect(self.dsn) as conn:
            live = [
                r[0]
                for r in conn.execute(
                    sql.SQL("SELECT id FROM {} WHERE id %% %s = %s").format(self._ident),
                    (self.writers, w),
                )
            ]
            conn.commit()
            live_set = set(live)
            top = conn.execute(sql.SQL("SELECT coalesce(max(id), -1) FROM {}").format(self._ident))
            row = top.fetchone()
            conn.commit()
            next_id = ((row[0] if row else -1) // self.writers + 1) * self.writers + w
            seq = 0
            txn = 0
            while not self._stop.is_set() and (self.max_txns is None or txn < self.max_txns):
                pending: list[tuple[str, int, int | None, str | None]] = []
                added: list[int] = []
                removed: list[int] = []
                with conn.transaction():
                    for _ in range(rnd.randint(1, self.ops_per_txn)):
                        op = rnd.choices(OPS, weights=self.weights)[0]
                        if op != "insert" and not live:
                            op = "insert"
                        seq += 1
                        marker = f"w{w}-{seq}"
                        if op == "insert":
                            key = next_id
                            next_id += self.writers
                            conn.execute(
                                sql.SQL(
                                    "INSERT INTO {} VALUES (%s, %s, %s, md5(%s), repeat('x', %s))"
                                ).format(self._ident),
                                (key, marker, seq % 1000, marker, self.payload_bytes),
                            )
                            live.append(key)
                            live_set.add(key)
                            added.append(key)
                            pending.append((op, key, None, marker))
                        else:
                            i = rnd.randrange(len(live))
                            key = live[i]
                            if op == "update":
                                conn.execute(
                                    sql.SQL(
                                        "UPDATE {} SET marker = %s, n = coalesce(n, 0) + 1, "
                                        "val = md5(%s) WHERE id = %s"
                                    ).format(self._ident),
                                    (marker, marker, key),
                                )
                                pending.append((op, key, None, marker))
                            elif op == "delete":
                                conn.execute(
                                    sql.SQL("DELETE FROM {} WHERE id = %s").format(self._ident),
                                    (key,),
                                )
                                live[i] = live[-1]
                                live.pop()
                                live_set.discard(key)
                                removed.append(key)
                                pending.append((op, key, None, None))
                            else:
                                new = next_id
                                next_id += self.writers
                                conn.execute(
                                    sql.SQL(
                                        "UPDATE {} SET id = %s, marker = %s WHERE id = %s"
                                    ).format(self._ident),
                                    (new, marker, key),
                                )
                                live[i] = new
                                live_set.discard(key)
                                live_set.add(new)
                                removed.append(key)
                                added.append(new)
                                pending.append((op, key, new, marker))
                # COMMIT returned: only now do the changes count as committed.
                now = time.time()
                txn += 1
                with self._lock:
                    for k, (op, key, new_id, marker) in enumerate(pending):
                        self.log.append(
                            Change(w, seq - len(pending) + k + 1, op, key, new_id, marker, txn, now)
                        )
                if self.pause_s:
                    self._stop.wait(self.pause_s)


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--table", default="public.workload")
    p.add_argument("--rows", type=int, default=None, help="(re)create and load this many rows")
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--ops-per-txn", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--pause", type=float, default=0.0, help="pause after each transaction")
    p.add_argument("--log", default=None, help="write the committed-change log (JSON lines)")
    a = p.parse_args()
    wl = Workload(a.dsn, a.table, writers=a.writers, ops_per_txn=a.ops_per_txn, pause_s=a.pause)
    if a.rows is not None:
        wl.setup(a.rows)
    wl.start()
    time.sleep(a.seconds)  # the CLI runs for a fixed duration by design
    changes = wl.stop()
    if a.log:
        write_log(changes, a.log)
    print(f"{len(changes)} committed changes by {a.writers} writers in {a.seconds}s")


if __name__ == "__main__":
    main()
