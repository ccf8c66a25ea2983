"""The followers' section of ``cdc status``: each sync job's watermark and how far behind it is.

A watermark is the LSN before which every committed change has been applied to the follower;
applications wait for it to pass their own commit LSN to read their writes.
"""

from __future__ import annotations

from typing import Any

from pgcdc.core.contract import CACHE_JOB, JOBS
from pgcdc.core.errors import CdcError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import Settings


def _watermark(settings: Settings, job: str) -> int | None:
    if job == CACHE_JOB:
        from sinks.cache import CacheSink

        cache = CacheSink.from_settings(settings.redis)
        try:
            return cache.read_watermark(job)
        finally:
            cache.close()
    from sinks.search import SearchSink

    search = SearchSink.from_settings(settings.search, max_attempts=1)
    try:
        return search.read_watermark(job)
    finally:
        search.close()


def follower_status(settings: Settings, current_lsn: Lsn | None = None) -> dict[str, Any]:
    """``{job: {"watermark": "X/Y" | None, "behind_bytes": int | None}}`` or an error line."""
    out: dict[str, Any] = {}
    for job in JOBS:
        try:
            w = _watermark(settings, job)
        except (CdcError, OSError) as e:
            out[job] = {"error": str(e).splitlines()[0]}
            continue
        behind = None
        if w is not None and current_lsn is not None:
            behind = max(0, current_lsn.value - w)
        out[job] = {"watermark": str(Lsn(w)) if w is not None else None, "behind_bytes": behind}
    return out


def status_hook(settings: Settings) -> dict[str, Any]:
    """The ``followers`` section: watermarks against the server's current WAL position."""
    import psycopg

    current: Lsn | None = None
    try:
        with psycopg.connect(settings.postgres.dsn.get_secret_value(), connect_timeout=5) as c:
            row = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            current = Lsn.parse(row[0]) if row else None
    except psycopg.Error:
        current = None
    return follower_status(settings, current)
