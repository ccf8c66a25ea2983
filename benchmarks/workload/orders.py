"""The benchmark's table and the load it puts on it.

The table is shaped like a typical OLTP row: 10 columns, about 200 bytes. Loads come in three
kinds:

* :func:`bulk_load` fills a table with ``INSERT ... SELECT generate_series`` (for snapshots);
* :func:`write_backlog` writes N mixed changes server-side, one ``COMMIT`` per transaction of
  a fixed size, while no reader runs (for catch-up and for the ceilings on the same WAL);
* :class:`OpenLoopLoad` is the fixed-rate, open-loop generator: transaction ``j`` is due at
  ``t0 + j / txn_rate`` whatever happened to earlier ones, so a slow consumer never slows
  the offered load. It runs in worker processes so Python's GIL does not cap the rate.

The mix is 50% inserts, 40% updates, 10% deletes.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import random
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

COLUMNS = (
    "id bigint PRIMARY KEY, customer_id integer NOT NULL, status text NOT NULL, "
    "amount numeric(12,2) NOT NULL, quantity integer NOT NULL, sku text NOT NULL, "
    "description text NOT NULL, created_at timestamptz NOT NULL, "
    "updated_at timestamptz NOT NULL, version integer NOT NULL"
)
# The row for id ``g``: about 200 bytes on disk. updated_at carries the write time.
ROW_EXPR = (
    "g, mod(g * 7919, 100000)::int, (ARRAY['new','paid','shipped','done'])[1 + mod(g, 4)], "
    "(mod(g, 100000) / 100.0)::numeric(12,2), (1 + mod(g, 10))::int, "
    "'SKU-' || lpad(mod(g, 99991)::text, 8, '0'), "
    "md5(g::text) || md5((g + 1)::text) || left(md5((g + 2)::text), 20), "
    "now(), clock_timestamp(), 1"
)
UPDATE_SET = (
    "status = 'changed', amount = amount + 1, quantity = quantity + 1, "
    "updated_at = clock_timestamp(), version = version + 1"
)
MIX = (("insert", 5), ("update", 4), ("delete", 1))


def ident(table: str) -> sql.Composable:
    """``schema.table`` as a quoted identifier."""
    schema, _, name = table.rpartition(".")
    return sql.Identifier(schema or "public", name)


def create_table(conn: psycopg.Connection[Any], table: str) -> None:
    """(Re)create the benchmark table."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident(table)))
    conn.execute(sql.SQL("CREATE TABLE {} (" + COLUMNS + ")").format(ident(table)))


def bulk_load(conn: psycopg.Connection[Any], table: str, rows: int, start: int = 0) -> float:
    """Insert ids ``start .. start+rows-1`` in one statement; returns seconds taken."""
    t0 = time.perf_counter()
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT " + ROW_EXPR + " FROM generate_series(%s::bigint, %s::bigint) g"
        ).format(ident(table)),
        (start, start + rows - 1),
    )
    conn.execute(sql.SQL("ANALYZE {}").format(ident(table)))
    return time.perf_counter() - t0


