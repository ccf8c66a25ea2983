"""Run a process and account for it: wall time, CPU seconds of its tree, peak RSS.

CPU comes from ``wait4`` (the process plus every descendant it waited for) so nothing is
lost between samples; peak RSS is sampled with psutil over the whole tree (sum of the
processes' RSS), and also taken from ``wait4`` (largest single process).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

log = logging.getLogger(__name__)


@dataclass
class ProcStats:
    """What a finished process cost."""

    returncode: int
    wall_s: float
    cpu_s: float  # user + system, process tree
    peak_rss_mb: float  # sampled, sum over the tree
    maxrss_mb: float  # from wait4, largest single process
    samples: list[tuple[float, float]] = field(default_factory=list)  # (t, cpu_s) while running


class Measured:
    """A started process whose resources are accounted until :meth:`wait`/:meth:`stop`."""

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log_path: Path | None = None,
        sample_s: float = 0.2,
    ) -> None:
        self.cmd = list(cmd)
        self._log_file = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._ps = psutil.Process(self.proc.pid)
        self._peak_rss = 0
        self._samples: list[tuple[float, float]] = []
        self.rss_samples: list[tuple[float, int]] = []  # (time.time(), RSS bytes of the tree)
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, args=(sample_s,), daemon=True)
        self._sampler.start()
        self.stats: ProcStats | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _sample(self, every: float) -> None:
        while not self._done.wait(every):
            try:
                procs = [self._ps, *self._ps.children(recursive=True)]
                rss = 0
                cpu = 0.0
                for p in procs:
                    try:
                        rss += p.memory_info().rss
                        t = p.cpu_times()
                        cpu += t.user + t.system
                    except psutil.Error:
                        continue
                self._peak_rss = max(self._peak_rss, rss)
                self._samples.append((time.perf_counter() - self.t0, cpu))
                self.rss_samples.append((time.time(), rss))
            except psutil.Error:
                return

    def running(self) -> bool:
        """Whether the process is still alive (never reaps it: :meth:`wait` must)."""
        if self.stats is not None:
            return False
        try:
            return bool(self._ps.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def peak_rss_mb(self) -> float:
        """Peak RSS of the tree sampled so far (MiB)."""
        return self._peak_rss / 2**20

    def cpu_now(self) -> float:
        """CPU seconds of the live tree so far (0 when it is gone)."""
        total = 0.0
        try:
            for p in [self._ps, *self._ps.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
        return total

    def wait(self, timeout_s: float) -> ProcStats:
        """Wait for exit (kill after ``timeout_s``) and return its costs."""
        if self.stats is not None:
            return self.stats
        deadline = time.perf_counter() + timeout_s
        while True:
            pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                log.warning("%s still running after %.0fs; killing it", self.cmd[0], timeout_s)
                os.killpg(self.proc.pid, signal.SIGKILL)
                pid, status, ru = os.wait4(self.proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - self.t0
        # What the leader left in its session dies with it: a Spark job's Python driver is
        # the JVM's child and outlived a stopped job (found running 48 minutes later).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._done.set()
        self._sampler.join(2)
        rc = os.waitstatus_to_exitcode(status)
        self.proc.returncode = rc  # reaped here, so Popen must not wait again
        if self._log_file is not subprocess.DEVNULL:
            self._log_file.close()  # type: ignore[union-attr]
        self.stats = ProcStats(
            returncode=rc,
            wall_s=wall,
            cpu_s=ru.ru_utime + ru.ru_stime,
            peak_rss_mb=self._peak_rss / 2**20,
            maxrss_mb=ru.ru_maxrss / 1024,
            samples=list(self._samples),
        )
        return self.stats

    def stop(self, timeout_s: float = 30.0) -> ProcStats:
        """SIGTERM (graceful stop), then wait; SIGKILL if it does not end in time."""
        if self.stats is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
        return self.wait(timeout_s)
