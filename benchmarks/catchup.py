"""Catch-up on the same WAL: a backlog written while every reader is stopped, then the
ceilings (peek, pg_recvlogical), our catch-up and Debezium's on it."""

from __future__ import annotations

from typing import Any

from benchmarks import ceilings, workload
from benchmarks.context import PEERS, STREAM, Bench, require, system_of
from benchmarks.debezium import DebeziumServer
from benchmarks.kafka import end_offsets, span_timestamps, wait_for_marker
from benchmarks.probes import ready_probe, wait_slot_active, write_marker
from benchmarks.results import Figure


def create_stream_slots(b: Bench) -> None:
    """Create our and Debezium's streaming slots now (no snapshot), then stop both."""
    if b.ours and "ours" not in b.unavailable:
        try:
            b.ours.prepare()
            m = b.ours.launch(until_current=True, snapshot_mode="no_data")
            b.ours.finish(m, timeout_s=300)
        except Exception as e:
            b.unavailable["ours"] = f"creating its slot failed: {e}"
    if b.dbz and "debezium" not in b.unavailable and not b.dbz_streaming:
        try:
            # The snapshot instance did not get to streaming: a plain streaming instance.
            b.dbz = DebeziumServer(b.env, [STREAM], role="dbzs")
            b.dbz.prepare()
            m = b.dbz.launch()
            try:
                wait_slot_active(b, b.dbz.slot, m)
                ready_probe(b, b.dbz, m)  # streaming for real, offsets committed
            finally:
                b.dbz.finish(m)
            b.dbz_streaming = True  # another group (--only …) must not create it again
        except Exception as e:
            b.unavailable["debezium"] = f"creating its slot failed: {e}: {b.dbz.log_tail(3)}"
    if b.dbzt and "debezium-tuned" not in b.unavailable and not b.dbzt_streaming:
        try:
            b.dbzt.prepare()
            m = b.dbzt.launch()
            try:
                wait_slot_active(b, b.dbzt.slot, m)
                ready_probe(b, b.dbzt, m)
            finally:
                b.dbzt.finish(m)
            b.dbzt_streaming = True
        except Exception as e:
            b.unavailable["debezium-tuned"] = f"creating its slot failed: {e}: {b.dbzt.log_tail(3)}"


def catchup_phase(b: Bench, txn_rows: int, *, keep_peer: bool = False) -> None:
    """A backlog of mixed changes in ``txn_rows``-row transactions, written while every
    reader is stopped; then the ceilings, our catch-up and Debezium's, on that WAL."""
    p = b.params
    detail = f"{p.backlog_changes:,} changes, {txn_rows}-row txns"
    ceil_slot = b.env.register_slot(b.env.name(f"ceil{txn_rows}"))
    ceil_pub = b.env.name("ceil_pub")
    with b.env.connect() as conn:
        conn.execute(f"DROP PUBLICATION IF EXISTS {ceil_pub}")
        conn.execute(f"CREATE PUBLICATION {ceil_pub} FOR TABLE {STREAM}")
        ceilings.create_slot(conn, ceil_slot)
        backlog = workload.write_backlog(
            conn, STREAM, p.backlog_changes, txn_rows,
            first_new_id=b.take_ids(p.backlog_changes), update_ids=p.stream_rows,
        )  # fmt: skip
        endpos = ceilings.current_lsn(conn)
    marker = write_marker(b, f"catchup{txn_rows}")
    expected = backlog.changes + backlog.deletes  # a delete is an event and a tombstone
    b.record.notes.append(
        f"backlog {txn_rows}-row txns: {backlog.changes:,} changes ({backlog.inserts:,} I, "
        f"{backlog.updates:,} U, {backlog.deletes:,} D) in {backlog.txns:,} txns, "
        f"written in {backlog.seconds:.1f}s"
    )
    with b.record.guarded("postgres", ["pgoutput decode rows/s"], detail), b.env.connect() as c:
        d = ceilings.peek_decode(c, ceil_slot, ceil_pub)
        if d.rows != backlog.changes:
            b.record.notes.append(f"peek decoded {d.rows} rows, backlog wrote {backlog.changes}")
        b.record.add(Figure("postgres", "pgoutput decode rows/s", d.rows_per_s, "rows/s", detail))
    with b.record.guarded("pg_recvlogical", ["pg_recvlogical rows/s"], detail):
        r = ceilings.recvlogical_decode(b.env.dsn, ceil_slot, ceil_pub, endpos, backlog.changes)
        b.record.add(Figure("pg_recvlogical", "pg_recvlogical rows/s", r.rows_per_s, "rows/s",
                            detail))  # fmt: skip
    b.env.drop_slot(ceil_slot)
    for name in ("ours", *PEERS):
        with b.record.guarded(name, ["catch-up events/s"], detail):
            require(b, name)
            catchup(b, name, marker, expected, backlog.changes, detail, keep=keep_peer)


def catchup(
    b: Bench,
    name: str,
    marker: bytes,
    expected: int,
    changes: int,
    detail: str,
    keep: bool = False,
) -> None:
    """Start ``name`` on its stopped slot and time until the backlog (and the marker
    written after it) is in Kafka."""
    system: Any = system_of(b, name)
    topic = system.topic(STREAM)
    start = end_offsets(b.env.bootstrap, [topic])
    m = system.launch(until_current=True) if name == "ours" else system.launch()
    kept = False
    try:
        if name == "ours":
            system.finish(m)
            reached, seen = wait_for_marker(b.env.bootstrap, start, marker, 30)
            reached = m.t0 + (m.stats.wall_s if m.stats else 0.0)
        else:
            reached, seen = wait_for_marker(b.env.bootstrap, start, marker, 1800, alive=m.running)
            if keep:  # the quick run measures its latency next, without another JVM start
                b.dbz_live = m
                kept = True
    finally:
        if name != "ours" and not kept:
            system.finish(m)
    if seen != expected + 1:
        b.record.notes.append(
            f"{name} catch-up ({detail}): {seen:,} records up to the marker, expected "
            f"{expected + 1:,} (events + tombstones + marker); duplicates or gaps"
        )
    if kept:
        cpu_s, rss = m.cpu_now(), m.peak_rss_mb()
    else:
        assert m.stats is not None
        cpu_s, rss = m.stats.cpu_s, m.stats.peak_rss_mb
    wall = reached - m.t0
    first, last, count = span_timestamps(b.env.bootstrap, start)
    extra = {"wall_s": wall, "records": count, "cpu_s": cpu_s}
    b.record.add(Figure(name, "catch-up events/s (incl. startup)", changes / wall, "events/s",
                        detail, extra=extra))  # fmt: skip
    if last > first:
        b.record.add(Figure(name, "catch-up events/s", changes / ((last - first) / 1000),
                            "events/s", detail, extra=extra))  # fmt: skip
    b.record.add(Figure(name, "catch-up CPU-s per 1M changes", cpu_s / changes * 1e6,
                        "CPU-s", detail))  # fmt: skip
    b.record.add(Figure(name, "catch-up peak RSS", rss, "MiB", detail))
