"""Prometheus metrics of the reader, served only when ``metrics_port`` is set.

No component imports this module: :class:`ReaderMetrics` is a
:class:`cdc.observer.StreamObserver` that the pipeline hands to the streaming loop (and whose
delivery histogram it gives the publisher), so metrics stay a decoration around the reader.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pgcdc.core.lsn import Lsn

log = logging.getLogger(__name__)


class ReaderMetrics:
    """Events, lag, acknowledged position and delivery latency."""

    measures_lag = True

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
        self.snapshot_rows = Gauge(
            "cdc_incremental_snapshot_rows",
            "Rows an incremental snapshot of the table has published and seen acknowledged",
            ["table"],
            registry=self.registry,
        )
        self.snapshot_estimated_rows = Gauge(
            "cdc_incremental_snapshot_estimated_rows",
            "The table's estimated rows (pg_class.reltuples) when its snapshot started",
            ["table"],
            registry=self.registry,
        )
        self.snapshot_chunks = Gauge(
            "cdc_incremental_snapshot_chunks",
            "Chunks of the table's incremental snapshot acknowledged",
            ["table"],
            registry=self.registry,
        )
        # One labelled child per op, looked up once: on_event runs for every event.
        self._event_counters: dict[str, Any] = {}

    def serve(self, port: int) -> None:
        """Expose ``/metrics`` on ``port`` (a daemon thread)."""
        start_http_server(port, addr="127.0.0.1", registry=self.registry)
        log.info("metrics on http://127.0.0.1:%d/metrics", port)

    # --- StreamObserver -------------------------------------------------------------------

    def on_event(self, op: str) -> None:
        """Count one change event."""
        counter = self._event_counters.get(op)
        if counter is None:
            counter = self._event_counters[op] = self.events.labels(op)
        counter.inc()

    def on_streaming(self, lsn: Lsn) -> None:
        """The stream began at the slot's position ``lsn`` (the pipeline says so once)."""
        self.acked_lsn.set(lsn.value)

    def on_acknowledged(self, lsn: Lsn) -> None:
        """Record the slot's new flush position."""
        self.acked_lsn.set(lsn.value)

    def on_lag(self, lag_bytes: int) -> None:
        """Record how far the server's WAL is ahead of the acknowledged position."""
        self.lag_bytes.set(lag_bytes)

    def on_snapshot_progress(self, table: str, rows: int, estimated: int, chunks: int) -> None:
        """An incremental snapshot chunk of ``table`` was acknowledged."""
        self.snapshot_rows.labels(table).set(rows)
        self.snapshot_estimated_rows.labels(table).set(estimated)
        self.snapshot_chunks.labels(table).set(chunks)

    def on_delivery(self, seconds: float) -> None:
        """Record one sampled produce-to-acknowledgment latency."""
        self.delivery_latency.observe(seconds)
