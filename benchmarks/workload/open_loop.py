"""The fixed-rate, open-loop load of the benchmark, in worker processes.

Transaction ``j`` is due at ``t0 + j / txn_rate`` whatever happened to earlier ones, so a
slow consumer never slows the offered load. Workers are processes so Python's GIL does not
cap the rate; each runs the generator's loop (:func:`benchmarks.workload.engine.run_worker`)
on :class:`benchmarks.workload.orders.OrdersMix`.
"""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.workload.engine import MixFactory, Pacing, WorkerResult, run_worker
from benchmarks.workload.orders import OrdersMix


@dataclass
class LoadResult:
    """What an open-loop run achieved (versus what it offered)."""

    offered_rate: float
    txn_rows: int
    seconds: float
    changes: int = 0
    txns: int = 0
    deletes: int = 0
    max_behind_s: float = 0.0  # how far the generator fell behind its schedule
    workers: int = 1
    errors: list[str] = field(default_factory=list)

    @property
    def achieved_rate(self) -> float:
        return self.changes / self.seconds if self.seconds else 0.0

    @property
    def kept_up(self) -> bool:
        """Whether the generator delivered (nearly) what it offered."""
        return not self.errors and self.achieved_rate >= 0.95 * self.offered_rate


def _process_worker(
    dsn: str,
    factory: MixFactory,
    worker: int,
    workers: int,
    pacing: Pacing,
    t0: float,
    seed: int,
    out: Any,
) -> None:
    """One generator process; its result (or error) goes to the parent through ``out``."""
    try:
        res = run_worker(dsn, factory, worker, workers, pacing, t0, seed)
    except Exception as e:  # reported to the parent, which records it
        res = WorkerResult(worker, error=f"worker {worker}: {type(e).__name__}: {e}")
        res.finished_at = time.time()
    out.put(res)


class OpenLoopLoad:
    """A fixed-rate mixed load: ``rate`` changes/s in transactions of ``txn_rows``."""

    def __init__(
        self,
        dsn: str,
        table: str,
        rate: float,
        txn_rows: int,
        seconds: float,
        *,
        id_base: int,
        seed: int = 1,
        workers: int | None = None,
        durable: bool = False,
    ) -> None:
        self.dsn = dsn
        self.durable = durable  # commits wait for the WAL flush (see OrdersMix)
        self.table = table
        self.rate = rate
        self.txn_rows = txn_rows
        self.seconds = seconds
        self.id_base = id_base
        self.seed = seed
        txn_rate = rate / txn_rows
        # About 1,500 single-row txns/s per Python process; fewer processes for big txns.
        # A durable commit waits for the WAL flush (~1 ms here): about 750 txns/s per
        # process, so more processes, whose commits the server then flushes together.
        per_worker, most = (400, 16) if durable else (1500, 8)
        self.workers = workers or max(1, min(most, math.ceil(txn_rate / per_worker)))
        self._ctx = mp.get_context("spawn")
        self._queue: Any = self._ctx.Queue()
        self._procs: list[Any] = []
        self.t0 = 0.0

    def start(self, delay_s: float = 1.0) -> None:
        """Start the workers; the schedule begins ``delay_s`` from now (spawn takes time)."""
        self.t0 = time.time() + delay_s
        factory = functools.partial(
            OrdersMix, self.table, self.txn_rows, self.id_base, durable=self.durable
        )
        pacing = Pacing(rate=self.rate / self.txn_rows, seconds=self.seconds)
        for w in range(self.workers):
            args = (self.dsn, factory, w, self.workers, pacing, self.t0, self.seed, self._queue)
            p = self._ctx.Process(target=_process_worker, args=args, daemon=True)
            p.start()
            self._procs.append(p)

    def join(self, timeout_s: float | None = None) -> LoadResult:
        """Wait for the workers and add up what they did."""
        deadline = time.time() + (timeout_s if timeout_s is not None else self.seconds + 120)
        res = LoadResult(self.rate, self.txn_rows, self.seconds, workers=self.workers)
        finished = self.t0 + self.seconds
        for _ in self._procs:
            left = max(0.1, deadline - time.time())
            try:
                w: WorkerResult = self._queue.get(timeout=left)
            except Exception as e:
                res.errors.append(f"a worker did not report in time: {type(e).__name__}")
                break
            res.changes += w.changes
            res.txns += w.transactions
            res.deletes += w.counts["delete"]
            res.max_behind_s = max(res.max_behind_s, w.max_behind_s)
            finished = max(finished, w.finished_at)
            if w.error:
                res.errors.append(w.error)
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        # The schedule overruns its window when the database is slower than offered.
        res.seconds = max(self.seconds, finished - self.t0)
        return res

    def run(self) -> LoadResult:
        """Start, wait, return the result."""
        self.start()
        return self.join()
