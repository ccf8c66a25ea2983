"""Does a newer pgoutput protocol help? Memory and latency of one 1M-row transaction.

``python -m benchmarks.proto_versions [--rows N] [--major 18]`` starts a PostgreSQL server of
its own (``major``, 16+ for protocol 4; from a Debian root when the machine lacks it), then
for each way of reading a slot

- protocol 1 (what the reader speaks): the server decodes the transaction, spilling it to
  disk past ``logical_decoding_work_mem``, and sends it after its commit;
- protocol 2, ``streaming 'on'``: the server sends the transaction in chunks while it runs;
- protocol 4, ``streaming 'parallel'``: the same, chunks of concurrent transactions
  interleaved;

runs a consumer process (``ReplicationConnection`` and ``cdc.pgoutput``, decoding every
message) that does what a reader must: with protocol 1 it hands each row on as it comes;
with streaming it must keep a streamed transaction's rows until its commit (nothing
uncommitted may reach Kafka, and an abort must drop them), so it keeps them (decoded, the
least a reader can keep). One ``INSERT … SELECT generate_series`` of ``rows`` rows of about
130 bytes commits; measured: the time from the commit to the consumer holding the commit
(when a reader can start publishing: protocol 1 receives the rows then, streaming has them
already), the consumer's peak RSS, and the server's spill and stream counters
(``pg_stat_replication_slots``).

Prints a table and writes ``bench-results/proto-versions.json``. Not part of ``make bench``:
its answer decides a default (docs/own-postgres.md), it is not a figure to track.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.env import ROOT

MODES = (("1", "off"), ("2", "on"), ("4", "parallel"))


def consume(dsn: str, slot: str, proto: int, streaming: str, ready: Path) -> dict[str, Any]:
    """Read the slot until the first transaction commits; what a reader would have held."""
    from cdc import pgoutput
    from cdc.replication import ReplicationConnection
    from pgcdc.core.lsn import Lsn

    decoder = pgoutput.Decoder(proto)
    held: dict[int, list[Any]] = {}
    rows = 0
    first_row_at: float | None = None
    with ReplicationConnection(dsn, status_interval_s=1.0) as repl:
        repl.start(
            slot,
            "bench_pub",
            Lsn(0),
            proto_version=proto,
            streaming=False if streaming == "off" else streaming,
        )
        ready.write_text("started")
        while True:
            frame = repl.read(1.0)
            if frame is None or not hasattr(frame, "payload"):
                continue
            msg = decoder.decode(frame.payload)
            kind = type(msg)
            if kind is pgoutput.Insert:
                rows += 1
                if first_row_at is None:
                    first_row_at = time.time()
                if decoder.in_stream:
                    held.setdefault(msg.xid or 0, []).append(msg)  # kept until its commit
            elif kind in (pgoutput.Commit, pgoutput.StreamCommit):
                if kind is pgoutput.Commit and rows == 0:
                    continue  # an empty transaction (CREATE TABLE's, etc.)
                done_at = time.time()
                kept = sum(len(v) for v in held.values())
                repl.acknowledge(Lsn(frame.wal_end.value))
                return {
                    "rows": rows,
                    "kept_until_commit": kept,
                    "first_row_at": first_row_at,
                    "commit_received_at": done_at,
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                }


def run_mode(
    dsn: str, admin_dsn: str, proto: str, streaming: str, rows: int, work: Path
) -> dict[str, Any]:
    slot = f"bench_proto_{proto}_{streaming}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    ready, out = work / f"{slot}.ready", work / f"{slot}.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.proto_versions",
            "consume",
            dsn,
            slot,
            proto,
            streaming,
            str(ready),
            str(out),
        ],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the {slot} consumer did not start")
            time.sleep(0.05)
        with psycopg.connect(dsn, autocommit=True) as conn:
            began = time.time()
            conn.execute(
                "INSERT INTO bench_t SELECT g, md5(g::text) || repeat('x', 100) "
                "FROM generate_series(1, %s) g",
                (rows,),
            )
            committed = time.time()
        proc.wait(1800)
        result: dict[str, Any] = json.loads(out.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        stats = conn.execute(
            "SELECT spill_bytes, stream_bytes, total_bytes FROM pg_stat_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute("TRUNCATE bench_t")
    return {
        "protocol": int(proto),
        "streaming": streaming,
        "insert_s": round(committed - began, 2),
        "commit_to_commit_received_s": round(result["commit_received_at"] - committed, 2),
        "first_row_after_begin_s": round((result["first_row_at"] or 0) - began, 2),
        "rows_kept_until_commit": result["kept_until_commit"],
        "consumer_peak_rss_mb": round(result["peak_rss_mb"], 1),
        "server_spill_mb": round((stats[0] or 0) / 1e6, 1) if stats else None,
        "server_stream_mb": round((stats[1] or 0) / 1e6, 1) if stats else None,
        "rows": result["rows"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "consume":
        dsn, slot, proto, streaming, ready, out = argv[1:7]
        Path(out).write_text(json.dumps(consume(dsn, slot, int(proto), streaming, Path(ready))))
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.proto_versions", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--major", type=int, default=18)
    args = p.parse_args(argv)
    from pgcdc.stack import common, pgbin
    from pgcdc.stack.pgserver import NativeRuntime, PgServer, runtime_for

    home = Path(tempfile.mkdtemp(prefix="cdc-proto-"))
    home.chmod(0o755)
    installed = pgbin.installed()
    runtime = (
        NativeRuntime(installed[args.major], args.major)
        if args.major in installed
        else runtime_for(common.paths(), args.major, home / "root")
    )
    inner = home / "root" if args.major not in installed else home
    data = inner / "var/lib/postgresql/data" if inner != home else home / "data"
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    srv = PgServer(runtime, data, port, inner / "run/postgresql", home / "server.log")
    results = []
    try:
        srv.initdb(superuser="cdc", password="cdc")
        srv.configure(
            {
                "wal_level": "logical",
                "max_replication_slots": "10",
                "max_wal_senders": "10",
                "shared_buffers": "128MB",
                "jit": "off",
                "max_wal_size": "4GB",
            },
            [
                "local all all trust",
                "host all all 127.0.0.1/32 scram-sha-256",
                "host replication all 127.0.0.1/32 scram-sha-256",
            ],
        )
        srv.start()
        srv.query("CREATE DATABASE bench")
        dsn = srv.dsn("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_t (id int, payload text)")
            conn.execute("CREATE PUBLICATION bench_pub FOR TABLE bench_t")
            version = conn.execute("SHOW server_version").fetchone()
        for proto, streaming in MODES:
            r = run_mode(dsn, dsn, proto, streaming, args.rows, home)
            print(json.dumps(r), flush=True)
            results.append(r)
    finally:
        srv.stop()
        shutil.rmtree(home, ignore_errors=True)
    out = ROOT / "bench-results" / "proto-versions.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps({"server": version[0] if version else "?", "results": results}, indent=1)
    )
    print(f"PostgreSQL {version[0] if version else '?'}, {args.rows} rows in one transaction")
    for r in results:
        print(
            f"  protocol {r['protocol']} streaming {r['streaming']:<8} commit→commit received "
            f"{r['commit_to_commit_received_s']:>6}s  kept until commit {r['rows_kept_until_commit']:>8} "
            f"rows  consumer peak RSS {r['consumer_peak_rss_mb']:>7} MB  server spill "
            f"{r['server_spill_mb']} MB, streamed {r['server_stream_mb']} MB"
        )
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
