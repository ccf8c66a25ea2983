"""Lag over time, and whether it is flat: the slot's (``pg_current_wal_lsn() -
confirmed_flush_lsn``, bytes) and Kafka's (seconds since the newest event's commit,
:class:`benchmarks.kafka.KafkaLagSampler`).

A rate step is judged by Kafka's lag in seconds (:func:`time_trend`): "flat" means its
robust slope over the step (after a warm-up quarter) is at most :data:`FLAT_FRACTION`
seconds per second, i.e. the reader misses at most that share of the offered rate. A reader
that keeps up has a lag that wobbles around its latency; one that falls behind has a lag
growing at (1 - its rate / the offered rate).

The slot's byte lag (:func:`trend`) is recorded beside it but no longer judges: it counts
the WAL of every database of the cluster up to the reader's next confirmation, so on a
shared server another database's burst (a ``CREATE DATABASE`` writes its template, 10-25
MB) or a reader's confirmation cadence moved its least-squares slope past 5 % of a low
step's WAL rate (ours was judged "growing" at 1,000 single-row changes/s while it kept up).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
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


def robust_slope(points: list[tuple[float, float]], most: int = 120) -> float:
    """Theil–Sen slope (median of the pairwise slopes) of y over x: one outlier (a GC pause,
    a burst from elsewhere) cannot tip it. At most ``most`` evenly spread points are used."""
    if len(points) > most:
        step = len(points) / most
        points = [points[int(i * step)] for i in range(most)]
    slopes = sorted(
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(points)
        for x2, y2 in points[i + 1 :]
        if x2 != x1
    )
    if not slopes:
        return 0.0
    mid = len(slopes) // 2
    return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2


@dataclass(frozen=True)
class TimeTrend:
    """The trend of Kafka's lag in seconds over one window."""

    slope: float  # seconds of lag gained per second
    start_lag_s: float
    end_lag_s: float
    flat: bool


def time_trend(samples: Sequence[tuple[float, float]]) -> TimeTrend:
    """Judge (time, lag seconds) samples of one step, skipping the first quarter."""
    if len(samples) < 4:
        raise ValueError("too few lag samples to judge a trend")
    win = list(samples[len(samples) // 4 :])
    s = robust_slope(win)
    return TimeTrend(s, win[0][1], win[-1][1], s <= FLAT_FRACTION)


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
