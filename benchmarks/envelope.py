"""Throughput of building a Debezium envelope and encoding it as Connect JSON (one core).

A realistic 10-column row (int8 key, text, int4, numeric(10,2), timestamptz, bool, varchar,
~100-byte text, float8, date), values as pgoutput sends them (text). Each event gets its own
SourceInfo (a new LSN, 100-event transactions), as the streaming reader makes them.

:func:`measure_envelope` times the separate ``encode_key`` + ``encode_value`` calls and the
combined ``encode_change``, each as events/s (wall) and per CPU-second (process time:
steadier on a shared machine). ``python -m benchmarks.envelope`` prints them and exits 1
when the best CPU rate is below ``--min`` (150,000 events per CPU-second by default).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from pgcdc.core.settings import SchemaSettings
from schemas import oids
from schemas.envelope import EventEncoder
from schemas.model import Column, PgType, SourceInfo, TableSchema

TXN_EVENTS = 100
ROWS = 1000  # distinct rows and sources, cycled


def table() -> TableSchema:
    """The benchmark's 10-column table."""

    def col(name: str, oid: int, typname: str, typmod: int = -1, key: bool = False) -> Column:
        return Column(name, PgType(oid, typname, "b"), typmod, not key, key)

    cols = (
        col("id", oids.INT8, "int8", key=True),
        col("name", oids.TEXT, "text"),
        col("age", oids.INT4, "int4"),
        col("balance", oids.NUMERIC, "numeric", ((10 << 16) | 2) + 4),
        col("created_at", oids.TIMESTAMPTZ, "timestamptz"),
        col("active", oids.BOOL, "bool"),
        col("email", oids.VARCHAR, "varchar", 259),
        col("notes", oids.TEXT, "text"),
        col("score", oids.FLOAT8, "float8"),
        col("born", oids.DATE, "date"),
    )
    return TableSchema("public", "customers", cols, ("id",), "d")


def rows(n: int) -> list[tuple[str | None, ...]]:
    """``n`` rows of text values, as pgoutput sends them."""
    return [
        (
            str(i),
            f"Customer {i}",
            str(20 + i % 60),
            f"{i % 100000}.{i % 100:02d}",
            f"2024-05-01 12:34:{i % 60:02d}.{i % 1000000:06d}+00",
            "t" if i % 2 else "f",
            f"c{i}@example.com",
            f"note {i:08d} " + "lorem ipsum dolor sit amet " * 3 + "x" * 8,
            f"{i / 7:.6f}",
            f"19{50 + i % 50}-0{1 + i % 9}-1{i % 10}",
        )
        for i in range(n)
    ]


def sources(n: int) -> list[SourceInfo]:
    """One SourceInfo per event: transactions of TXN_EVENTS events, a new LSN per event."""
    out = []
    for i in range(n):
        txn = i // TXN_EVENTS
        out.append(
            SourceInfo(
                1714566896123456 + txn * 1000,
                "false",
                1234 + txn,
                987654321 + i * 200,
                None if txn == 0 else 987654000 + txn * 200 * TXN_EVENTS,
            )
        )
    return out


@dataclass(frozen=True)
class EncodeRate:
    """The best of ``repeats`` runs of one way of encoding ``events`` events."""

    label: str
    events: int
    wall_per_s: float
    cpu_per_s: float
    bytes_per_event: float

    def summary(self) -> str:
        """The conditions, for the report."""
        return (
            f"{self.label}, one core, best of {self.events:,} events: "
            f"{self.cpu_per_s:,.0f} events/CPU-s, {self.bytes_per_event:,.0f} bytes/event"
        )

    def line(self) -> str:
        """One readable line, as the command prints it."""
        return (
            f"{self.label:34s} {self.wall_per_s:>9,.0f} events/s wall, "
            f"{self.cpu_per_s:>9,.0f} events/CPU-s ({1e6 / self.cpu_per_s:5.2f} CPU-s per 1M; "
            f"{self.bytes_per_event:,.0f} bytes/event)"
        )


def best_of(label: str, n: int, repeats: int, fn: Callable[[int], int]) -> EncodeRate:
    """Run ``fn(n)`` (returns bytes produced) ``repeats`` times; the best rates."""
    best_wall = best_cpu = 0.0
    nbytes = 0
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        nbytes = fn(n)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        best_wall = max(best_wall, n / wall)
        best_cpu = max(best_cpu, n / max(cpu, 1e-9))
    return EncodeRate(label, n, best_wall, best_cpu, nbytes / n)


def measure_envelope(events: int = 200_000, repeats: int = 3) -> list[EncodeRate]:
    """``encode_key`` + ``encode_value``, then ``encode_change``, on one core."""
    t = table()
    enc = EventEncoder(SchemaSettings(), "bench", "cdc")
    data = rows(ROWS)
    srcs = sources(ROWS)
    encode_key, encode_value, encode_change = enc.encode_key, enc.encode_value, enc.encode_change

    def separate(n: int) -> int:
        nbytes = 0
        for i in range(n):
            r = data[i % ROWS]
            k = encode_key(t, r)
            v = encode_value(t, "c", None, r, srcs[i % ROWS])
            nbytes += len(v) + (len(k) if k else 0)
        return nbytes

    def combined(n: int) -> int:
        nbytes = 0
        for i in range(n):
            k, v = encode_change(t, "c", None, data[i % ROWS], srcs[i % ROWS])
            nbytes += len(v) + (len(k) if k else 0)
        return nbytes

    return [
        best_of("encode_key + encode_value", events, repeats, separate),
        best_of("encode_change", events, repeats, combined),
    ]


def main(argv: list[str] | None = None) -> int:
    """Print the rates; 1 when the best CPU rate is below ``--min``."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.envelope", description=__doc__)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min", type=float, default=150_000.0)
    args = ap.parse_args(argv)
    rates = measure_envelope(args.events, args.repeats)
    for r in rates:
        print(r.line())
    best = max(r.cpu_per_s for r in rates)
    if best < args.min:
        print(f"below the required {args.min:,.0f} events per CPU-second", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
