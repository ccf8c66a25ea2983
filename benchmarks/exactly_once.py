"""What ``kafka.exactly_once`` costs the reader (issue 35), with it off and on in one run.

    .venv/bin/python -m benchmarks.exactly_once [--changes 200000] [--rate 1000] [--seconds 30]

Two readers of one table (10 columns, the backlog's shape), each with its own slot and topic
prefix, one at least once (the default) and one transactional:

1. **catch-up**: both slots are made, then a backlog of ``--changes`` mixed changes is
   written (20-row transactions) while both are stopped; each reader then catches up on the
   same WAL (``cdc run --until current``), one after the other. Throughput is the changes
   over the span of their records' broker append times (the reader's start left out); the
   CPU is the reader process's, per change. Target: on ≥ 0.8× off.
2. **commit→visible latency** at ``--rate`` changes/s (1-row transactions, durable
   commits), each reader streaming alone: the commit time an event carries against when a
   ``read_committed`` consumer receives it (a transactional record is appended before it is
   visible, so the broker's append time would flatter it). Target: p99 ≤ 150 ms with it on.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from benchmarks import workload
from benchmarks.context import Bench
from benchmarks.env import BenchEnv, run_alone
from benchmarks.kafka import end_offsets, wait_for_marker
from benchmarks.ours import OursReader
from benchmarks.probes import wait_slot_held
from benchmarks.proc import Measured
from benchmarks.results import Figure
from benchmarks.streaming import offered_latency

log = logging.getLogger("bench.exactly_once")

TABLE = "public.orders_eos"
ROWS = 20_000  # rows before the backlog: what its updates and deletes touch
MODES = {"off": {}, "on": {"CDC_KAFKA__EXACTLY_ONCE": "true"}}


def _readers(env: BenchEnv) -> dict[str, OursReader]:
    return {
        mode: OursReader(env, [TABLE], role=f"eos_{mode}", settings=settings)
        for mode, settings in MODES.items()
    }


def _span(bootstrap: str, start: dict[tuple[str, int], int]) -> tuple[int, int, int]:
    """(first ms, last ms, count) of the records after ``start``, read whole: the last
    offset of a transactional writer's partition is a commit marker, not a record."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-eos-span",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        c.assign([TopicPartition(t, p, o) for (t, p), o in start.items()])
        first, last, count = 0, 0, 0
        done: set[int] = set()
        deadline = time.monotonic() + 600
        while len(done) < len(start) and time.monotonic() < deadline:
            for m in c.consume(10_000, 1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition() or 0)
                    continue
                ts = m.timestamp()[1]
                first = ts if not first else min(first, ts)
                last, count = max(last, ts), count + 1
        if not count:
            raise RuntimeError("no new records")
        return first, last, count
    finally:
        c.close()


def catch_up(env: BenchEnv, readers: dict[str, OursReader], changes: int) -> dict[str, Any]:
    """Both slots, one backlog, each reader's catch-up on it."""
    for reader in readers.values():
        reader.prepare()
        reader.finish(reader.launch(until_current=True), timeout_s=300)  # the slot, no data
    with env.connect() as conn:
        backlog = workload.write_backlog(
            conn, TABLE, changes, 20, first_new_id=ROWS, update_ids=ROWS
        )
    log.info("backlog: %d changes in %d transactions", backlog.changes, backlog.txns)
    out: dict[str, Any] = {}
    for mode, reader in readers.items():
        start = end_offsets(env.bootstrap, [reader.topic(TABLE)])
        m = reader.launch(until_current=True)
        st = m.wait(1800)
        if st.returncode != 0:
            raise RuntimeError(f"catch-up with exactly_once {mode} failed: {reader.log_tail()}")
        first, last, records = _span(env.bootstrap, start)
        span_s = max(0.001, (last - first) / 1000)
        out[mode] = {
            "changes_per_s": round(backlog.changes / span_s),
            "wall_s": round(st.wall_s, 1),
            "cpu_us_per_change": round(st.cpu_s / backlog.changes * 1e6, 1),
            "records": records,
        }
        log.info("catch-up %s: %s", mode, out[mode])
    out["ratio_on_off"] = round(out["on"]["changes_per_s"] / out["off"]["changes_per_s"], 2)
    return out


