"""A backlog of mixed changes written server-side while no reader runs.

For the catch-up measurements and the ceilings on the same WAL: one ``DO`` block with a
``COMMIT`` per transaction, so Python's speed plays no part. The mix is the open-loop
generator's (:data:`benchmarks.workload.orders.MIX`), in the same transaction shapes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.workload.engine import ident
from benchmarks.workload.orders import ROW_EXPR, UPDATE_SET, txn_pattern


def wait_flushed(conn: psycopg.Connection[Any], timeout_s: float = 30.0) -> None:
    """Wait until WAL is flushed up to now: decoding only sees flushed WAL, and commits
    made with ``synchronous_commit = off`` are flushed later by the WAL writer."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
    assert row is not None
    deadline = time.monotonic() + timeout_s
    while True:
        done = conn.execute("SELECT pg_current_wal_flush_lsn() >= %s", (row[0],)).fetchone()
        if done and done[0]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("WAL was not flushed in time")
        time.sleep(0.02)


@dataclass(frozen=True)
class Backlog:
    """What :func:`write_backlog` wrote."""

    changes: int
    inserts: int
    updates: int
    deletes: int
    txns: int
    seconds: float
    next_id: int


def write_backlog(
    conn: psycopg.Connection[Any],
    table: str,
    changes: int,
    txn_rows: int,
    *,
    first_new_id: int,
    update_ids: int,
) -> Backlog:
    """Write ``changes`` mixed changes in transactions of ``txn_rows``, server-side.

    New rows get ids from ``first_new_id`` up; updates cycle over ids ``0..update_ids-1``
    (which must exist and are never deleted); deletes remove the oldest rows inserted here.
    """
    pattern = txn_pattern(txn_rows)
    per_cycle = sum(sum(p) for p in pattern)
    ntx = max(1, math.ceil(changes * len(pattern) / per_cycle))
    counts = [0, 0, 0]
    for k in range(ntx):
        for i, n in enumerate(pattern[k % len(pattern)]):
            counts[i] += n
    max_nu = max(p[1] for p in pattern)
    if update_ids < max(1, max_nu):
        raise ValueError(f"need at least {max_nu} existing rows to update, have {update_ids}")

    def arr(i: int) -> str:
        return "ARRAY[" + ",".join(str(p[i]) for p in pattern) + "]"

    block = f"""
DO $bench$
DECLARE
  pi int[] := {arr(0)}; pu int[] := {arr(1)}; pd int[] := {arr(2)};
  ni int; nu int; nd int; j int;
  nxt bigint := {int(first_new_id)}; del bigint := {int(first_new_id)}; upd bigint := 0;
BEGIN
  FOR k IN 0..{ntx - 1} LOOP
    j := 1 + mod(k, {len(pattern)});
    ni := pi[j]; nu := pu[j]; nd := pd[j];
    IF ni > 0 THEN
      INSERT INTO {{tbl}} SELECT {ROW_EXPR} FROM generate_series(nxt, nxt + ni - 1) g;
      nxt := nxt + ni;
    END IF;
    IF nu > 0 THEN
      IF upd + nu > {int(update_ids)} THEN upd := 0; END IF;
      UPDATE {{tbl}} SET {UPDATE_SET} WHERE id >= upd AND id < upd + nu;
      upd := upd + nu;
    END IF;
    IF nd > 0 THEN
      DELETE FROM {{tbl}} WHERE id >= del AND id < del + nd;
      del := del + nd;
    END IF;
    COMMIT;
  END LOOP;
END
$bench$"""
    conn.execute("SET synchronous_commit = off")
    t0 = time.perf_counter()
    conn.execute(sql.SQL(block).format(tbl=ident(table)))
    conn.execute("RESET synchronous_commit")
    wait_flushed(conn)
    seconds = time.perf_counter() - t0
    return Backlog(
        changes=sum(counts),
        inserts=counts[0],
        updates=counts[1],
        deletes=counts[2],
        txns=ntx,
        seconds=seconds,
        next_id=first_new_id + counts[0],
    )
