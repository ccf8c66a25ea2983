"""The bench's peer configurations and its throughput plot data, without servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.debezium import TUNED, DebeziumServer
from benchmarks.env import BenchEnv
from benchmarks.report import markdown, plot_throughput, throughput_points
from benchmarks.results import BenchRecord, Figure

pytestmark = pytest.mark.unit


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_tuned_debezium_sets_the_throughput_properties_and_the_default_one_does_not(
    tmp_path: Path,
) -> None:
    env = BenchEnv(out_dir=tmp_path)
    default = _props(DebeziumServer(env, ["public.orders"]).properties())
    tuned_server = DebeziumServer(env, ["public.orders"], role="dbzt", tuned=True)
    tuned = _props(tuned_server.properties())
    assert tuned_server.name == "debezium-tuned"
    for key, value in TUNED.items():
        assert tuned[key] == value
    # The default instance leaves the connector's batching at Debezium's defaults and
    # flushes offsets after every batch (Debezium Server's default).
    for key in ("max.batch.size", "max.queue.size", "poll.interval.ms"):
        assert f"debezium.source.{key}" not in default
    assert default["debezium.source.offset.flush.interval.ms"] == "0"
    # Same delivery guarantees for both: the tuning trades nothing of durability.
    for key in ("acks", "enable.idempotence"):
        k = f"debezium.sink.kafka.producer.{key}"
        assert default[k] == tuned[k]
    # Each has its own slot and topics.
    assert default["debezium.source.slot.name"] != tuned["debezium.source.slot.name"]


def test_throughput_points_by_transaction_size(tmp_path: Path) -> None:
    rec = BenchRecord("r1", quick=False)
    for rows, ours, peer, ceiling in ((1, 30_000.0, 4_000.0, 300_000.0),
                                      (100, 50_000.0, 9_000.0, 600_000.0)):  # fmt: skip
        detail = f"50,000 changes, {rows}-row txns"
        rec.add(Figure("ours", "catch-up events/s", ours, "events/s", detail))
        rec.add(Figure("debezium-tuned", "catch-up events/s", peer, "events/s", detail))
        rec.add(Figure("postgres", "pgoutput decode rows/s", ceiling, "rows/s", detail))
    rec.add(Figure("ours", "catch-up events/s", None, detail="x", reason="not run"))
    pts = throughput_points(rec)
    assert pts["ours (pgcdc reader)"] == [(1, 30_000.0), (100, 50_000.0)]
    assert pts["Debezium Server, tuned"] == [(1, 4_000.0), (100, 9_000.0)]
    assert pts["PostgreSQL pgoutput decoding (ceiling)"] == [(1, 300_000.0), (100, 600_000.0)]
    assert "Debezium Server, defaults" not in pts  # not measured: no line
    png = tmp_path / "t.png"
    assert plot_throughput(rec, png) and png.read_bytes()[:4] == b"\x89PNG"
    assert "bench-throughput.png" in markdown(rec)
    # Ours is compared with the tuned peer in the same row of the report.
    assert "5.56× tuned Debezium" in markdown(rec)


def test_a_run_with_latency_points_and_no_lag_plots_without_a_warning(tmp_path: Path) -> None:
    """A run of some groups (``BENCH_ONLY``) may have latency points and no slot lag: its
    plot is written, and matplotlib warns of no empty legend on the user's screen."""
    import warnings

    from benchmarks.report import plot
    from benchmarks.results import Series

    rec = BenchRecord(run_id="t", quick=True)
    rec.series.append(Series("ours commit→Kafka", "ms", [(0.0, 1.0), (1.0, 2.0)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot(rec, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
