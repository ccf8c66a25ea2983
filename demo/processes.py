"""The demo's child processes: the reader and the two sync jobs, each in its own process group.

Each one logs to its own file; a process that dies early is reported with the end of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Child:
    """A started process and where its output goes."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 2500) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return text[-n:]

    def log_has(self, needle: str) -> bool:
        if not self.log.exists():
            return False
        return needle in self.log.read_text(errors="replace")

    def terminate(self, grace_s: float = 30.0) -> int:
        """SIGTERM the process (the reader stops cleanly on it), then SIGKILL its group."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
        self.kill_group()
        return self.proc.returncode

    def kill_group(self, grace_s: float = 15.0) -> None:
        """SIGTERM the whole group (spark-submit's JVM and its Python workers), then SIGKILL."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(self.proc.pid):
                self.proc.poll()
                time.sleep(0.2)
            if not _group_alive(self.proc.pid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True  # callers poll() the leader, so a zombie leader does not linger


def start(name: str, argv: list[str], env: dict[str, str], log: Path) -> Child:
    """Start ``argv`` in a new session (its own process group), output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as f:
        proc = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Child(name, proc, log)


def start_reader(env: dict[str, str], log: Path) -> Child:
    """``cdc run``: snapshot, then stream until SIGTERM."""
    return start("reader", [sys.executable, "-m", "cdc", "run"], env, log)


def start_job(job: str, env: dict[str, str], log: Path, *args: str) -> Child:
    """A sync job through scripts/spark-submit, e.g. ``start_job("cache_sync", ...)``."""
    argv = [str(ROOT / "scripts" / "spark-submit"), f"spark_jobs/{job}.py", *args]
    return start(job, argv, env, log)
