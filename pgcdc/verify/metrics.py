"""Prometheus metrics of ``cdc verify --every``, served only when ``verify.metrics_port`` (or
``--metrics-port``) is set.

:class:`VerifyMetrics` is told of each pass (:meth:`on_pass`) by the loop's caller, as the
reader's metrics are told of its events: the passes know nothing of it.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from pgcdc.core.verify_record import KINDS, Outcome, VerifyPass

log = logging.getLogger(__name__)


class VerifyMetrics:
    """Rows checked, divergent keys per table, follower and kind, passes by outcome, and when
    the last pass completed."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.rows_checked = Counter(
            "cdc_verify_rows_checked_total",
            "Keys compared between PostgreSQL and the follower (both sides' keys, once each)",
            ["table", "follower"],
            registry=self.registry,
        )
        self.divergent = Gauge(
            "cdc_verify_divergent_keys",
            "Keys the last completed pass found missing, extra, differing or unsettled",
            ["table", "follower", "kind"],
            registry=self.registry,
        )
        self.passes = Counter(
            "cdc_verify_passes_total",
            "Passes by outcome (clean, drift, unsettled, failed)",
            ["outcome"],
            registry=self.registry,
        )
        self.last_completed = Gauge(
            "cdc_verify_last_pass_completed_timestamp_seconds",
            "When the last pass that reached a verdict finished (Unix seconds)",
            registry=self.registry,
        )
        self.last_duration = Gauge(
            "cdc_verify_last_pass_duration_seconds",
            "How long the last pass that reached a verdict took",
            registry=self.registry,
        )
        for outcome in Outcome:  # every outcome shows, at 0 until it happens
            self.passes.labels(outcome.value)

    def serve(self, port: int) -> None:
        """Expose ``/metrics`` on ``port`` (a daemon thread)."""
        start_http_server(port, addr="127.0.0.1", registry=self.registry)
        log.info("metrics on http://127.0.0.1:%d/metrics", port)

    def on_pass(self, record: VerifyPass) -> None:
        """Count a pass; a completed one sets the divergent keys to what it found (a table
        or follower it no longer checks leaves the gauge)."""
        self.passes.labels(record.outcome.value).inc()
        if record.outcome is Outcome.FAILED:
            return
        self.divergent.clear()
        for c in record.checks:
            self.rows_checked.labels(c.table, c.follower).inc(c.rows_checked)
            for kind in KINDS:
                self.divergent.labels(c.table, c.follower, kind).set(c.counts.get(kind, 0))
        self.last_completed.set(record.finished_at)
        self.last_duration.set(record.finished_at - record.started_at)
