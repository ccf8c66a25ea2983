"""The benchmark's process wrapper leaves nothing of a stopped process behind."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from benchmarks.proc import Measured


def test_stopping_a_process_also_ends_what_it_started(tmp_path: Path) -> None:
    # A leader whose child outlives it when only the leader gets SIGTERM: the shape of a
    # spark-submit JVM and its Python driver.
    pidfile = tmp_path / "child.pid"
    m = Measured(
        ["bash", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], log_path=tmp_path / "log"
    )
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    child = psutil.Process(int(pidfile.read_text()))
    assert child.is_running()
    m.stop(5)
    # SIGKILL is immediate, but the zombie is reaped by init: wait for it to go.
    gone, alive = psutil.wait_procs([child], timeout=5)
    assert child in gone and not alive
