"""The benchmark's table and its open-loop mix: 50% inserts, 40% updates, 10% deletes.

The table is shaped like a typical OLTP row: 10 columns, about 200 bytes. Filled in one
statement by :func:`bulk_load` (for snapshots); changed by :class:`OrdersMix` (the open-loop
generator, :mod:`benchmarks.workload.open_loop`) and server-side by
:func:`benchmarks.workload.backlog.write_backlog`.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.workload.engine import ident
from benchmarks.workload.keys import LiveKeys

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
_OPS = [op for op, _w in MIX]
_WEIGHTS = [w for _op, w in MIX]


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


class OrdersMix:
    """One open-loop worker's transactions of ``txn_rows`` rows on the benchmark table.

    Worker ``w`` of ``n`` owns the ids ``≡ w (mod n)``: it never waits on another's row
    locks, and inserts new ids from ``id_base + w`` up in steps of ``n``. Single-row
    transactions pick an operation by the 5:4:1 weights; larger ones follow
    :func:`txn_pattern`.

    ``durable``: commits wait for the WAL flush (``synchronous_commit = on``, PostgreSQL's
    default). Without it a commit returns at once and its WAL reaches a logical reader only
    when the WAL writer flushes it, every ``wal_writer_delay`` (200 ms by default): that
    wait, up to 200 ms, would count in every commit→Kafka figure, whatever the reader.
    """

    def __init__(
        self,
        table: str,
        txn_rows: int,
        id_base: int,
        worker: int,
        workers: int,
        *,
        durable: bool = False,
    ) -> None:
        self.durable = durable
        self.one_statement = txn_rows == 1
        self.txn_rows = txn_rows
        self.pattern = txn_pattern(txn_rows)[0]
        self.worker = worker
        self.workers = workers
        self.next_id = id_base + worker
        self.live: LiveKeys[int] = LiveKeys()
        tbl = ident(table)
        row = "INSERT INTO {} SELECT " + ROW_EXPR
        self.ins1 = sql.SQL(row + " FROM (SELECT %s::bigint) s(g)").format(tbl)
        self.insn = sql.SQL(row + " FROM unnest(%s::bigint[]) g").format(tbl)
        self.upd1 = sql.SQL("UPDATE {} SET " + UPDATE_SET + " WHERE id = %s").format(tbl)
        self.updn = sql.SQL("UPDATE {} SET " + UPDATE_SET + " WHERE id = ANY(%s)").format(tbl)
        self.del1 = sql.SQL("DELETE FROM {} WHERE id = %s").format(tbl)
        self.deln = sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(tbl)
        self.select_own = sql.SQL("SELECT id FROM {} WHERE id %% %s = %s").format(tbl)

    def prepare(self, conn: psycopg.Connection[Any]) -> None:
        """This worker's existing rows; unless ``durable``, commits do not wait for the WAL
        flush (the generator reaches higher rates)."""
        conn.execute(f"SET synchronous_commit = {'on' if self.durable else 'off'}")
        for (key,) in conn.execute(self.select_own, (self.workers, self.worker)):
            self.live.add(key)

    def committed(self, at: float) -> None:
        """Nothing to record: the counts are the whole result."""

    def write(self, conn: psycopg.Connection[Any], rnd: random.Random) -> Counter[str]:
        """One transaction: a single random operation, or a multi-row pattern."""
        return self._single(conn, rnd) if self.txn_rows == 1 else self._multi(conn, rnd)

    def _new_ids(self, n: int) -> list[int]:
        new = [self.next_id + self.workers * k for k in range(n)]
        self.next_id += self.workers * n
        return new

    def _single(self, conn: psycopg.Connection[Any], rnd: random.Random) -> Counter[str]:
        op = rnd.choices(_OPS, _WEIGHTS)[0]
        if op != "insert" and len(self.live) < 2:
            op = "insert"
        if op == "insert":
            (key,) = self._new_ids(1)
            conn.execute(self.ins1, (key,))
            self.live.add(key)
        elif op == "update":
            conn.execute(self.upd1, (self.live.pick(rnd),))
        else:
            conn.execute(self.del1, (self.live.take(rnd),))
        return Counter({op: 1})

    def _multi(self, conn: psycopg.Connection[Any], rnd: random.Random) -> Counter[str]:
        ni, nu, nd = self.pattern
        if len(self.live) < nu + nd + 1:
            ni, nu, nd = self.txn_rows, 0, 0
        new = self._new_ids(ni)
        upd = self.live.sample(rnd, nu) if nu else []
        gone = [self.live.take(rnd) for _ in range(nd)]
        upd = [u for u in upd if u not in set(gone)]
        if new:
            conn.execute(self.insn, (new,))
        if upd:
            conn.execute(self.updn, (upd,))
        if gone:
            conn.execute(self.deln, (gone,))
        for key in new:
            self.live.add(key)
        return Counter(insert=len(new), update=len(upd), delete=len(gone))
