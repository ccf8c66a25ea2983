"""Slot lag over time: ``pg_current_wal_lsn() - confirmed_flush_lsn``, and whether it is flat.

"Flat" means no upward trend: over the step (after a warm-up quarter), the least-squares
slope of the lag is at most :data:`FLAT_FRACTION` of the rate at which WAL was written. A
reader that keeps up has a lag that wobbles around a constant; one that falls behind has a
lag growing at (WAL rate - its own rate).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psycopg

FLAT_FRACTION = 0.05


@dataclass(frozen=True)
class LagSample:
    t: float  # time.time()
    wal_bytes: int  # pg_current_wal_lsn() as a byte position
    lag_bytes: int  # minus the slot's confirmed_flush_lsn


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 for fewer than two points)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


@dataclass(frozen=True)
class Trend:
    """The lag trend of one window."""

    lag_slope_bps: float  # bytes/s
    wal_rate_bps: float  # bytes/s written
    start_lag: int
    end_lag: int
    flat: bool


def trend(samples: list[LagSample]) -> Trend:
    """Fit the lag trend of ``samples`` (skipping the first quarter as warm-up)."""
    if len(samples) < 4:
        raise ValueError("too few lag samples to judge a trend")
    win = samples[len(samples) // 4 :]
    s = slope([(x.t, float(x.lag_bytes)) for x in win])
    dt = win[-1].t - win[0].t
    wal = (win[-1].wal_bytes - win[0].wal_bytes) / dt if dt > 0 else 0.0
    flat = s <= FLAT_FRACTION * max(wal, 1.0)
    return Trend(s, wal, win[0].lag_bytes, win[-1].lag_bytes, flat)


class LagSampler:
    """Samples a slot's lag in a thread until stopped."""

    def __init__(self, dsn: str, slot: str, every_s: float = 0.25) -> None:
        self.dsn = dsn
        self.slot = slot
        self.every_s = every_s
        self.samples: list[LagSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="lag")
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    row = conn.execute(
                        "SELECT (pg_current_wal_lsn() - '0/0')::bigint, "
                        "(pg_current_wal_lsn() - confirmed_flush_lsn)::bigint "
                        "FROM pg_replication_slots WHERE slot_name = %s",
                        (self.slot,),
                    ).fetchone()
                    if row is not None and row[1] is not None:
                        self.samples.append(LagSample(time.time(), int(row[0]), int(row[1])))
                    self._stop.wait(self.every_s)
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def window(self, t0: float, t1: float) -> list[LagSample]:
        """Samples taken between t0 and t1 (time.time())."""
        return [s for s in self.samples if t0 <= s.t <= t1]

    def stop(self) -> list[LagSample]:
        self._stop.set()
        self._thread.join(10)
        if self.error is not None:
            raise RuntimeError(f"lag sampler failed: {self.error}") from self.error
        return self.samples
