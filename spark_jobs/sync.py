"""Keep several followers in sync from one read of the CDC topics: one streaming query, one
checkpoint, each record parsed and reduced once per batch and applied to each follower.

scripts/spark-submit spark_jobs/sync.py --followers cache,search [--available-now] [--help]

Each follower keeps its own job name (``cache_sync``, ``search_sync``: its watermark, its
dead letters, its metrics and batch lines), so ``cdc status`` reads them as it reads the
separate jobs. A follower that stays unreachable falls behind and catches up on its own
(:class:`spark_jobs.apply_loop.ApplyBatch`, :mod:`spark_jobs.behind`).
"""

from __future__ import annotations

from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB, SYNC_JOB
from spark_jobs.apply_loop import Follower
from spark_jobs.cache_sync import cache_sink
from spark_jobs.job import run
from spark_jobs.search_sync import search_sink

FOLLOWERS = {
    "cache": Follower(CACHE_JOB, cache_sink),
    "search": Follower(SEARCH_JOB, search_sink),
}

if __name__ == "__main__":
    raise SystemExit(run(SYNC_JOB, followers=FOLLOWERS))
