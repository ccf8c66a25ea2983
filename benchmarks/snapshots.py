"""Snapshots: COPY binary (the ceiling), our reader and Debezium Server, each on its own slot."""

from __future__ import annotations

from benchmarks import ceilings
from benchmarks.context import BIG, SMALL, STREAM, Bench, require
from benchmarks.debezium import DebeziumServer
from benchmarks.kafka import CountWatcher, span_timestamps
from benchmarks.ours import OursReader
from benchmarks.probes import ready_probe
from benchmarks.results import Figure


def snapshot_ceiling(b: Bench, table: str = BIG) -> None:
    """COPY ... (FORMAT binary) of a snapshot table, read raw: the snapshot ceiling for a
    table of that size (ratios compare equal sizes)."""
    with b.record.guarded("postgres", ["COPY binary rows/s"]), b.env.connect() as conn:
        d = ceilings.copy_binary(conn, table)
        b.record.add(Figure("postgres", "COPY binary rows/s", d.rows_per_s, "rows/s",
                            f"{d.rows:,} rows"))  # fmt: skip


def _snapshot_figures(
    b: Bench,
    system: str,
    rows: int,
    wall: float,
    cpu: float,
    rss: float,
    span: tuple[int, int, int],
) -> None:
    first, last, count = span
    detail = f"{rows:,} rows"
    b.record.add(Figure(system, "snapshot rows/s", rows / wall, "rows/s", detail,
                        extra={"wall_s": wall, "records": count}))  # fmt: skip
    if last > first:
        b.record.add(Figure(system, "snapshot rows/s (first→last record)",
                            count / ((last - first) / 1000), "rows/s", detail))  # fmt: skip
    b.record.add(Figure(system, "snapshot CPU-s per 1M rows", cpu / rows * 1e6, "CPU-s", detail))
    b.record.add(Figure(system, "snapshot peak RSS", rss, "MiB", detail))


SNAP_METRICS = ["snapshot rows/s", "snapshot CPU-s per 1M rows", "snapshot peak RSS"]


def snapshot_ours(b: Bench, table: str = BIG, rows: int | None = None) -> None:
    """Our reader snapshots ``table`` (own slot, dropped after) with ``--until current``."""
    rows = (
        rows if rows is not None else (b.params.big_rows if table == BIG else b.params.small_rows)
    )
    with b.record.guarded("ours", SNAP_METRICS, f"{rows:,} rows"):
        require(b, "ours")
        r = OursReader(b.env, [table], role="snap_" + table.split(".")[-1].removeprefix("orders_"))
        r.prepare()
        # The reader's --drop-slot-on-exit raced its own walsender ("slot in use"): drop
        # the slot here once it is inactive.
        m = r.launch(until_current=True, snapshot_mode="initial")
        try:
            r.finish(m, timeout_s=1800)
        finally:
            b.env.drop_slot(r.slot)
        st = m.stats
        assert st is not None
        span = span_timestamps(b.env.bootstrap, {(r.topic(table), 0): 0})
        if span[2] < rows:
            raise RuntimeError(f"only {span[2]} of {rows} snapshot records reached Kafka")
        _snapshot_figures(b, "ours", rows, st.wall_s, st.cpu_s, st.peak_rss_mb, span)


def snapshot_debezium(b: Bench, table: str = SMALL, rows: int | None = None) -> None:
    """Debezium Server snapshots ``table``; the same JVM start then becomes the streaming
    instance: its slot also covers the streaming table (not snapshotted), so once every
    row is in Kafka a marker on the streaming table proves it streams, and it stops with
    its slot and offsets kept for catch-up (one JVM start saved)."""
    rows = rows if rows is not None else b.params.small_rows
    with b.record.guarded("debezium", SNAP_METRICS, f"{rows:,} rows"):
        require(b, "debezium")
        d = DebeziumServer(b.env, [table, STREAM], role="dbz", snapshot_mode="initial",
                           snapshot_tables=[table])  # fmt: skip
        b.dbz = d
        d.prepare()
        watcher = CountWatcher(b.env.bootstrap, [d.topic(table)])
        m = d.launch()
        try:
            done = watcher.wait_for(rows, timeout_s=1800, alive=m.running)
            wall = done - m.t0
            cpu = m.cpu_now()
            ready_probe(b, d, m)
            b.dbz_streaming = True
        except Exception as e:
            raise RuntimeError(f"{e}; log: {d.log_tail(3)}") from e
        finally:
            watcher.close()
            d.finish(m)
        st = m.stats
        assert st is not None
        span = span_timestamps(b.env.bootstrap, {(d.topic(table), 0): 0})
        _snapshot_figures(b, "debezium", rows, wall, cpu, st.peak_rss_mb, span)
