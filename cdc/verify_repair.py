"""``cdc verify --repair``: the keys a follower lacks or holds differently, sent through the log
again, so that Kafka stays the source of truth and a follower built later from the
compacted topics is right too.

For each table with missing or differing keys (in any follower), the reader is asked for an
incremental snapshot of those rows only (``cdc snapshot``'s signal: signed, written into the
WAL, its ``--where`` checked by PostgreSQL's parser and catalog before it is sent and again
by the reader, :mod:`cdc.incremental.filters`). The filter names the rows by their key
values as PostgreSQL reads them now, each a quoted literal (``("id") IN ('3', '5')``): no
text read from a follower reaches it, only the document ids it gave, matched against the
table. The snapshot's rows are published as op ``r`` with versions newer than anything the
follower held, so every follower applies them; a follower that already held the row skips
it as a repeat.

Not repaired through the log: *extra* keys (a follower holds a row PostgreSQL does not;
there is no row to publish again); they are listed, and stay drift until removed from the
follower. Above :data:`MOST_KEYS` keys, or when the table's key types cannot be named by
literals in a filter the reader accepts (an input function that is not immutable, e.g.
``timestamptz``), the whole table is snapshotted instead.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from psycopg import sql

from cdc.connection import connect
from cdc.verify_leader import PostgresLeader
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import Settings

MOST_KEYS = 1_000  # keys a filter names at most; above, the whole table is snapshotted


@dataclass(frozen=True)
class Repair:
    """One snapshot asked of the reader."""

    table: str
    keys: int  # the keys it was for (missing or differing in some follower)
    whole_table: bool  # the filter named no keys: the whole table is read again
    signal_id: str
    lsn: str
    why_whole: str | None = None  # why the whole table (None: by key)


class Found(Protocol):
    """What one table's verification against one follower found (as
    :class:`pgcdc.verify.run.TableResult` holds it)."""

    table: str
    missing: list[str]
    differ: list[str]


def keys_to_repair(results: Sequence[Found]) -> dict[str, set[str]]:
    """Per table, the document ids missing or differing in any follower's result."""
    out: dict[str, set[str]] = {}
    for r in results:
        keys = {*r.missing, *r.differ}
        if keys:
            out.setdefault(r.table, set()).update(keys)
    return out


def key_filter(columns: Sequence[str], rows: Collection[Sequence[str | None]]) -> sql.Composed:
    """``("a", "b") IN (('1', 'x'), …)``: the rows named by their key columns' text, each a
    quoted literal PostgreSQL reads with the column's own input function."""

    def one(values: Sequence[str | None]) -> sql.Composable:
        lits = sql.SQL(", ").join(sql.Literal(v) for v in values)
        return sql.SQL("({})").format(lits)

    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    listed = sql.SQL(", ").join(one(v) for v in sorted(rows, key=lambda v: [x or "" for x in v]))
    return sql.SQL("({}) IN ({})").format(cols, listed)


def repair(
    settings: Settings, leader: PostgresLeader, wanted: Mapping[str, Collection[str]]
) -> list[Repair]:
    """Ask the reader to publish again the rows of ``wanted`` (table id → document ids);
    what was sent, one snapshot signal per table."""
    from cdc.incremental.send import send_snapshot_signal

    done: list[Repair] = []
    dsn = settings.postgres.dsn.get_secret_value()
    for table, ids in sorted(wanted.items()):
        columns, rows = leader.key_values(table, ids)
        where: str | None = None
        why: str | None = None
        if not rows:
            continue  # every key is gone from PostgreSQL since: nothing to publish
        if len(rows) > MOST_KEYS:
            why = f"{len(rows)} keys, over {MOST_KEYS}"
        else:
            with connect(dsn) as conn:
                where = key_filter(columns, rows).as_string(conn)
        try:
            sent = send_snapshot_signal(settings.postgres, [table], where, False)
        except ConfigError as e:
            if where is None:
                raise
            # The reader would refuse this filter too (say a key type whose input function
            # is not immutable): the whole table, then.
            why = f"the key filter was refused ({e})"
            where = None
            sent = send_snapshot_signal(settings.postgres, [table], None, False)
        done.append(Repair(table, len(rows), where is None, sent.signal_id, str(sent.lsn), why))
    return done


def repairs_text(repairs: Sequence[Repair], extra: int) -> str:
    """What ``--repair`` did, for people."""
    lines = []
    for r in repairs:
        what = "the whole table" if r.whole_table else f"{r.keys} key(s)"
        because = f" ({r.why_whole})" if r.why_whole else ""
        lines.append(
            f"repair: snapshot signal {r.signal_id} for {r.table}, {what}{because}, written at "
            f"LSN {r.lsn}"
        )
    if extra:
        lines.append(
            f"repair: {extra} extra key(s) not repaired: PostgreSQL holds no row to publish "
            "again; remove them from the follower"
        )
    if repairs:
        lines.append(
            "repair: the followers apply the rows once the reader has read them; run cdc "
            "verify again to see"
        )
    return "\n".join(lines) + ("\n" if lines else "")
