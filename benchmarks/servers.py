"""CPU seconds the local stack's servers spent: PostgreSQL, Kafka, Redis and OpenSearch, each
the process tree of its pid file in ``STACK_DIR/run`` (``scripts/stack``). The followers' run
reads them before and after each rate step, so the servers' share of the two cores stands
beside the jobs' in the same run (an OpenSearch refresh after each batch costs OpenSearch,
not the job)."""

from __future__ import annotations

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
