#!/usr/bin/env python3
"""Throughput of building a Debezium envelope and encoding it as Connect JSON (one core).

A realistic 10-column row (int8 key, text, int4, numeric(10,2), timestamptz, bool, varchar,
~100-byte text, float8, date), values as pgoutput sends them (text). Each event gets its own
SourceInfo (a new LSN, 100-event transactions), as the streaming reader makes them.

Reports events/s (wall) and CPU-seconds per million events (process time: steadier on a
shared machine), for the separate ``encode_key`` + ``encode_value`` calls and, when the
encoder has it, the combined ``encode_change``. Exits 1 when the best CPU rate is below
--min (150,000 events per CPU-second by default).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgcdc.core.settings import SchemaSettings
from schemas import oids
from schemas.envelope import EventEncoder
from schemas.model import Column, PgType, SourceInfo, TableSchema

TXN_EVENTS = 100


def table() -> TableSchema:
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


def measure(label: str, n: int, repeats: int, fn: Callable[[int], int]) -> float:
    """Runs fn(n) ``repeats`` times; prints the best wall and CPU figures; returns CPU rate."""
    best_wall = best_cpu = 0.0
    nbytes = 0
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        nbytes = fn(n)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        best_wall = max(best_wall, n / wall)
        best_cpu = max(best_cpu, n / max(cpu, 1e-9))
    print(
        f"{label:34s} {best_wall:>9,.0f} events/s wall, {best_cpu:>9,.0f} events/CPU-s "
        f"({1e6 / best_cpu:5.2f} CPU-s per 1M; {nbytes / n:,.0f} bytes/event)"
    )
    return best_cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min", type=float, default=150_000.0)
    args = ap.parse_args()
    t = table()
    enc = EventEncoder(SchemaSettings(), "bench", "cdc")
    size = 1000
    data = rows(size)
    srcs = sources(size)
    encode_key, encode_value = enc.encode_key, enc.encode_value

    def separate(n: int) -> int:
        nbytes = 0
        for i in range(n):
            r = data[i % size]
            k = encode_key(t, r)
            v = encode_value(t, "c", None, r, srcs[i % size])
            nbytes += len(v) + (len(k) if k else 0)
        return nbytes

    best = measure("encode_key + encode_value", args.events, args.repeats, separate)
    encode_change = getattr(enc, "encode_change", None)
    if encode_change is not None:

        def combined(n: int) -> int:
            nbytes = 0
            for i in range(n):
                k, v = encode_change(t, "c", None, data[i % size], srcs[i % size])
                nbytes += len(v) + (len(k) if k else 0)
            return nbytes

        best = max(best, measure("encode_change", args.events, args.repeats, combined))
    if best < args.min:
        print(f"below the required {args.min:,.0f} events per CPU-second", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
