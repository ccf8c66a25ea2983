"""Keep Redis in sync with the CDC topics: compare-and-set on the LSN-derived version.

scripts/spark-submit spark_jobs/cache_sync.py [--available-now] [--help]
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
    from sinks.cache import CacheSink

    r = settings.redis
    return CacheSink(
        r.url.get_secret_value(),
        r.key_prefix,
        value_mode=r.value_mode,
        ttl_s=r.ttl_s,
        tombstone_ttl_s=r.tombstone_ttl_s,
    )


if __name__ == "__main__":
    raise SystemExit(run("cache_sync", make_sink))
