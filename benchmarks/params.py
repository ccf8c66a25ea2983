"""Sizes, rates and durations of a full run and of the quick (CI) run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Params:
    big_rows: int  # the snapshot table
    small_rows: int  # a tenth of it, to see how memory scales with table size
    stream_rows: int  # rows in the streaming table before any load
    backlog_changes: int  # changes written while readers are stopped (catch-up)
    catchup_txn_rows: tuple[int, ...]  # transaction sizes of the backlogs
    latency_rate: float  # changes/s of the commit→Kafka latency run
    latency_s: float
    step_s: float  # duration of one rate step
    step_rates: dict[int, tuple[float, ...]]  # txn size -> rates (changes/s) to step through


FULL = Params(
    big_rows=1_000_000,
    small_rows=100_000,
    stream_rows=100_000,
    backlog_changes=200_000,
    catchup_txn_rows=(1, 100, 1000),
    latency_rate=5000,
    latency_s=20,
    step_s=15,
    step_rates={1: (1000, 2000, 5000, 10000, 20000), 100: (5000, 10000, 20000, 50000, 100000)},
)

QUICK = Params(
    big_rows=50_000,
    small_rows=5_000,
    stream_rows=10_000,
    backlog_changes=20_000,
    catchup_txn_rows=(1, 100),
    latency_rate=5000,
    latency_s=5,
    step_s=5,
    step_rates={1: (1000, 3000), 100: (5000, 20000)},
)
