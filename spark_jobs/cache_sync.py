"""Keep Redis in sync with the CDC topics: compare-and-set on the LSN-derived version.

scripts/spark-submit spark_jobs/cache_sync.py [--available-now] [--help]
"""

from __future__ import annotations

from pgcdc.core.contract import CACHE_JOB
from pgcdc.core.settings import Settings
from sinks.cache import CacheSink
from spark_jobs.job import run


def cache_sink(settings: Settings) -> CacheSink:
    """The Redis follower's writer, from the ``redis`` settings."""
    return CacheSink.from_settings(settings.redis)


if __name__ == "__main__":
    raise SystemExit(run(CACHE_JOB, cache_sink))
