#!/usr/bin/env python3
"""Throughput of building a Debezium envelope and encoding it as Connect JSON (one core).

A 10-column row (int8 key, text, varchar, int4, numeric(12,2), bool, timestamptz,
timestamp, jsonb, float8), values as pgoutput sends them (text). Prints events/s; exits 1
when below --min (150,000 by default).
"""

from __future__ import annotations

import argparse
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))

from cdc.config import SchemaSettings
from schemas import oids
from schemas.envelope import EventEncoder
from schemas.model import Column, PgType, SourceInfo, TableSchema


def table() -> TableSchema:
    def col(name: str, oid: int, typname: str, typmod: int = -1, key: bool = False) -> Column:
        return Column(name, PgType(oid, typname, "b"), typmod, not key, key)

    cols = (
        col("id", oids.INT8, "int8", key=True),
        col("name", oids.TEXT, "text"),
        col("email", oids.VARCHAR, "varchar", 259),
        col("age", oids.INT4, "int4"),
        col("balance", oids.NUMERIC, "numeric", ((12 << 16) | 2) + 4),
        col("active", oids.BOOL, "bool"),
        col("created_at", oids.TIMESTAMPTZ, "timestamptz"),
        col("updated_at", oids.TIMESTAMP, "timestamp"),
        col("attrs", oids.JSONB, "jsonb"),
        col("score", oids.FLOAT8, "float8"),
    )
    return TableSchema("public", "customers", cols, ("id",), "d")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--min", type=float, default=150_000.0)
    args = ap.parse_args()
    t = table()
    enc = EventEncoder(SchemaSettings(), "bench", "cdc")
    rows = [
        (
            str(i),
            f"Customer {i}",
            f"c{i}@example.com",
            str(20 + i % 60),
            f"{i % 100000}.{i % 100:02d}",
            "t" if i % 2 else "f",
            "2024-05-01 12:34:56.123456+00",
            "2024-05-01 12:34:56.123456",
            '{"tier": "gold", "n": 1}',
            "0.25",
        )
        for i in range(1000)
    ]
    src = SourceInfo(1714566896123456, "false", 1234, 987654321, 987654000)
    encode_key, encode_value = enc.encode_key, enc.encode_value
    for r in rows:  # warm up
        encode_key(t, r)
        encode_value(t, "c", None, r, src)
    n = args.events
    nbytes = 0
    start = time.perf_counter()
    for i in range(n):
        r = rows[i % 1000]
        k = encode_key(t, r)
        v = encode_value(t, "c", None, r, src)
        nbytes += len(v) + (len(k) if k else 0)
    elapsed = time.perf_counter() - start
    rate = n / elapsed
    print(
        f"envelope+JSON (key and value, schemas on, 10 columns): {rate:,.0f} events/s "
        f"({elapsed:.2f}s for {n:,} events, {nbytes / n:,.0f} bytes/event)"
    )
    if rate < args.min:
        print(f"below the required {args.min:,.0f} events/s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
