"""The ceilings: PostgreSQL's own pgoutput decoding rate, and pg_recvlogical's, on a WAL span.

Both read a dedicated slot created before the span was written, so they decode exactly the
changes the readers under test decode. Peeking does not consume, so the same slot then
serves ``pg_recvlogical``, which stops at ``--endpos``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

PG_BIN = Path("/usr/lib/postgresql/15/bin")
# pgoutput message types that are row changes: 'I', 'U', 'D'.
_ROW_TYPES = "(73, 85, 68)"


@dataclass(frozen=True)
class Decoded:
    """How many row changes were decoded, and how long that took."""

    rows: int
    deletes: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def create_slot(conn: psycopg.Connection[Any], slot: str) -> str:
    """Create a pgoutput slot now; returns its consistent point (LSN text)."""
    row = conn.execute(
        "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)
    ).fetchone()
    assert row is not None
    return str(row[0])


def current_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def peek_decode(
    conn: psycopg.Connection[Any], slot: str, publication: str, upto_lsn: str | None = None
) -> Decoded:
    """Time ``pg_logical_slot_peek_binary_changes`` over everything the slot has."""
    t0 = time.perf_counter()
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE get_byte(data, 0) IN " + _ROW_TYPES + "), "
        "count(*) FILTER (WHERE get_byte(data, 0) = 68) "
        "FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
        "'proto_version', '1', 'publication_names', %s)",
        (slot, upto_lsn, publication),
    ).fetchone()
    seconds = time.perf_counter() - t0
    assert row is not None
    return Decoded(int(row[0]), int(row[1]), seconds)


def recvlogical_binary() -> Path | None:
    """pg_recvlogical of PostgreSQL 15, or one on PATH."""
    p = PG_BIN / "pg_recvlogical"
    if p.exists():
        return p
    found = shutil.which("pg_recvlogical")
    return Path(found) if found else None


def recvlogical_decode(
    dsn: str, slot: str, publication: str, endpos: str, rows: int, timeout_s: float = 600
) -> Decoded:
    """Time ``pg_recvlogical`` streaming the slot to /dev/null until ``endpos``.

    ``rows`` is the row-change count of that span (from :func:`peek_decode` on the same
    slot); pg_recvlogical itself only writes the bytes.
    """
    exe = recvlogical_binary()
    if exe is None:
        raise FileNotFoundError("pg_recvlogical is not installed")
    cmd = [
        str(exe), "-d", dsn, "--slot", slot, "--start", "--no-loop",
        "-o", "proto_version=1", "-o", f"publication_names={publication}",
        "--endpos", endpos, "-f", "/dev/null",
    ]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"pg_recvlogical exited {done.returncode}: {done.stderr.strip()}")
    return Decoded(rows, 0, seconds)


def copy_binary(conn: psycopg.Connection[Any], table: str) -> Decoded:
    """Time ``COPY table TO STDOUT (FORMAT binary)`` read raw (no parsing): the snapshot's
    ceiling."""
    from psycopg import sql

    schema, _, name = table.rpartition(".")
    rows = 0
    t0 = time.perf_counter()
    with (
        conn.cursor() as cur,
        cur.copy(
            sql.SQL("COPY {} TO STDOUT (FORMAT binary)").format(sql.Identifier(schema, name))
        ) as cp,
    ):
        for _block in cp:
            pass
    seconds = time.perf_counter() - t0
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, name))
    ).fetchone()
    rows = int(row[0]) if row else 0
    return Decoded(rows, 0, seconds)
