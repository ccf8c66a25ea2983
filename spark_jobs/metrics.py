"""Prometheus metrics of a sync job, served at ``/metrics`` beside ``/healthz`` and
``/readyz`` on the job's ``--health-port`` (``cdc status`` reads them from there too).

Counted in the driver from what the tasks report for each micro-batch:

- ``cdc_job_records_total{job,outcome}``: changes applied, skipped (a newer version held),
  failed (refused for good), dead-lettered, keyless and truncate records skipped;
- ``cdc_job_batch_seconds{job}``: how long applying a micro-batch took;
- ``cdc_job_lag_records{job}``: records in the topics not yet read (Spark's last progress:
  latest offset minus end offset, summed over partitions);
- ``cdc_job_lag_lsn_bytes{job}``: WAL bytes between the reader's acknowledged position (the
  newest heartbeat read) and the follower's watermark;
- ``cdc_job_watermark_lsn{job}`` and ``cdc_job_commit_age_seconds{job}`` (now minus the
  commit time of the newest change of the last batch);
- ``cdc_job_behind{job}``: 1 while a follower of the shared job is left out (unreachable),
  to catch up when it answers (:mod:`spark_jobs.behind`), else 0.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from spark_jobs.stats import BatchStats

OUTCOMES = ("applied", "skipped", "failed", "dead_lettered", "keyless", "truncates")


def lag_records(progress: Mapping[str, Any] | None) -> int | None:
    """Records not yet read, from a progress report (None if it does not say)."""
    if not progress:
        return None
    total = 0
    for source in progress.get("sources") or []:
        end, latest = source.get("endOffset"), source.get("latestOffset")
        if end is None or latest is None:
            return None
        end = json.loads(end) if isinstance(end, str) else end
        latest = json.loads(latest) if isinstance(latest, str) else latest
        if not isinstance(end, dict) or not isinstance(latest, dict):
            return None  # e.g. "null" when the source did not report its latest offsets
        for topic, parts in latest.items():
            for part, offset in parts.items():
                total += max(0, int(offset) - int(end.get(topic, {}).get(part, 0)))
    return total


class JobMetrics:
    """One job's metrics, in a registry of their own, labelled by follower job (the shared
    job, spark_jobs/sync.py, counts each of its followers under its own name; the first
    is the default)."""

    def __init__(self, job: str, *more_jobs: str) -> None:
        self.job = job
        self.registry = CollectorRegistry()
        self.records = Counter(
            "cdc_job_records", "Records by outcome", ["job", "outcome"], registry=self.registry
        )
        self.batch_seconds = Histogram(
            "cdc_job_batch_seconds",
            "Time to apply one micro-batch",
            ["job"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.lag_records = Gauge(
            "cdc_job_lag_records", "Records not yet read", ["job"], registry=self.registry
        )
        self.lag_lsn_bytes = Gauge(
            "cdc_job_lag_lsn_bytes",
            "WAL bytes between the reader's acknowledged LSN and the watermark",
            ["job"],
            registry=self.registry,
        )
        self.watermark = Gauge(
            "cdc_job_watermark_lsn", "The follower's watermark", ["job"], registry=self.registry
        )
        self.commit_age = Gauge(
            "cdc_job_commit_age_seconds",
            "Now minus the commit time of the newest change applied",
            ["job"],
            registry=self.registry,
        )
        self.behind = Gauge(
            "cdc_job_behind",
            "1 while the follower is left out, to catch up later (spark_jobs/sync.py)",
            ["job"],
            registry=self.registry,
        )
        self.jobs = (job, *more_jobs)
        for name in self.jobs:
            for outcome in OUTCOMES:
                self.records.labels(name, outcome)
            self.behind.labels(name).set(0)
        self._heartbeat: dict[str, int] = dict.fromkeys(self.jobs, 0)
        self._watermark: dict[str, int] = dict.fromkeys(self.jobs, 0)

    def batch(
        self, stats: BatchStats, seconds: float, watermark: int, job: str | None = None
    ) -> None:
        """Count one applied micro-batch (of follower ``job``, default the first)."""
        job = job or self.job
        for outcome in OUTCOMES:
            n = getattr(stats, outcome)
            if n:
                self.records.labels(job, outcome).inc(n)
        self.batch_seconds.labels(job).observe(seconds)
        heartbeat = self._heartbeat[job] = max(self._heartbeat.get(job, 0), stats.heartbeat_lsn)
        mark = self._watermark[job] = max(self._watermark.get(job, 0), watermark)
        if mark:
            self.watermark.labels(job).set(mark)
        if heartbeat and mark:
            self.lag_lsn_bytes.labels(job).set(max(0, heartbeat - mark))
        if stats.newest_commit_ms:
            self.commit_age.labels(job).set(time.time() - stats.newest_commit_ms / 1000)

    def progress(self, progress: Mapping[str, Any] | None) -> None:
        """The query's last progress report: records not yet read (the same for every
        follower of the query)."""
        lag = lag_records(progress)
        if lag is not None:
            for job in self.jobs:
                self.lag_records.labels(job).set(lag)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return bytes(generate_latest(self.registry))
