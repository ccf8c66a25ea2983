"""The sync jobs' Prometheus metrics (spark_jobs.metrics) and /metrics on the health port."""

from __future__ import annotations

import json
import urllib.request

import pytest

from pgcdc.core.health import HealthServer
from sinks.status import parse_metrics
from spark_jobs.apply_loop import BatchStats
from spark_jobs.metrics import JobMetrics, lag_records

pytestmark = pytest.mark.unit


def test_counts_lag_and_watermark_are_exposed() -> None:
    m = JobMetrics("cache_sync")
    m.batch(BatchStats(applied=7, skipped=2, dead_lettered=1, heartbeat_lsn=5000), 0.25, 0)
    m.batch(BatchStats(applied=3, heartbeat_lsn=9000), 0.5, 4000)
    progress = {
        "batchId": 2,
        "sources": [
            {
                "endOffset": json.dumps({"t": {"0": 10, "1": 20}}),
                "latestOffset": json.dumps({"t": {"0": 15, "1": 20}}),
            }
        ],
    }
    m.progress(progress)
    got = parse_metrics(m.render().decode())
    assert got['cdc_job_records_total{outcome="applied"}'] == 10
    assert got['cdc_job_records_total{outcome="skipped"}'] == 2
    assert got['cdc_job_records_total{outcome="dead_lettered"}'] == 1
    assert got['cdc_job_records_total{outcome="failed"}'] == 0
    assert got["cdc_job_batch_seconds_count"] == 2
    assert got["cdc_job_batch_seconds_sum"] == pytest.approx(0.75)
    assert got["cdc_job_lag_records"] == 5
    assert got["cdc_job_watermark_lsn"] == 4000
    assert got["cdc_job_lag_lsn_bytes"] == 5000
    assert lag_records(None) is None
    # A source that did not report its latest offsets (JSON null) gives no figure.
    null = {"sources": [{"endOffset": json.dumps({"t": {"0": 1}}), "latestOffset": "null"}]}
    assert lag_records(null) is None


def test_the_health_port_serves_metrics() -> None:
    m = JobMetrics("search_sync")
    m.batch(BatchStats(applied=1), 0.1, 0)
    server = HealthServer(lambda: (True, "ok"), 0, metrics=m.render).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        server.close()
    assert 'cdc_job_records_total{job="search_sync",outcome="applied"} 1.0' in text


def test_cdc_status_shows_a_running_jobs_metrics() -> None:
    from cdc.status_view import render_text
    from pgcdc.core.settings import Settings
    from sinks.status import job_metrics

    m = JobMetrics("cache_sync")
    m.batch(BatchStats(applied=12, dead_lettered=2, heartbeat_lsn=900), 0.2, 800)
    server = HealthServer(lambda: (True, "ok"), 0, metrics=m.render).start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        got = job_metrics(url)
        settings = Settings(spark={"job_endpoints": {"cache_sync": url}})  # type: ignore[arg-type]
        assert settings.spark.job_endpoints["cache_sync"] == url
    finally:
        server.close()
    assert got["applied"] == 12 and got["dead_lettered"] == 2 and got["batches"] == 1
    assert got["lag_lsn_bytes"] == 100
    text = render_text(
        {
            "slot": {},
            "topics": {},
            "followers": {"cache_sync": {"watermark": "0/320", "behind_bytes": 5, "job": got}},
        },
        width=250,
    )
    assert "applied 12, skipped 0, failed 0, dead-lettered 2; 1 batches" in text
    assert "error" in job_metrics(url, timeout_s=2)  # the server is closed now


def test_the_shared_job_counts_each_follower_apart() -> None:
    """spark_jobs/sync.py serves one /metrics for its followers, labelled by job; ``cdc
    status`` reads each follower's own from it."""
    m = JobMetrics("cache_sync", "search_sync")
    m.batch(BatchStats(applied=5, heartbeat_lsn=900), 0.1, 800, "cache_sync")
    m.batch(BatchStats(applied=2, dead_lettered=1, heartbeat_lsn=900), 0.3, 0, "search_sync")
    m.behind.labels("search_sync").set(1)
    m.progress({"sources": [{"endOffset": {"t": {"0": 1}}, "latestOffset": {"t": {"0": 4}}}]})
    text = m.render().decode()
    cache, search = parse_metrics(text, "cache_sync"), parse_metrics(text, "search_sync")
    assert cache['cdc_job_records_total{outcome="applied"}'] == 5
    assert search['cdc_job_records_total{outcome="applied"}'] == 2
    assert search['cdc_job_records_total{outcome="dead_lettered"}'] == 1
    assert cache["cdc_job_watermark_lsn"] == 800 and "cdc_job_watermark_lsn" not in search
    assert cache["cdc_job_lag_records"] == search["cdc_job_lag_records"] == 3
    assert cache["cdc_job_batch_seconds_count"] == search["cdc_job_batch_seconds_count"] == 1
    assert (cache["cdc_job_behind"], search["cdc_job_behind"]) == (0, 1)
