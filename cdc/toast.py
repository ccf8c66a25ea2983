"""Unchanged TOAST values in the new row of an UPDATE: fill them in where that is safe.

pgoutput leaves a TOASTed column that an UPDATE did not touch out of the new tuple (the
``UNCHANGED_TOAST`` marker). For a plain update a follower keeps the value it holds. For a
primary-key change the reader emits a create event for the NEW key, which no follower has
held: the marker there would lose the value. So:

* under REPLICA IDENTITY FULL the old tuple is the whole old row, and an unchanged column's
  new value IS its old value: :func:`fill_from_old` is exact;
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

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from cdc.values import UNCHANGED_TOAST, RawValue
from schemas.model import TableSchema


def unchanged_columns(row: Sequence[RawValue]) -> list[int]:
    """Positions of the columns whose value pgoutput left out (unchanged TOAST)."""
    return [i for i, v in enumerate(row) if v is UNCHANGED_TOAST]


def fill_from_old(new: Sequence[RawValue], old: Sequence[RawValue]) -> tuple[RawValue, ...]:
    """The new row with each unchanged TOAST value taken from the full old row."""
    if len(new) != len(old):
        raise ValueError(f"old row has {len(old)} columns, new row {len(new)}")
    return tuple(o if n is UNCHANGED_TOAST else n for n, o in zip(new, old, strict=True))


def fetch_current(
    conn: psycopg.Connection[Any],
    table: TableSchema,
    row: Sequence[RawValue],
    positions: Sequence[int],
) -> tuple[RawValue, ...]:
    """``row`` with the columns at ``positions`` read from the table by ``row``'s key.

    Values are read as text, the form pgoutput sends. Returns ``row`` unchanged when the table
    has no key or the row no longer exists.
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
    if found is None:
        return tuple(row)
    out = list(row)
    for i, value in zip(positions, found, strict=True):
        out[i] = value
    return tuple(out)
