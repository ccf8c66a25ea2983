"""Sizes, rates and durations of a full run and of the quick (CI) run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Params:
    big_rows: int  # the snapshot table (our reader)
    small_rows: int  # a tenth of it: memory vs table size, and Debezium's snapshot table
    stream_rows: int  # rows in the streaming table before any load
    backlog_changes: int  # changes written while readers are stopped (catch-up)
    catchup_txn_rows: tuple[int, ...]  # transaction sizes of the backlogs
    latency_rates: tuple[float, ...]  # changes/s of the commit→Kafka latency runs (1-row txns)
    latency_s: float
    step_s: float  # duration of one rate step
    step_rates: dict[int, tuple[float, ...]]  # txn size -> rates (changes/s) to step through
    peer_step_txn_rows: tuple[int, ...]  # txn sizes whose rate steps Debezium also runs
    follower_rates: tuple[float, ...]  # changes/s offered while follower latency is measured
    # Which jobs run: "shared" (sync.py, both followers), "both" (the two jobs), "redis"
    # (the cache job alone), "search" (alone).
    follower_modes: tuple[str, ...]
    follower_s: float
    follower_probe_hz: float  # marker rows per second during the follower runs
    follower_step_rates: tuple[float, ...]  # changes/s (10-row txns) for the followers' steps
    follower_step_s: float


FULL = Params(
    big_rows=1_000_000,
    small_rows=100_000,
    stream_rows=100_000,
    backlog_changes=50_000,
    catchup_txn_rows=(1, 100, 1000),
    latency_rates=(1000, 5000),
    latency_s=20,
    step_s=12,
    # Extended until our reader's lag grows (issue 13): past 40k/s in 100-row txns.
    step_rates={
        1: (1000, 2000, 3000, 5000, 8000, 12000),
        100: (5000, 10000, 20000, 40000, 60000, 80000, 120000),
    },
    peer_step_txn_rows=(1,),
    follower_rates=(1000, 5000),
    follower_modes=("shared", "both", "redis", "search"),
    follower_s=25,
    follower_probe_hz=10,
    follower_step_rates=(1000, 2000, 5000, 10000, 20000),
    follower_step_s=20,
)

QUICK = Params(
    big_rows=20_000,
    small_rows=2_000,
    stream_rows=5_000,
    backlog_changes=5_000,
    catchup_txn_rows=(1,),
    latency_rates=(1000,),
    latency_s=4,
    step_s=4,
    step_rates={1: (1000, 2000), 100: (5000,)},
    peer_step_txn_rows=(),
    follower_rates=(200,),
    follower_modes=("both",),
    follower_s=5,
    follower_probe_hz=20,
    follower_step_rates=(),
    follower_step_s=6,
)
