"""Pacing: ``cdc verify`` reads at most ``verify.max_rows_per_second`` rows a second.

A token bucket on rows read, shared by every read of a pass (PostgreSQL's ``COPY``, Redis'
``MGET`` pages, OpenSearch's scroll pages): it holds up to one second of rows; each read
takes as many tokens as it read rows, and a read that leaves the bucket in debt waits until
the debt is paid at the rate. So over any stretch of ``t`` seconds at most ``rate * (t + 1)``
rows are read (one second's burst), and a single read larger than the bucket is allowed but
paid for afterwards. The reads of a pass are one after another, so each server sees at most
the rate too. Clock and sleep are given, so the arithmetic is tested without waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


class RowPacer:
    """A token bucket of rows; ``rows_per_second`` 0 never waits."""

    def __init__(
        self,
        rows_per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if rows_per_second < 0:
            raise ValueError("rows_per_second must be 0 (unbounded) or more")
        self.rate = float(rows_per_second)
        self.burst = self.rate  # one second of rows
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.burst
        self._at = clock()
        self.rows = 0  # rows taken in all
        self.waited_s = 0.0  # seconds slept in all
        self._lock = threading.Lock()  # the followers are read in threads of their own

    def take(self, rows: int) -> float:
        """Account for ``rows`` rows read; wait as long as the rate asks. The seconds waited."""
        with self._lock:
            self.rows += rows
            if self.rate <= 0 or rows <= 0:
                return 0.0
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= rows
            if self._tokens >= 0:
                return 0.0
            # In debt: wait until the rate has paid it; the next take counts that time in.
            wait = -self._tokens / self.rate
            self.waited_s += wait
        self._sleep(wait)
        return wait


def paced(items: Iterable[T], pacer: RowPacer | None, every: int = 500) -> Iterator[T]:
    """``items``, taking one row from ``pacer`` per item, in steps of ``every`` (one call a
    step keeps the cost off the per-row path; the step is well under a second's rows)."""
    if pacer is None:
        yield from items
        return
    step = max(1, min(every, int(pacer.rate) or every))
    count = 0
    for item in items:
        yield item
        count += 1
        if count == step:
            pacer.take(count)
            count = 0
    if count:
        pacer.take(count)
