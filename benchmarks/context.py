"""One benchmark run's shared state: where it runs, what it measured, the systems under test.

Every measurement (:mod:`benchmarks.snapshots`, :mod:`.catchup`, :mod:`.streaming`,
:mod:`.follower_run`, :mod:`.runner`) takes a :class:`Bench` and adds figures to
``bench.record``; a system that is not available yields "not measured: <reason>".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from benchmarks.debezium import DebeziumServer
from benchmarks.env import BenchEnv
from benchmarks.ours import OursReader
from benchmarks.params import FULL, QUICK, Params
from benchmarks.proc import Measured
from benchmarks.results import BenchRecord, NotMeasured

BIG = "public.orders_big"
SMALL = "public.orders_small"
STREAM = "public.orders"


class System(Protocol):
    name: str
    slot: str
    prefix: str

    def topic(self, table: str) -> str: ...
    def available(self) -> str | None: ...
    def prepare(self) -> None: ...
    def log_tail(self, lines: int = 15) -> str: ...


@dataclass
class Bench:
    """One run: where it runs, what it measured, and the systems under test."""

    env: BenchEnv
    params: Params
    record: BenchRecord
    ours: OursReader | None = None
    dbz: DebeziumServer | None = None  # Debezium Server with its defaults
    dbzt: DebeziumServer | None = None  # Debezium Server tuned for throughput (TUNED)
    unavailable: dict[str, str] = field(default_factory=dict)
    dbz_streaming: bool = False  # Debezium's slot exists and it has streamed (see snapshot)
    dbzt_streaming: bool = False  # the same for the tuned instance
    dbz_live: Measured | None = None  # quick run: the catch-up instance, kept for latency
    fol_reader: OursReader | None = None  # the follower run's reader (not yet started)
    fol_jobs: Any = None  # its Spark jobs (benchmarks.followers.SparkJobs), once started
    next_id: int = 10**9  # ids of rows inserted by loads start here and only grow

    @classmethod
    def create(cls, env: BenchEnv) -> Bench:
        params = QUICK if env.quick else FULL
        modes = os.environ.get("BENCH_FOLLOWER_MODES")  # e.g. "both" for a shorter run
        if modes:
            params = replace(params, follower_modes=tuple(m.strip() for m in modes.split(",")))
        return cls(env, params, BenchRecord(env.run_id, env.quick))

    def take_ids(self, n: int) -> int:
        """Reserve ``n`` fresh ids (generous: loads may insert fewer)."""
        first = self.next_id
        self.next_id += max(n, 1) * 2 + 1000
        return first


PEERS = ("debezium", "debezium-tuned")


def system_of(b: Bench, name: str) -> Any:
    """The system called ``name`` (ours, debezium, debezium-tuned)."""
    return {"ours": b.ours, "debezium": b.dbz, "debezium-tuned": b.dbzt}[name]


def require(b: Bench, name: str) -> None:
    """NotMeasured when system ``name`` cannot run here."""
    if name in b.unavailable:
        raise NotMeasured(b.unavailable[name])
