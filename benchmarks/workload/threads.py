"""Workers of the generator as threads of this process: the tests' and the demo's loads.

Threads suit loads of a few hundred transactions a second; the benchmark's fixed rates need
processes (:mod:`benchmarks.workload.open_loop`), since Python's GIL would cap them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from benchmarks.workload.engine import MixFactory, Pacing, run_worker

log = logging.getLogger(__name__)


class ThreadedLoad:
    """``workers`` threads, each running the mix on ``dsn`` until the pacing or
    :meth:`stop` ends it. ``counts`` (rows changed by kind) and ``transactions`` can be
    read while it runs; a worker's exception lands in ``errors``."""

    def __init__(
        self,
        dsn: str,
        factory: MixFactory,
        *,
        workers: int = 1,
        pacing: Pacing | None = None,
        seed: int | None = None,
        name: str = "workload",
    ) -> None:
        self.dsn = dsn
        self.factory = factory
        self.workers = workers
        self.pacing = pacing or Pacing()  # closed loop until stopped
        self.seed = seed
        self.name = name
        self.errors: list[BaseException] = []
        self._counts: Counter[str] = Counter()
        self._transactions = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def counts(self) -> Counter[str]:
        """Rows changed so far, by kind (a copy)."""
        with self._lock:
            return self._counts.copy()

    @property
    def transactions(self) -> int:
        """Transactions committed so far."""
        return self._transactions

    @property
    def error(self) -> BaseException | None:
        """The first worker error, if any."""
        return self.errors[0] if self.errors else None

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def start(self) -> None:
        """Start the workers; the pacing's clock starts now."""
        self._stop.clear()
        t0 = time.time()
        for w in range(self.workers):
            t = threading.Thread(
                target=self._run, args=(w, t0), name=f"{self.name}-{w}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 60.0) -> None:
        """Ask the workers to stop after their current transaction and wait for them."""
        self._stop.set()
        self._wait(timeout)

    def join(self, timeout: float = 60.0) -> None:
        """Wait for the workers (their pacing ends them); re-raise a worker's error."""
        self._wait(timeout)
        if self.errors:
            raise RuntimeError(f"a workload writer failed: {self.errors[0]!r}") from self.errors[0]

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    def _committed(self, counts: Counter[str]) -> None:
        with self._lock:
            self._counts.update(counts)
            self._transactions += 1

    def _run(self, worker: int, t0: float) -> None:
        try:
            run_worker(
                self.dsn, self.factory, worker, self.workers, self.pacing, t0, self.seed,
                self._stop, self._committed,
            )  # fmt: skip
        except BaseException as e:  # surfaced by join() and `error`
            log.exception("workload worker %d failed", worker)
            self.errors.append(e)
