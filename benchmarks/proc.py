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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

PSS_EVERY_S = 1.0  # seconds between the sampler's reads of PSS (RSS and CPU: every sample)


@dataclass
class ProcStats:
    """What a finished process cost."""

    returncode: int
    wall_s: float
    cpu_s: float  # user + system, process tree
    peak_rss_mb: float  # sampled, sum over the tree
    peak_pss_mb: float  # sampled, sum of PSS over the tree (shared pages counted once)
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
        # PSS: each page shared by several processes of the tree (the Python workers that
        # PySpark's daemon forks share most of theirs with it) counted once, in shares; the
        # sum of RSS counts it once per process.
        self._peak_pss = 0
        self._cmdlines: dict[tuple[int, float, str], list[str]] = {}
        # Each process's CPU seconds when last sampled (those that ended included).
        self._cpu_of: dict[tuple[int, float], tuple[psutil.Process, float]] = {}
        self._kinds: dict[int, str] = {}  # pid -> kind, read while it ran
        self._samples: list[tuple[float, float]] = []
        self.rss_samples: list[tuple[float, int]] = []  # (time.time(), RSS bytes of the tree)
        # (time.time(), CPU seconds by kind of process, those that ended included)
        self.kind_samples: list[tuple[float, dict[str, float]]] = []
        # At the PSS peak: PSS bytes by kind of process (see _kind), and how many of each.
        self.peak_parts: dict[str, tuple[int, int]] = {}
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, args=(sample_s,), daemon=True)
        self._sampler.start()
        self.stats: ProcStats | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _sample(self, every: float) -> None:
        # PSS comes from /proc/<pid>/smaps_rollup: about 4 ms of CPU for a JVM, a hundred
        # times RSS's cost; read once a second, not at every sample, so the sampler does
        # not take a share of the cores it measures.
        pss_due = 0.0
        while not self._done.wait(every):
            now = time.monotonic()
            with_pss = now >= pss_due
            if with_pss:
                pss_due = now + PSS_EVERY_S
            try:
                procs = [self._ps, *self._ps.children(recursive=True)]
                rss = pss = 0
                each: list[tuple[psutil.Process, int]] = []
                seen: dict[int, tuple[list[str], int]] = {}  # pid -> (cmdline, rss)
                for p in procs:
                    try:
                        mem = p.memory_full_info() if with_pss else p.memory_info()
                        t = p.cpu_times()
                        cmd = self._cmdline(p)
                        twin = seen.get(p.ppid())
                    except psutil.Error:
                        continue
                    seen[p.pid] = (cmd, mem.rss)
                    self._cpu_of[(p.pid, p.create_time())] = (p, t.user + t.system)
                    # A child that is still its parent (same command line and the same
                    # resident pages: the moment between a JVM's posix_spawn and the exec of
                    # its helper, when the child shares the JVM's address space) holds no
                    # memory of its own: counted, it doubled the JVM in the peak.
                    if twin is not None and twin == (cmd, mem.rss):
                        continue
                    rss += mem.rss
                    pss += getattr(mem, "pss", 0)
                    each.append((p, getattr(mem, "pss", 0)))
                for p, _ in each:
                    self._kinds[p.pid] = _kind(p, self._cmdline)  # after an exec: anew
                if with_pss and pss > self._peak_pss:
                    self.peak_parts = self._by_kind(each)
                    self._peak_pss = pss
                self._peak_rss = max(self._peak_rss, rss)
                # The tree's CPU with that of processes that ended (as last sampled): a live
                # sum dropped a Python worker's seconds when it exited, and a window's CPU
                # then read a quarter low (the backlog's shared job: 41 µs a change in
                # place of 51).
                total = sum(c for _, c in self._cpu_of.values())
                self._samples.append((time.perf_counter() - self.t0, total))
                self.rss_samples.append((time.time(), rss))
                self.kind_samples.append((time.time(), self._cpu_by_kind()))
            except psutil.Error:
                return

    def _cmdline(self, p: psutil.Process) -> list[str]:
        """``p``'s command line, read once per process and program (an exec keeps the pid:
        spark-submit's bash becomes the JVM)."""
        key = (p.pid, p.create_time(), p.name())
        cmd = self._cmdlines.get(key)
        if cmd is None:
            cmd = self._cmdlines[key] = p.cmdline()
        return cmd

    def _cpu_by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p, cpu in self._cpu_of.values():
            k = self._kinds.get(p.pid, "?")
            out[k] = out.get(k, 0.0) + cpu
        return out

    def cpu_parts_between(self, start: float, end: float) -> str:
        """CPU seconds by kind of process between two wall times (the samples at or before
        each): ``Python worker 4.1 s, JVM 1.2 s, ...`` (largest first)."""

        def at(when: float) -> dict[str, float]:
            best: dict[str, float] = {}
            for t, parts in self.kind_samples:
                if t > when:
                    break
                best = parts
            return best

        a, b = at(start), at(end)
        spent = {k: b[k] - a.get(k, 0.0) for k in b}
        return ", ".join(
            f"{k} {c:.2f} s" for k, c in sorted(spent.items(), key=lambda x: -x[1]) if c >= 0.005
        )

    def cpu_parts_text(self) -> str:
        """CPU seconds by kind of process, as last sampled (a process's last 0.2 s may be
        missing): ``JVM 5.1 s, Python worker 3.2 s ×3, ...`` (largest first)."""
        parts: dict[str, tuple[float, int]] = {}
        for p, cpu in self._cpu_of.values():
            k = self._kinds.get(p.pid, "?")
            c, n = parts.get(k, (0.0, 0))
            parts[k] = (c + cpu, n + 1)
        return ", ".join(
            f"{k} {c:.1f} s" + (f" ×{n}" if n > 1 else "")
            for k, (c, n) in sorted(parts.items(), key=lambda x: -x[1][0])
        )

    def _by_kind(self, each: list[tuple[psutil.Process, int]]) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for p, b in each:
            k = self._kinds.get(p.pid, "?")
            total, n = out.get(k, (0, 0))
            out[k] = (total + b, n + 1)
        return out

    def peak_pss_mb(self) -> float:
        """Peak PSS of the tree sampled so far (MiB)."""
        return self._peak_pss / 2**20

    def peak_parts_text(self) -> str:
        """The tree's peak PSS by kind of process: ``JVM 812 MiB, Python driver 160 MiB,
        ...`` (largest first; ``×N`` when N processes of a kind)."""
        parts = sorted(self.peak_parts.items(), key=lambda x: -x[1][0])
        return ", ".join(
            f"{kind} {b / 2**20:.0f} MiB" + (f" ×{n}" if n > 1 else "") for kind, (b, n) in parts
        )

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

    def cpu_sampled(self) -> float:
        """CPU seconds of the tree at its last sample, those of processes that ended
        included (0 before the first)."""
        return self._samples[-1][1] if self._samples else 0.0

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
            peak_pss_mb=self._peak_pss / 2**20,
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


def _kind(p: psutil.Process, cmdline: Callable[[psutil.Process], list[str]]) -> str:
    """What a process of a Spark job's tree is: the JVM, the Python driver, PySpark's worker
    daemon, one of its workers, or (other) its name; ``cmdline`` reads command lines."""
    try:
        cmd = cmdline(p)
        name = p.name()
    except psutil.Error:
        return "gone"
    if name == "java" or (cmd and cmd[0].endswith("/java")):
        return "JVM"
    if "pyspark.daemon" in cmd or "spark_jobs.daemon" in cmd:
        # Its workers are forks of it: the same command line, under it.
        try:
            parent = p.parent()
            forked = parent is not None and cmdline(parent) == cmd
        except psutil.Error:
            forked = False
        return "Python worker" if forked else "Python worker daemon"
    if name.startswith("python") or (cmd and "python" in cmd[0]):
        if "-m" in cmd[:-1]:  # e.g. the Python data source's streaming runner
            return f"Python {cmd[cmd.index('-m') + 1].rsplit('.', 1)[-1]}"
        return "Python driver" if any(a.endswith(".py") for a in cmd) else "Python"
    return str(name)
