"""The workload generator's loop: one worker's transactions of a mix, on a schedule.

A *mix* says what one transaction writes (:class:`Mix`); the loop says when: it opens the
connection, lets the mix read what it needs, then runs transactions until the schedule
(:class:`Pacing`) or a stop signal ends it, and tells the mix once each ``COMMIT`` returned.
:mod:`benchmarks.workload.threads` runs workers as threads, :mod:`.open_loop` as processes.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from psycopg import sql


def ident(table: str) -> sql.Composable:
    """``schema.table`` as a quoted identifier (``public`` when no schema is given)."""
    schema, _, name = table.rpartition(".")
    return sql.Identifier(schema or "public", name)


class Mix(Protocol):
    """What one worker writes. The loop owns the connection and the transactions."""

    # True when every transaction is a single statement: it then runs in autocommit mode,
    # without BEGIN/COMMIT round trips (the open-loop generator's single-row rate).
    one_statement: bool

    def prepare(self, conn: psycopg.Connection[Any]) -> None:
        """Read what the mix needs (live keys, next ids) before the first transaction."""

    def write(self, conn: psycopg.Connection[Any], rnd: random.Random) -> Counter[str]:
        """Run one transaction's statements; returns rows changed by kind."""

    def committed(self, at: float) -> None:
        """The transaction's ``COMMIT`` returned at ``at`` (``time.time()``)."""


# Builds worker ``worker`` of ``workers``' mix; must pickle for process workers.
MixFactory = Callable[[int, int], Mix]


@dataclass(frozen=True)
class Pacing:
    """When transactions are due.

    ``rate`` (transactions/s over all workers) makes the load open-loop: transaction ``j``
    is due at ``t0 + j / rate`` whatever happened to earlier ones, so a slow database never
    lowers the offered load. Without it, each worker runs its next transaction at once
    (closed loop), after ``pause_s``. ``seconds`` is the window: with a rate, every
    transaction due inside it is issued, even late, unless ``end_on_clock`` also ends the
    run when the clock passes the window (a fixed duration, as the demo shows it).
    """

    rate: float | None = None
    pause_s: float = 0.0
    seconds: float | None = None
    max_txns: int | None = None  # per worker
    end_on_clock: bool = False


@dataclass
class WorkerResult:
    """What one worker did (picklable: process workers send it back)."""

    worker: int
    transactions: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    max_behind_s: float = 0.0  # how far the worker fell behind its schedule
    error: str = ""
    finished_at: float = 0.0

    @property
    def changes(self) -> int:
        return sum(self.counts.values())


def run_worker(
    dsn: str,
    factory: MixFactory,
    worker: int,
    workers: int,
    pacing: Pacing,
    t0: float,
    seed: int | None,
    stop: threading.Event | None = None,
    on_commit: Callable[[Counter[str]], None] | None = None,
) -> WorkerResult:
    """Run worker ``worker`` of ``workers`` until its schedule ends or ``stop`` is set.

    Worker ``w`` issues the global transactions ``w, w + workers, ...`` (so a rate is
    shared out evenly). Errors propagate; the caller decides how to report them.
    ``on_commit`` gets each committed transaction's counts (for live counters).
    """
    stop = stop or threading.Event()
    rnd = random.Random(None if seed is None else seed * 1000 + worker)
    mix = factory(worker, workers)
    res = WorkerResult(worker)
    end = None if pacing.seconds is None else t0 + pacing.seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        mix.prepare(conn)
        j = worker
        while not stop.is_set():
            if pacing.max_txns is not None and res.transactions >= pacing.max_txns:
                break
            if pacing.rate:
                due = t0 + j / pacing.rate
                if end is not None and due >= end:
                    break
                late = time.time() - due
                if late < 0:
                    if stop.wait(-late):
                        break
                else:
                    res.max_behind_s = max(res.max_behind_s, late)
            if end is not None and (pacing.end_on_clock or not pacing.rate) and time.time() >= end:
                break
            if mix.one_statement:
                counts = mix.write(conn, rnd)
            else:
                with conn.transaction():
                    counts = mix.write(conn, rnd)
            # COMMIT returned: only now do the changes count as committed.
            mix.committed(time.time())
            res.transactions += 1
            res.counts.update(counts)
            if on_commit is not None:
                on_commit(counts)
            j += workers
            if pacing.pause_s:
                stop.wait(pacing.pause_s)
    res.finished_at = time.time()
    return res
