"""Commit→Redis and commit→searchable through the Spark followers.

Not driven by the harness yet: the figure needs the Spark jobs running continuously
against a bench topic prefix, and a poller that sees each change arrive in Redis and in
OpenSearch. Until that exists the report says so, with what is missing.
"""

from __future__ import annotations

from benchmarks.env import ROOT


def followers_unavailable() -> str:
    """Why the follower latencies are not measured in this run."""
    missing = [
        p
        for p in ("scripts/spark-submit", "spark_jobs/cache_sync.py", "spark_jobs/search_sync.py")
        if not (ROOT / p).exists()
    ]
    if missing:
        return "missing " + ", ".join(missing)
    return (
        "the harness does not drive the Spark followers yet (needs the jobs running on the "
        "bench prefix and a Redis/OpenSearch arrival poller)"
    )
