"""Prometheus metrics of the reader, served only when ``metrics_port`` is set.

The components never import this module: the pipeline reads their counters and feeds them
here, so metrics stay a decoration around the reader, not part of it.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)


class ReaderMetrics:
    """Events, lag, acknowledged position and delivery latency."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.events = Counter(
            "cdc_events_total", "Change events produced to Kafka", ["op"], registry=self.registry
        )
        self.lag_bytes = Gauge(
            "cdc_lag_bytes",
            "Bytes of WAL between the server's current position and the last acked LSN",
            registry=self.registry,
        )
        self.acked_lsn = Gauge(
            "cdc_acked_lsn",
            "Last LSN acknowledged to the slot (as a number)",
            registry=self.registry,
        )
        self.delivery_latency = Histogram(
            "cdc_delivery_latency_seconds",
            "Time from produce() to Kafka's acknowledgment",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )

    def serve(self, port: int) -> None:
        """Expose ``/metrics`` on ``port`` (a daemon thread)."""
        start_http_server(port, addr="127.0.0.1", registry=self.registry)
        log.info("metrics on http://127.0.0.1:%d/metrics", port)