def avg_row_bytes(conn: psycopg.Connection[Any], table: str) -> float:
    """Average on-disk size of a row (pg_column_size of the whole row)."""
    row = conn.execute(
        sql.SQL("SELECT avg(pg_column_size(t.*)) FROM (SELECT * FROM {} LIMIT 1000) t").format(
            ident(table)
        )
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def txn_pattern(txn_rows: int) -> list[tuple[int, int, int]]:
    """(inserts, updates, deletes) per transaction, cycled; keeps the 5:4:1 mix exactly."""
    if txn_rows < 10:
        single = [(1, 0, 0)] * 5 + [(0, 1, 0)] * 4 + [(0, 0, 1)]
        if txn_rows == 1:
            return single
        # Small multi-row txns: spread the 10-step cycle over transactions of txn_rows.
        flat = single * txn_rows
        return [
            tuple(map(sum, zip(*flat[i : i + txn_rows], strict=True)))  # type: ignore[misc]
            for i in range(0, len(flat), txn_rows)
        ]
    ni = txn_rows * 5 // 10
    nu = txn_rows * 4 // 10
    return [(ni, nu, txn_rows - ni - nu)]


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
    One ``DO`` block with a ``COMMIT`` per transaction, so Python's speed plays no part.
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
    arr = lambda i: "ARRAY[" + ",".join(str(p[i]) for p in pattern) + "]"  # noqa: E731
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


# --- open-loop generator ------------------------------------------------------------------


@dataclass
class LoadResult:
    """What an open-loop run achieved (versus what it offered)."""

    offered_rate: float
    txn_rows: int
    seconds: float
    changes: int = 0
    txns: int = 0
    deletes: int = 0
    max_behind_s: float = 0.0  # how far the generator fell behind its schedule
    workers: int = 1
    errors: list[str] = field(default_factory=list)

    @property
    def achieved_rate(self) -> float:
        return self.changes / self.seconds if self.seconds else 0.0

    @property
    def kept_up(self) -> bool:
        """Whether the generator delivered (nearly) what it offered."""
        return not self.errors and self.achieved_rate >= 0.95 * self.offered_rate


def _worker(
    dsn: str,
    table: str,
    worker: int,
    workers: int,
    txn_rows: int,
    txn_rate: float,
    seconds: float,
    t0: float,
    id_base: int,
    seed: int,
    out: Any,
) -> None:
    """One generator process: transactions j = worker, worker+workers, ... on schedule."""
    rnd = random.Random(seed * 1000 + worker)
    changes = txns = deletes = 0
    behind = 0.0
    error = ""
    ops = [op for op, _w in MIX]
    weights = [w for _op, w in MIX]
    tbl = ident(table)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            live = [
                r[0]
                for r in conn.execute(
                    sql.SQL("SELECT id FROM {} WHERE id %% %s = %s").format(tbl),
                    (workers, worker),
                )
            ]
            next_id = id_base + worker
            ins1 = sql.SQL("INSERT INTO {} SELECT " + ROW_EXPR + " FROM (SELECT %s::bigint) s(g)")
            insn = sql.SQL("INSERT INTO {} SELECT " + ROW_EXPR + " FROM unnest(%s::bigint[]) g")
            upd1 = sql.SQL("UPDATE {} SET " + UPDATE_SET + " WHERE id = %s")
            updn = sql.SQL("UPDATE {} SET " + UPDATE_SET + " WHERE id = ANY(%s)")
            del1 = sql.SQL("DELETE FROM {} WHERE id = %s")
            deln = sql.SQL("DELETE FROM {} WHERE id = ANY(%s)")
            ins1, insn, upd1, updn, del1, deln = (
                q.format(tbl) for q in (ins1, insn, upd1, updn, del1, deln)
            )
            j = worker
            end = t0 + seconds
            while True:
                due = t0 + j / txn_rate
                if due >= end:
                    break
                now = time.time()
                if due > now:
                    time.sleep(due - now)
                else:
                    behind = max(behind, now - due)
                if txn_rows == 1:
                    op = rnd.choices(ops, weights)[0]
                    if op != "insert" and len(live) < 2:
                        op = "insert"
                    if op == "insert":
                        conn.execute(ins1, (next_id,))
                        live.append(next_id)
                        next_id += workers
                    elif op == "update":
                        conn.execute(upd1, (live[rnd.randrange(len(live))],))
                    else:
                        i = rnd.randrange(len(live))
                        conn.execute(del1, (live[i],))
                        live[i] = live[-1]
                        live.pop()
                        deletes += 1
                    changes += 1
                else:
                    ni, nu, nd = txn_pattern(txn_rows)[0]
                    if len(live) < nu + nd + 1:
                        ni, nu, nd = txn_rows, 0, 0
                    new = [next_id + workers * k for k in range(ni)]
                    next_id += workers * ni
                    upd = rnd.sample(live, nu) if nu else []
                    gone: list[int] = []
                    for _ in range(nd):
                        i = rnd.randrange(len(live))
                        gone.append(live[i])
                        live[i] = live[-1]
                        live.pop()
                    upd = [u for u in upd if u not in set(gone)]
                    with conn.transaction():
                        if new:
                            conn.execute(insn, (new,))
                        if upd:
                            conn.execute(updn, (upd,))
                        if gone:
                            conn.execute(deln, (gone,))
                    live.extend(new)
                    changes += len(new) + len(upd) + len(gone)
                    deletes += len(gone)
                txns += 1
                j += workers
    except Exception as e:  # reported to the parent, which records it
        error = f"worker {worker}: {type(e).__name__}: {e}"
    out.put((changes, txns, deletes, behind, error, time.time()))


class OpenLoopLoad:
    """A fixed-rate mixed load: ``rate`` changes/s in transactions of ``txn_rows``."""

    def __init__(
        self,
        dsn: str,
        table: str,
        rate: float,
        txn_rows: int,
        seconds: float,
        *,
        id_base: int,
        seed: int = 1,
        workers: int | None = None,
    ) -> None:
        self.dsn = dsn
        self.table = table
        self.rate = rate
        self.txn_rows = txn_rows
        self.seconds = seconds
        self.id_base = id_base
        self.seed = seed
        txn_rate = rate / txn_rows
        # About 1,500 single-row txns/s per Python process; fewer processes for big txns.
        self.workers = workers or max(1, min(8, math.ceil(txn_rate / 1500)))
        self._ctx = mp.get_context("spawn")
        self._queue: Any = self._ctx.Queue()
        self._procs: list[Any] = []
        self.t0 = 0.0

    def start(self, delay_s: float = 1.0) -> None:
        """Start the workers; the schedule begins ``delay_s`` from now (spawn takes time)."""
        self.t0 = time.time() + delay_s
        for w in range(self.workers):
            p = self._ctx.Process(
                target=_worker,
                args=(
                    self.dsn,
                    self.table,
                    w,
                    self.workers,
                    self.txn_rows,
                    self.rate / self.txn_rows,
                    self.seconds,
                    self.t0,
                    self.id_base,
                    self.seed,
                    self._queue,
                ),
                daemon=True,
            )
            p.start()
            self._procs.append(p)

    def join(self, timeout_s: float | None = None) -> LoadResult:
        """Wait for the workers and add up what they did."""
        deadline = time.time() + (timeout_s if timeout_s is not None else self.seconds + 120)
        res = LoadResult(self.rate, self.txn_rows, self.seconds, workers=self.workers)
        finished = self.t0 + self.seconds
        for _ in self._procs:
            left = max(0.1, deadline - time.time())
            try:
                changes, txns, deletes, behind, error, done = self._queue.get(timeout=left)
            except Exception as e:
                res.errors.append(f"a worker did not report in time: {type(e).__name__}")
                break
            res.changes += changes
            res.txns += txns
            res.deletes += deletes
            res.max_behind_s = max(res.max_behind_s, behind)
            finished = max(finished, done)
            if error:
                res.errors.append(error)
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        # The schedule overruns its window when the database is slower than offered.
        res.seconds = max(self.seconds, finished - self.t0)
        return res

    def run(self) -> LoadResult:
        """Start, wait, return the result."""
        self.start()
        return self.join()