def _warm(env: BenchEnv, reader: OursReader, m: Measured) -> None:
    """One change through to Kafka before the load: the reader's first transactions (its
    topics' metadata, the transaction coordinator's first answers) are not the load's."""
    start = end_offsets(env.bootstrap, [reader.topic(TABLE)])
    marker = f"warm-{env.run_id}-{time.time_ns()}"
    with env.connect() as conn:
        conn.execute(f"UPDATE {TABLE} SET status = %s WHERE id = 1", (marker,))
    wait_for_marker(env.bootstrap, start, marker.encode(), 60, alive=m.running)


def latency(
    env: BenchEnv, readers: dict[str, OursReader], rate: float, seconds: float, ids: int
) -> dict[str, Any]:
    """Each reader streaming alone under the same offered load."""
    out: dict[str, Any] = {}
    for mode, reader in readers.items():
        m = reader.launch(until_current=False)
        try:
            wait_slot_held(env, reader.slot, m)
            _warm(env, reader, m)
            samples, res, _old = offered_latency(
                env.dsn, env.bootstrap, reader.topic(TABLE), TABLE, rate, seconds, ids,
                on_receipt=True,
            )  # fmt: skip
            ids += int(rate * seconds * 2)
            s = samples.summary()
            out[mode] = {
                "offered": rate,
                "achieved": round(res.achieved_rate),
                "events": int(s["events"]),
                "p50_ms": round(s["p50_ms"], 1),
                "p99_ms": round(s["p99_ms"], 1),
            }
            log.info("latency %s: %s", mode, out[mode])
        finally:
            reader.finish(m)
    return out


def run(env: BenchEnv, changes: int, rate: float, seconds: float) -> dict[str, Any]:
    with env.connect() as conn:
        workload.create_table(conn, TABLE)
        workload.bulk_load(conn, TABLE, ROWS)
    readers = _readers(env)
    got = {"catch_up": catch_up(env, readers, changes)}
    got["latency"] = latency(env, readers, rate, seconds, ids=10_000_000)
    return got


def exactly_once(b: Bench) -> None:
    """The ``exactly_once`` group: figures under ``exactly_once``."""
    changes, seconds = (20_000, 10.0) if b.env.quick else (200_000, 30.0)
    names = [f"catch-up changes/s, exactly_once {m}" for m in MODES] + [
        "catch-up throughput, on/off",
        *(f"commit→visible p{q} at 1,000/s, exactly_once {m}" for m in MODES for q in (50, 99)),
    ]
    detail = f"{changes:,}-change backlog, 20-row txns, 10 columns, one WAL for both"
    with b.record.guarded("exactly_once", names, detail):
        got = run(b.env, changes, 1000.0, seconds)
        cu = got["catch_up"]
        for mode in MODES:
            b.record.add(Figure("exactly_once", f"catch-up changes/s, exactly_once {mode}",
                                cu[mode]["changes_per_s"], "changes/s",
                                f"{detail}; {cu[mode]['cpu_us_per_change']} µs CPU a change"))  # fmt: skip
        b.record.add(Figure("exactly_once", "catch-up throughput, on/off", cu["ratio_on_off"],
                            "×", f"{detail}; target ≥ 0.8"))  # fmt: skip
        for mode in MODES:
            lat = got["latency"][mode]
            for q in (50, 99):
                b.record.add(Figure("exactly_once", f"commit→visible p{q} at 1,000/s, "
                                    f"exactly_once {mode}", lat[f"p{q}_ms"], "ms",
                                    f"1-row txns, achieved {lat['achieved']}/s, read_committed "
                                    "consumer's receipt; target p99 ≤ 150 ms on"))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.exactly_once", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--changes", type=int, default=200_000, help="the backlog's changes")
    p.add_argument("--rate", type=float, default=1000.0, help="offered changes/s for latency")
    p.add_argument("--seconds", type=float, default=30.0, help="how long the load runs")
    p.add_argument("--keep", action="store_true", help="keep the database and topics")
    a = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def measure(env: BenchEnv) -> dict[str, Any]:
        env.create_database()
        return run(env, a.changes, a.rate, a.seconds)

    return run_alone(a.keep, "exactly_once", measure)


if __name__ == "__main__":
    sys.exit(main())
