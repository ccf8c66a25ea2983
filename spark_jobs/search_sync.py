"""Keep OpenSearch in sync with the CDC topics: one index per table, versioned by LSN.

scripts/spark-submit spark_jobs/search_sync.py [--available-now] [--help]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgcdc.core.settings import Settings
from spark_jobs.common import run


def make_sink(settings: Settings) -> Any:
    from sinks.search import SearchSink

    return SearchSink(settings.search.url.get_secret_value(), settings.search.index_prefix)


if __name__ == "__main__":
    raise SystemExit(run("search_sync", make_sink))
