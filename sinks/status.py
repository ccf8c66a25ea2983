"""The followers' section of ``cdc status``: each sync job's watermark and how far behind it is.

A watermark is the LSN before which every committed change has been applied to the follower
or dead-lettered (``cdc status`` shows the dead-letter counts beside it); applications wait
for it to pass their own commit LSN to read their writes.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from pgcdc.core.contract import CACHE_JOB, JOBS, SEARCH_JOB
from pgcdc.core.errors import CdcError, root_reason
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import Settings
from sinks.base import Sink


def _watermark(settings: Settings, job: str) -> tuple[int | None, float | None]:
    """The job's watermark LSN and when it last advanced (Unix seconds)."""
    sink: Sink
    if job == CACHE_JOB:
        from sinks.cache import CacheSink

        sink = CacheSink.from_settings(settings.redis)
    else:
        from sinks.search import SearchSink

        sink = SearchSink.from_settings(settings.search, max_attempts=1)
    try:
        return sink.read_watermark(job), sink.read_watermark_time(job)
    finally:
        sink.close()


def _store(settings: Settings, job: str) -> str:
    """``Redis at host:port`` or ``OpenSearch at host:port``: the job's store, no credentials."""
    url = (settings.redis.url if job == CACHE_JOB else settings.search.url).get_secret_value()
    try:
        parts = urlsplit(url)
        where = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    except ValueError:
        where = "its URL"
    return f"{'Redis' if job == CACHE_JOB else 'OpenSearch'} at {where}"


def parse_metrics(text: str, job: str | None = None) -> dict[str, float]:
    """``name{labels}`` → value of a Prometheus text exposition, the ``job`` label dropped
    (one job's endpoint is read at a time); with ``job``, only that job's series (the
    shared job, spark_jobs/sync.py, serves one per follower)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if "{" in name:
            base, _, labels = name.partition("{")
            split = [lab for lab in labels.rstrip("}").split(",") if lab]
            if job is not None and any(
                lab.startswith("job=") and lab != f'job="{job}"' for lab in split
            ):
                continue
            kept = [lab for lab in split if not lab.startswith("job=")]
            name = base + ("{" + ",".join(kept) + "}" if kept else "")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def job_metrics(url: str, timeout_s: float = 5.0, job: str | None = None) -> dict[str, Any]:
    """What a running job's ``/metrics`` says (of follower ``job`` only, if given), for
    ``cdc status``: records by outcome, batches and their mean duration, lag in records and
    in WAL bytes; or an error line."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout_s) as r:
            m = parse_metrics(r.read().decode(), job)
    except OSError as e:
        return {"error": f"{url}: {e}"}
    batches = m.get("cdc_job_batch_seconds_count", 0.0)
    out: dict[str, Any] = {
        outcome: int(m.get(f'cdc_job_records_total{{outcome="{outcome}"}}', 0))
        for outcome in ("applied", "skipped", "failed", "dead_lettered")
    }
    out["batches"] = int(batches)
    out["mean_batch_ms"] = (
        round(1000 * m.get("cdc_job_batch_seconds_sum", 0.0) / batches) if batches else None
    )
    for name, key in (
        ("cdc_job_lag_records", "lag_records"),
        ("cdc_job_lag_lsn_bytes", "lag_lsn_bytes"),
    ):
        out[key] = int(m[name]) if name in m else None
    return out


def follower_status(
    settings: Settings, current_lsn: Lsn | None = None, now: float | None = None
) -> dict[str, Any]:
    """``{job: {"watermark": "X/Y" | None, "watermark_age_s": float | None, "behind_bytes":
    int | None}}`` or an error line; the age is how long ago the watermark last advanced.
    With ``jobs`` (a job's ``--health-port`` URL in ``spark.job_endpoints``), its metrics."""
    now = time.time() if now is None else now
    out: dict[str, Any] = {}
    for job in JOBS:
        try:
            w, at = _watermark(settings, job)
        except (CdcError, OSError) as e:
            out[job] = {"error": f"{_store(settings, job)} cannot be read: {root_reason(e)}"}
            continue
        behind = None
        if w is not None and current_lsn is not None:
            behind = max(0, current_lsn.value - w)
        out[job] = {
            "watermark": str(Lsn(w)) if w is not None else None,
            "watermark_age_s": round(max(0.0, now - at), 1) if at is not None else None,
            "behind_bytes": behind,
        }
        if job == SEARCH_JOB:
            try:
                out[job]["refused_tables"] = _refused_tables(settings)
            except (CdcError, OSError) as e:
                out[job]["error"] = f"{_store(settings, job)} cannot be read: {root_reason(e)}"
        url = settings.spark.job_endpoints.get(job)
        if url:
            out[job]["job"] = job_metrics(url, job=job)
    return out


def _refused_tables(settings: Settings) -> list[dict[str, Any]]:
    """Tables whose index refuses some of their columns as they are now (a type change)."""
    from sinks.search import SearchSink

    sink = SearchSink.from_settings(settings.search, max_attempts=1)
    try:
        return sink.refused_tables()
    finally:
        sink.close()


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
