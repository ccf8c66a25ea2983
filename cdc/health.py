"""The reader's readiness: streaming, and its loop reported an acknowledged position lately.

:class:`ReaderHealth` is the reader's :class:`cdc.metrics.ReaderMetrics` (so the pipeline
hands it to the streaming loop as its observer) that also notes when the loop last reported:
the loop reports the lag (against its acknowledged position) every few seconds while it
streams, and each acknowledgment. During the snapshot, before streaming, and once the loop
stops reporting for ``health_ready_s`` seconds, ``/readyz`` says not ready.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cdc.metrics import ReaderMetrics
from pgcdc.core.lsn import Lsn


class ReaderHealth(ReaderMetrics):
    """Metrics plus the time and position of the streaming loop's last report."""

    def __init__(self, ready_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.ready_s = ready_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last_report: float | None = None
        self._acked: Lsn | None = None

    def _reported(self) -> None:
        with self._lock:
            self._last_report = self._clock()

    def on_streaming(self, lsn: Lsn) -> None:
        """The stream began: ready from now on (until the loop stops reporting), whether or
        not a change or an acknowledgment comes soon."""
        super().on_streaming(lsn)
        with self._lock:
            self._acked = lsn
        self._reported()

    def on_acknowledged(self, lsn: Lsn) -> None:
        """Record the slot's new flush position, and that the loop is alive."""
        super().on_acknowledged(lsn)
        with self._lock:
            self._acked = lsn
        self._reported()

    def on_lag(self, lag_bytes: int) -> None:
        """The loop measures lag only once it has an acknowledged position: it streams."""
        super().on_lag(lag_bytes)
        self._reported()

    def ready(self) -> tuple[bool, str]:
        """``(ready, why)`` for ``/readyz``."""
        with self._lock:
            last, acked = self._last_report, self._acked
        if last is None:
            return False, "not streaming yet (snapshot or start-up)"
        age = self._clock() - last
        if age > self.ready_s:
            return False, f"no streaming progress for {age:.0f}s (more than {self.ready_s:g}s)"
        at = f", acknowledged {acked}" if acked is not None else ""
        return True, f"streaming{at}, last report {age:.1f}s ago"
