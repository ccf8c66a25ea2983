"""Unchanged TOAST values in the new row of an UPDATE: fill them in where that is safe.

pgoutput leaves a TOASTed column that an UPDATE did not touch out of the new tuple (the
``UNCHANGED_TOAST`` marker). For a plain update a follower keeps the value it holds. For a
primary-key change the reader emits a create event for the NEW key, which no follower has
held: the marker there would lose the value. So:

* under REPLICA IDENTITY FULL the old tuple is the whole old row, and an unchanged column's
  new value IS its old value: :func:`fill_from_old` is exact; so it is for a TOASTed key
  column, whose old value the server sends (the old key) when it is left unchanged;
* otherwise :func:`fetch_current` reads the columns' current values by the new key over the
  reader's ordinary connection. With ``postgres.complete_unchanged_toast`` (the default) it
  does so for plain updates too: a compacted topic keeps only each key's newest event, and a
  follower rebuilt from it must find the whole row there. The value read may be newer than the event (a later
  transaction may have changed it already). That is safe for followers: any later change
  has its own event with a higher version (commit LSN), which is applied after this one or
  wins over it, so they converge to the database. If the row is gone (deleted since), the
  marker stays; the later delete event removes the row anyway.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgcdc.core.errors import DecodeError
from pgcdc.core.values import UNCHANGED_TOAST, RawValue
from schemas.model import TableSchema


def unchanged_columns(row: Sequence[RawValue]) -> list[int]:
    """Positions of the columns whose value pgoutput left out (unchanged TOAST)."""
    return [i for i, v in enumerate(row) if v is UNCHANGED_TOAST]


def fill_from_old(new: Sequence[RawValue], old: Sequence[RawValue]) -> tuple[RawValue, ...]:
    """The new row with each unchanged TOAST value taken from the old row where it has one.

    The old row is whole under REPLICA IDENTITY FULL, and is the replica identity's columns
    otherwise (others None), which the server sends when they hold a TOASTed value: so an
    unchanged TOASTed key always gets its value back.
    """
    if len(new) != len(old):
        raise ValueError(f"old row has {len(old)} columns, new row {len(new)}")
    return tuple(
        o if n is UNCHANGED_TOAST and o is not None and o is not UNCHANGED_TOAST else n
        for n, o in zip(new, old, strict=True)
    )


def require_key(table: TableSchema, row: Sequence[RawValue]) -> None:
    """Raise unless every key column of ``row`` has its value: a key column with the
    placeholder would key another row (the server sends the old key when a key column
    holds a TOASTed value, so this does not happen on PostgreSQL 11 and later)."""
    names = [c.name for c in table.columns]
    missing = [k for k in table.key_columns if row[names.index(k)] is UNCHANGED_TOAST]
    if missing:
        raise DecodeError(
            f"table {table.schema}.{table.table}: an UPDATE left key column(s) "
            f"{', '.join(missing)} out (unchanged TOAST) and sent no old key to take them "
            "from; run ALTER TABLE ... REPLICA IDENTITY FULL on it"
        )


_IN_PROGRESS = sql.SQL(
    "SELECT %s::text IN (SELECT xid(x)::text FROM pg_snapshot_xip(pg_current_snapshot()) x)"
    " OR %s::text::bigint >= (xid(pg_snapshot_xmax(pg_current_snapshot()))::text)::bigint"
)


def _wait_visible(conn: psycopg.Connection[Any], xid: int, timeout_s: float) -> bool:
    """Wait until transaction ``xid`` is not in progress for a new snapshot; False if it
    still was when ``timeout_s`` ran out."""
    deadline = time.monotonic() + timeout_s
    while True:
        row = conn.execute(_IN_PROGRESS, (str(xid), str(xid))).fetchone()
        if not (row and row[0]):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def fetch_current(
    conn: psycopg.Connection[Any],
    table: TableSchema,
    row: Sequence[RawValue],
    positions: Sequence[int],
    xid: int | None = None,
    visible_within_s: float = 10.0,
) -> tuple[RawValue, ...]:
    """``row`` with the columns at ``positions`` read from the table by ``row``'s key.

    Values are read as text, the form pgoutput sends. Returns ``row`` unchanged when the table
    has no key or the row no longer exists.

    ``xid`` is the transaction that wrote ``row``. A walsender may send a commit a moment
    before the transaction is visible to other sessions' snapshots; if the row is not found,
    we wait (up to ``visible_within_s``) until the transaction is no longer in progress for
    a new snapshot and read once more, so "not found" really means "gone since". The second
    read happens whether or not we had to wait: the first may have run a moment before the
    transaction became visible, and the look after it a moment after.
    """
    if not positions or not table.key_columns:
        return tuple(row)
    names = [c.name for c in table.columns]
    key_values = [row[names.index(k)] for k in table.key_columns]
    if any(v is UNCHANGED_TOAST for v in key_values):
        return tuple(row)  # a key is never TOASTed-and-unchanged in a key change; be safe
    query = sql.SQL("SELECT {} FROM {} WHERE {}").format(
        sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(names[i])) for i in positions),
        sql.Identifier(table.schema, table.table),
        sql.SQL(" AND ").join(
            # The key arrives as text; the server casts it to the column's type.
            sql.SQL("{} = {}").format(sql.Identifier(k), sql.Placeholder())
            for k in table.key_columns
        ),
    )
    found = conn.execute(query, key_values).fetchone()
    if found is None and xid is not None:
        # Read again once the transaction is visible, even if it already is when we look:
        # it may have become visible between the first read and that look.
        _wait_visible(conn, xid, visible_within_s)
        found = conn.execute(query, key_values).fetchone()
    if found is None:
        return tuple(row)
    out = list(row)
    for i, value in zip(positions, found, strict=True):
        out[i] = value
    return tuple(out)
