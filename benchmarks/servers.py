"""CPU seconds the local stack's servers spent: PostgreSQL, Kafka, Redis and OpenSearch, each
the process tree of its pid file in ``STACK_DIR/run`` (``scripts/stack``). The followers' run
reads them before and after each rate step, so the servers' share of the two cores stands
beside the jobs' in the same run (an OpenSearch refresh after each batch costs OpenSearch,
not the job)."""

from __future__ import annotations

import threading
import time

import psutil

from pgcdc.stack.common import paths

SERVERS = ("postgres", "kafka", "redis", "opensearch")


def cpu_seconds() -> dict[str, float]:
    """User + system CPU seconds of each running server's process tree (those that run)."""
    out: dict[str, float] = {}
    for name in SERVERS:
        try:
            root = psutil.Process(int(paths().pidfile(name).read_text().split()[0]))
            procs = [root, *root.children(recursive=True)]
        except (OSError, ValueError, IndexError, psutil.Error):
            continue
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:  # a backend that ended meanwhile
                continue
            # With what its children that ended spent (the postmaster reaps each backend):
            # a backend that ends between two readings still counts in both.
            total += t.user + t.system + t.children_user + t.children_system
        out[name] = total
    return out


def cores_used(before: dict[str, float], after: dict[str, float], seconds: float) -> str:
    """``before`` to ``after`` over ``seconds`` of wall time, as cores each server kept busy:
    ``opensearch 0.31, kafka 0.12, ...`` (largest first)."""
    used = {n: (after[n] - before[n]) / max(seconds, 1e-3) for n in after if n in before}
    return ", ".join(f"{n} {c:.2f}" for n, c in sorted(used.items(), key=lambda x: -x[1]))


class Sampler:
    """The servers' CPU seconds and the whole machine's busy CPU seconds, sampled every
    ``interval`` seconds in a thread, so that a window known only afterwards (a job's apply
    window, from its log) can be read back: ``with Sampler() as s: ...; s.cores(start, end)``.
    """

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servers-cpu", daemon=True)

    def _sample(self) -> None:
        t = psutil.cpu_times()
        busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        self.samples.append((time.time(), {**cpu_seconds(), "machine": busy}))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _at(self, when: float) -> dict[str, float]:
        """The last sample at or before ``when`` (the first one if none is)."""
        best = self.samples[0][1]
        for t, values in self.samples:
            if t > when:
                break
            best = values
        return best

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Cores each server (and ``machine``: every process, ours and others') kept busy
        between ``start`` and ``end``, wall times."""
        a, b = self._at(start), self._at(end)
        span = max(end - start, 1e-3)
        return {n: round((b[n] - a[n]) / span, 2) for n in b if n in a}
