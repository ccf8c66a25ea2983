"""Keep OpenSearch in sync with the CDC topics: one index per table, versioned by LSN.

scripts/spark-submit spark_jobs/search_sync.py [--available-now] [--help]
"""

from __future__ import annotations

from pgcdc.core.contract import SEARCH_JOB
from pgcdc.core.settings import Settings
from sinks.search import SearchSink
from spark_jobs.job import run


def search_sink(settings: Settings) -> SearchSink:
    """The OpenSearch follower's writer, from the ``search`` settings."""
    return SearchSink.from_settings(settings.search)


if __name__ == "__main__":
    raise SystemExit(run(SEARCH_JOB, search_sink))
