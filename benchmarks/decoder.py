"""Measure the pgoutput decoder and, optionally, a live replication stream.

    .venv/bin/python -m benchmarks.decoder                 # decoder only, on the fixture
    .venv/bin/python -m benchmarks.decoder --dsn "host=/tmp port=55499 user=postgres" \\
        --rows 200000                                       # stream + decode, own table

The decoder is timed on the captured 11-column Insert (tests/fixtures/pgoutput/insert.bin).
Both wall-clock and process CPU time are reported: on a shared machine the CPU rate is the
steadier figure. The stream benchmark creates (and drops) its own table, publication and slot
in the given database; do not point it at data you care about.
"""

from __future__ import annotations

import argparse
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from cdc import pgoutput as po
from cdc.replication import ReplicationConnection, XLogData

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "pgoutput" / "insert.bin"


@dataclass(frozen=True)
class Rate:
    """The best of a measurement's runs: messages (or rows) per wall second and per CPU-second."""

    label: str
    wall_per_s: float
    cpu_per_s: float


def fixture_insert() -> bytes:
    """The captured Insert message (the fixture's first 'I' frame)."""
    raw = FIXTURE.read_bytes()
    pos = 0
    while pos < len(raw):
        (n,) = struct.unpack_from("!I", raw, pos)
        frame = raw[pos + 4 : pos + 4 + n]
        if frame[:1] == b"I":
            return frame
        pos += 4 + n
    raise ValueError(f"no Insert in {FIXTURE}")


def decoder_rates(n: int, repeats: int) -> list[Rate]:
    """Decode the fixture's Insert ``n`` times, ``repeats`` times; the best rates of
    ``decode(bytes)`` and of ``Decoder.decode`` on a memoryview."""
    data = fixture_insert()
    cols = len(po.decode(data).new)  # type: ignore[union-attr]
    # As replication.py hands it over: a memoryview slice of a larger frame.
    view = memoryview(b"w" * 25 + data)[25:]
    decoder = po.Decoder(1)
    out = []
    ways: list[tuple[str, Callable[[], object]]] = [
        ("decode(bytes)", lambda: po.decode(data)),
        ("Decoder.decode(memoryview)", lambda: decoder.decode(view)),
    ]
    for label, fn in ways:
        best_wall = best_cpu = 0.0
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                fn()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            best_wall, best_cpu = max(best_wall, n / wall), max(best_cpu, n / max(cpu, 1e-9))
        out.append(Rate(f"{label:28s} {cols}-column Insert ({len(data)} B)", best_wall, best_cpu))
    return out


def stream_rate(dsn: str, rows: int) -> Rate:
    """Stream ``rows`` 10-column inserts (1,000-row transactions) from a slot of our own
    and decode them; rows per wall second and per reader CPU-second."""
    tag = uuid.uuid4().hex[:8]
    table, pub, slot = f"bench_{tag}", f"bench_pub_{tag}", f"bench_slot_{tag}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id int PRIMARY KEY, a text, b int, c bigint, d numeric, "
            "e timestamptz, f boolean, g text, h float8, i text)"
        )
        conn.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
        repl = ReplicationConnection(dsn)
        try:
            created = repl.create_slot(slot, export_snapshot=False)
            for k in range(0, rows, 1000):
                conn.execute(
                    f"INSERT INTO {table} SELECT g, 'name ' || g, g, g * 1000, g / 7.0, now(), "
                    f"g % 2 = 0, md5(g::text), g / 3.0, 'tail' FROM generate_series({k}, "
                    f"{min(k + 999, rows - 1)}) g"
                )
            repl.start(slot, pub, created.consistent_point)
            decoder = po.Decoder(1)
            inserts = 0
            w0 = c0 = 0.0
            while inserts < rows:
                frame = repl.read(10)
                if frame is None:
                    raise TimeoutError(f"stream stalled after {inserts} rows")
                if not isinstance(frame, XLogData):
                    continue
                if not w0:
                    w0, c0 = time.perf_counter(), time.process_time()
                message = decoder.decode(frame.payload)
                if isinstance(message, po.Insert):
                    inserts += 1
                elif isinstance(message, po.Commit):
                    repl.acknowledge(message.end_lsn)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            label = f"stream+decode {rows} 10-column rows in 1,000-row transactions"
            return Rate(label, rows / wall, rows / cpu)
        finally:
            repl.close()
            if conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone():
                with ReplicationConnection(dsn) as dropper:
                    dropper.drop_slot(slot)  # WAITs until the closed session lets go of it
            conn.execute(f"DROP PUBLICATION IF EXISTS {pub}")
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def main(argv: list[str] | None = None) -> int:
    """Print the decoder's rates (and the stream's, with ``--dsn``)."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.decoder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("-n", type=int, default=200_000, help="decodes per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dsn", help="also stream from this server (a throwaway database)")
    ap.add_argument("--rows", type=int, default=200_000)
    args = ap.parse_args(argv)
    rates = decoder_rates(args.n, args.repeats)
    if args.dsn:
        rates.append(stream_rate(args.dsn, args.rows))
    for r in rates:
        print(f"{r.label}: {r.wall_per_s:,.0f}/s wall, {r.cpu_per_s:,.0f} per CPU-second")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
