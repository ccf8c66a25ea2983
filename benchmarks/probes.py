"""Waiting on the systems under test: a slot taken, a marker row through to Kafka, a slot
drained."""

from __future__ import annotations

import logging
import time
from typing import Any

from benchmarks.context import STREAM, Bench
from benchmarks.env import BenchEnv
from benchmarks.kafka import end_offsets, wait_for_marker
from benchmarks.proc import Measured

log = logging.getLogger(__name__)


def wait_slot_active(b: Bench, slot: str, m: Measured, timeout_s: float = 180) -> None:
    """Wait until a process holds ``slot`` (it exists and is active)."""
    wait_slot_held(b.env, slot, m, timeout_s)


def wait_slot_held(env: BenchEnv, slot: str, m: Measured, timeout_s: float = 180) -> None:
    """:func:`wait_slot_active` on an environment of its own (a module run alone)."""
    deadline = time.time() + timeout_s
    with env.connect() as conn:
        while time.time() < deadline:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if row and row[0]:
                return
            if not m.running():
                raise RuntimeError(f"process exited before it took slot {slot}")
            time.sleep(0.2)
    raise TimeoutError(f"slot {slot} not active after {timeout_s:.0f}s")


def write_marker(b: Bench, tag: str) -> bytes:
    """Change one row so its event carries a unique marker; returns the marker."""
    marker = f"mark-{b.env.run_id}-{tag}-{time.time_ns()}"
    with b.env.connect() as conn:
        conn.execute(
            "UPDATE public.orders SET status = %s, version = version + 1 WHERE id = 1", (marker,)
        )
    return marker.encode()


def ready_probe(b: Bench, system: Any, m: Measured, timeout_s: float = 300) -> None:
    """Change one row and wait until its event is in Kafka: the system is streaming (and
    past anything it replays first)."""
    # A fresh Debezium without offsets streams from the WAL position at its start, which
    # may be after a marker written as soon as its slot was active: a marker that does
    # not come through in 30 s is followed by another.
    start = end_offsets(b.env.bootstrap, [system.topic(STREAM)])
    deadline = time.monotonic() + timeout_s
    while True:
        marker = write_marker(b, "ready")
        wait_s = min(30.0, max(1.0, deadline - time.monotonic()))
        try:
            wait_for_marker(b.env.bootstrap, start, marker, wait_s, alive=m.running)
            return
        except TimeoutError:
            if time.monotonic() >= deadline or not m.running():
                raise


def drain(b: Bench, slot: str, timeout_s: float) -> None:
    """Wait until the slot's lag is small again, so the next step starts clean."""
    deadline = time.time() + timeout_s
    with b.env.connect() as conn:
        while time.time() < deadline:
            row = conn.execute(
                "SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots "
                "WHERE slot_name = %s", (slot,)
            ).fetchone()  # fmt: skip
            if row is None or row[0] is None or int(row[0]) < 4 * 2**20:
                return
            time.sleep(0.5)
    log.warning("slot %s did not drain within %.0fs", slot, timeout_s)
