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


FORKS = """
import os, sys, time
block = bytearray(os.urandom(1 << 20)) * 96  # 96 MiB, every page touched
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:  # a forked worker: the parent's pages, shared until written
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
print("forked", flush=True)
time.sleep(30)
"""


def test_pages_shared_by_forked_children_count_once_in_the_pss(tmp_path: Path) -> None:
    # Four processes hold the same 96 MiB: the sum of their RSS says ~400 MiB, the tree
    # holds ~100 (the shape of PySpark's worker daemon and the workers it forks).
    log = tmp_path / "log"
    m = Measured(["python3", "-c", FORKS], log_path=log, sample_s=0.1)
    try:
        deadline = time.monotonic() + 30
        while m.peak_rss_mb() < 4 * 90 or m.peak_pss_mb() < 90:
            assert time.monotonic() < deadline, f"never saw the forks: {m.peak_rss_mb():.0f} MiB"
            time.sleep(0.1)
        # A sample with PSS (one a second) saw all four: it summed them once each.
        assert 90 < m.peak_pss_mb() < 2 * 96, m.peak_pss_mb()
        assert m.peak_parts_text().startswith("Python ") and "×4" in m.peak_parts_text()
    finally:
        m.stop(5)
