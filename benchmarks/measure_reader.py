"""A quick look at the reader on this machine: snapshot rows/s, catch-up events/s, and
``pg_recvlogical``'s rate on the same WAL in the same run (a baseline without Kafka).

    .venv/bin/python -m benchmarks.measure_reader [--rows 200000] [--stream-rows 200000]

Uses the local stack (or ``CDC_POSTGRES__DSN`` / ``CDC_KAFKA__BOOTSTRAP_SERVERS``) with a
database, slots and topic prefix of its own (:class:`benchmarks.env.BenchEnv`), and removes
them at the end. ``make bench`` measures the same things more carefully, beside Debezium.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from benchmarks import ceilings
from benchmarks.env import BenchEnv
from benchmarks.ours import OursReader

TABLE = "public.items"
# The row for id g, inside parameterised queries (so %% is a literal %).
ROW = "g, 'm' || g, g %% 1000, md5(g::text), repeat('x', 150)"


@dataclass(frozen=True)
class ReaderFigures:
    """Whole-run wall times (reader startup included) and pg_recvlogical's on the same WAL."""

    rows: int
    snapshot_s: float
    stream_rows: int
    txn_rows: int
    catchup_s: float
    recvlogical_s: float

    def lines(self) -> list[str]:
        """The figures as the command prints them."""
        return [
            f"snapshot: {self.rows:,} rows in {self.snapshot_s:.1f}s = "
            f"{self.rows / self.snapshot_s:,.0f} rows/s (incl. ~1s startup)",
            f"streaming: {self.stream_rows:,} inserts in {self.txn_rows}-row transactions -> "
            f"Kafka in {self.catchup_s:.1f}s = {self.stream_rows / self.catchup_s:,.0f} events/s "
            "(incl. ~1s startup)",
            f"pg_recvlogical: same {self.stream_rows:,} inserts in {self.recvlogical_s:.1f}s = "
            f"{self.stream_rows / self.recvlogical_s:,.0f} rows/s",
        ]


def _timed_run(reader: OursReader, snapshot_mode: str) -> float:
    """``cdc run --until current``; its wall time."""
    m = reader.launch(until_current=True, snapshot_mode=snapshot_mode)
    reader.finish(m)
    assert m.stats is not None
    return m.stats.wall_s


def measure_reader(env: BenchEnv, rows: int, stream_rows: int, txn_rows: int) -> ReaderFigures:
    """Snapshot ``rows`` rows, then catch up on ``stream_rows`` inserts written while the
    reader was stopped; pg_recvlogical reads the same inserts from a slot made beside ours."""
    env.create_database()
    with env.connect() as conn:
        conn.execute(
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, marker text, n int, val text, "
            "payload text)"
        )
        conn.execute(
            f"INSERT INTO {TABLE} SELECT {ROW} FROM generate_series(1, %s::bigint) g", (rows,)
        )
        conn.execute(f"VACUUM ANALYZE {TABLE}")
    reader = OursReader(env, [TABLE], role="m")
    reader.prepare()
    snapshot_s = _timed_run(reader, "initial")
    # A second slot at the same position, so both read the same WAL.
    ceiling_slot = env.register_slot(env.name("m_rl"))
    with env.connect() as conn:
        conn.execute(f"CREATE PUBLICATION {ceiling_slot} FOR TABLE {TABLE}")
        ceilings.create_slot(conn, ceiling_slot)
        start = rows + 1
        for lo in range(start, start + stream_rows, txn_rows):
            hi = min(lo + txn_rows, start + stream_rows) - 1
            conn.execute(
                f"INSERT INTO {TABLE} SELECT {ROW} FROM generate_series(%s::bigint, %s::bigint) g",
                (lo, hi),
            )
        end = ceilings.current_lsn(conn)
    catchup_s = _timed_run(reader, "no_data")
    rl = ceilings.recvlogical_decode(env.dsn, ceiling_slot, ceiling_slot, end, stream_rows)
    return ReaderFigures(rows, snapshot_s, stream_rows, txn_rows, catchup_s, rl.seconds)


def main(argv: list[str] | None = None) -> int:
    """Measure, print, clean up."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.measure_reader", description=__doc__)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--stream-rows", type=int, default=200_000)
    p.add_argument("--txn-rows", type=int, default=1000)
    a = p.parse_args(argv)
    env = BenchEnv.from_environ()
    try:
        figures = measure_reader(env, a.rows, a.stream_rows, a.txn_rows)
    finally:
        problems = env.cleanup()
    for line in figures.lines():
        print(line)
    for problem in problems:
        print(f"cleanup: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
