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
follower, which ``--remove-extra`` does as an explicit, follower-only repair
(:func:`remove_extra`). Above :data:`MOST_KEYS` keys, or when the table's key types cannot be named by
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


@dataclass(frozen=True)
class Removed:
    """What ``--remove-extra`` did to one table's extra keys in one follower."""

    table: str
    follower: str
    removed: list[str]
    kept: list[str]  # no longer extra when looked at again, or written since: left alone


class Removal(Protocol):
    """A follower's compare-and-delete (:class:`pgcdc.verify.followers.CacheRemoval`,
    :class:`~pgcdc.verify.followers.SearchRemoval`)."""

    def held(self, table: str, keys: Collection[str]) -> dict[str, tuple[int | None, object]]:
        """Each key the follower still holds a row for: its version (commit LSN, None: none)
        and a token for :meth:`remove_if`."""
        ...

    def remove_if(self, table: str, key: str, token: object) -> bool:
        """Delete the key's row if nothing was written to it since ``token`` was read."""
        ...


class ExtraFound(Protocol):
    table: str
    follower: str
    extra: list[str]


def remove_extra(
    leader: PostgresLeader, removals: Mapping[str, Removal], results: Sequence[ExtraFound]
) -> list[Removed]:
    """``--remove-extra``: delete from each follower the rows PostgreSQL does not hold.

    Per table and follower, the extra keys are looked at again, in this order: the
    follower's rows and versions first, then PostgreSQL in a fresh snapshot (fence LSN
    ``L``), so that a change the follower already holds is visible to that snapshot. A key
    is removed only if PostgreSQL has no row for it, the follower's version is not above
    ``L`` (else the key changed since: not drift), and nothing was written to it in the
    follower since it was read (compare-and-delete). The version the follower keeps beside
    the row stays, so an older change still in flight cannot bring the row back, while a
    newer one (a row inserted after ``L``) is applied as usual. Not through the log: the
    topics hold no live row for these keys (PostgreSQL has none), so a follower built from
    them later does not hold them either."""
    done: list[Removed] = []
    for r in results:
        if not r.extra or r.follower not in removals:
            continue
        removal = removals[r.follower]
        held = removal.held(r.table, r.extra)
        if not held:  # every row gone from the follower since: nothing to look up
            done.append(Removed(r.table, r.follower, [], sorted(r.extra)))
            continue
        snap = leader.read(r.table, list(held))
        removed, kept = [], sorted(set(r.extra) - set(held))
        for key, (version, token) in sorted(held.items()):
            changed = version is not None and version > snap.lsn
            if key in snap.rows or changed or not removal.remove_if(r.table, key, token):
                kept.append(key)
            else:
                removed.append(key)
        done.append(Removed(r.table, r.follower, removed, sorted(kept)))
    return done


def removed_text(done: Sequence[Removed]) -> str:
    """What ``--remove-extra`` did, for people."""
    lines = []
    for r in done:
        line = f"remove-extra: {r.table} in the {r.follower} follower: {len(r.removed)} removed"
        if r.kept:
            line += (
                f", {len(r.kept)} left alone (PostgreSQL holds them now, or they were written "
                f"since), e.g. {r.kept[0]}"
            )
        lines.append(line)
    return "\n".join(lines) + ("\n" if lines else "")


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
            "again; --remove-extra deletes them from the follower"
        )
    if repairs:
        lines.append(
            "repair: the followers apply the rows once the reader has read them; run cdc "
            "verify again to see"
        )
    return "\n".join(lines) + ("\n" if lines else "")
