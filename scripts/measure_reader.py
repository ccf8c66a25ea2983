#!/usr/bin/env python3
"""Measure the reader on this machine: snapshot rows/s, streaming events/s, and
``pg_recvlogical``'s rate on the same WAL in the same run (a baseline without Kafka).

    .venv/bin/python scripts/measure_reader.py [--rows 200000] [--stream-rows 200000]

Uses the local stack (CDC_* defaults), its own database, slots and topic prefix, and cleans up.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from confluent_kafka.admin import AdminClient

from pgcdc.core import ports

ROOT = Path(__file__).resolve().parent.parent
ADMIN_DSN = os.environ.get("CDC_POSTGRES__DSN", ports.POSTGRES_DSN)
BOOTSTRAP = os.environ.get("CDC_KAFKA__BOOTSTRAP_SERVERS", ports.KAFKA_BOOTSTRAP)


def timed_reader(env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cdc", "run", "--until", "current"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"cdc run failed:\n{done.stderr[-2000:]}")
    return time.monotonic() - started, done.stderr


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--stream-rows", type=int, default=200_000)
    p.add_argument("--txn-rows", type=int, default=1000)
    a = p.parse_args()
    tag = f"m_{uuid.uuid4().hex[:8]}"
    base = ADMIN_DSN.rpartition("/")[0]
    dsn = f"{base}/{tag}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{tag}"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(
        CDC_POSTGRES__DSN=dsn,
        CDC_POSTGRES__SLOT_NAME=tag,
        CDC_POSTGRES__PUBLICATION_NAME=tag,
        CDC_KAFKA__TOPIC_PREFIX=tag,
        CDC_KAFKA__BOOTSTRAP_SERVERS=BOOTSTRAP,
    )
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE items (id bigint PRIMARY KEY, marker text, n int, "
                "val text, payload text)"
            )
            conn.execute(
                "INSERT INTO items SELECT g, 'm' || g, g %% 1000, md5(g::text), "
                "repeat('x', 150) FROM generate_series(1, %s::bigint) g",
                (a.rows,),
            )
            conn.execute("VACUUM ANALYZE items")
        secs, err = timed_reader(env)
        line = next((ln for ln in err.splitlines() if "snapshot complete" in ln), "")
        print(
            f"snapshot: {a.rows} rows; {line.split('snapshot complete: ')[-1]} "
            f"(whole run {secs:.1f}s)"
        )
        # A second slot for pg_recvlogical, at the same position, so both read the same WAL.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (tag + "_rl",)
            )
            start = a.rows + 1
            for lo in range(start, start + a.stream_rows, a.txn_rows):
                conn.execute(
                    "INSERT INTO items SELECT g, 'm' || g, g %% 1000, md5(g::text), "
                    "repeat('x', 150) FROM generate_series(%s::bigint, %s::bigint) g",
                    (lo, min(lo + a.txn_rows, start + a.stream_rows) - 1),
                )
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            end = row[0]
        secs, err = timed_reader(env)
        print(
            f"streaming: {a.stream_rows} inserts in {a.txn_rows}-row transactions -> Kafka in "
            f"{secs:.1f}s = {a.stream_rows / secs:,.0f} events/s (incl. ~1s startup)"
        )
        u = psycopg.conninfo.conninfo_to_dict(dsn)
        started = time.monotonic()
        subprocess.run(
            [
                "pg_recvlogical",
                "-h",
                str(u["host"]),
                "-p",
                str(u["port"]),
                "-U",
                str(u["user"]),
                "-d",
                tag,
                "-S",
                tag + "_rl",
                "--start",
                "-E",
                end,
                "-f",
                "/dev/null",
                "-o",
                "proto_version=1",
                "-o",
                f"publication_names={tag}",
                "--no-loop",
            ],
            env={**os.environ, "PGPASSWORD": str(u.get("password", ""))},
            check=True,
        )
        secs = time.monotonic() - started
        print(
            f"pg_recvlogical: same {a.stream_rows} inserts in {secs:.1f}s = "
            f"{a.stream_rows / secs:,.0f} rows/s"
        )
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            for slot in (tag, tag + "_rl"):
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    (slot,),
                )
            conn.execute(f'DROP DATABASE IF EXISTS "{tag}" WITH (FORCE)')
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
        topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(tag)]
        if topics:
            for fut in admin.delete_topics(topics).values():
                fut.result()


if __name__ == "__main__":
    main()
