"""Replication slots and publications: inspect, create, drop, and decide how a run starts.

The decision (:func:`plan_start`) is pure: it looks at the snapshot mode, the slot as the
server reports it and the reader's durable state (:mod:`cdc.state`), and says what to do. A
slot that vanished after it was streamed from is never recreated silently: the changes between
its last acknowledged position and now are gone, so the reader stops and says how to recover.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc.connection import in_recovery
from cdc.ownership import unowned_slot_message
from cdc.state import Phase, ReaderState
from pgcdc.core.errors import ConfigError, SlotError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import SnapshotMode

log = logging.getLogger(__name__)

# NAMEDATALEN - 1: the server cuts a longer application_name.
_APPLICATION_NAME_MAX = 63


@dataclass(frozen=True)
class SlotInfo:
    """One row of ``pg_replication_slots``."""

    slot_name: str
    plugin: str | None
    database: str | None
    active: bool
    active_pid: int | None
    confirmed_flush_lsn: Lsn | None
    restart_lsn: Lsn | None
    # reserved | extended | unreserved | lost (PostgreSQL 13+); lost: the server removed WAL
    # the slot still needed (max_slot_wal_keep_size), so it can never stream again.
    wal_status: str | None = None
    safe_wal_size: int | None = None  # bytes left before the slot is lost (None: no limit)
    # PostgreSQL 17+ (None before): a failover slot, and (on a standby) a synchronized copy
    # of the primary's; a synchronized copy stays temporary until it is safe to use.
    failover: bool | None = None
    synced: bool | None = None
    temporary: bool = False

    @property
    def lost(self) -> bool:
        return self.wal_status == "lost"


def check_wal_level(conn: psycopg.Connection[Any]) -> None:
    """Stop with one clear error unless the server runs with ``wal_level = logical``."""
    row = conn.execute("SHOW wal_level").fetchone()
    level = row[0] if row else "unknown"
    if level != "logical":
        raise ConfigError(
            f"PostgreSQL has wal_level = {level}, but logical replication needs "
            "wal_level = logical (set it in postgresql.conf and restart the server)"
        )


def _lsn(text: str | None) -> Lsn | None:
    return Lsn.parse(text) if text else None


def slot_info(conn: psycopg.Connection[Any], slot: str) -> SlotInfo | None:
    """The slot as the server sees it, or None if it does not exist."""
    # failover and synced are PostgreSQL 17's: read through to_jsonb to run on any version.
    row = conn.execute(
        "SELECT slot_name, plugin, database, active, active_pid, "
        "confirmed_flush_lsn::text, restart_lsn::text, wal_status, safe_wal_size, "
        "(to_jsonb(s) ->> 'failover')::bool, (to_jsonb(s) ->> 'synced')::bool, temporary "
        "FROM pg_replication_slots s WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    return SlotInfo(
        row[0],
        row[1],
        row[2],
        bool(row[3]),
        row[4],
        _lsn(row[5]),
        _lsn(row[6]),
        row[7],
        None if row[8] is None else int(row[8]),
        row[9],
        row[10],
        bool(row[11]),
    )


def slot_holder(conn: psycopg.Connection[Any], pid: int | None) -> str:
    """Who streams from a slot, from ``pg_stat_replication``: ``process 123 (cdc from
    127.0.0.1, since 2024-05-01 10:00:00+00)``."""
    row = conn.execute(
        "SELECT application_name, host(client_addr), date_trunc('second', backend_start)::text "
        "FROM pg_stat_replication WHERE pid = %s",
        (pid,),
    ).fetchone()
    if row is None:
        return f"process {pid}"
    app, addr, since = row
    return f"process {pid} ({app or 'a client'} from {addr or 'a local socket'}, since {since})"


def reader_name(slot: str) -> str:
    """The ``application_name`` of a reader's own connection to PostgreSQL: ``cdc reader
    <slot>`` (cut to what the server keeps). Another reader of the slot finds it there
    (:func:`other_readers`)."""
    return f"cdc reader {slot}"[:_APPLICATION_NAME_MAX]


def other_readers(conn: psycopg.Connection[Any], slot: str) -> list[str]:
    """The other readers of ``slot`` connected to ``conn``'s database, besides ``conn``:
    ``process 123 (since 2024-05-01 10:00:00+00)``, from ``pg_stat_activity``. A slot of
    that name in another database of the server is another slot, with another
    transactional id (:func:`cdc.committed.transactional_id`). Every role sees another
    session's ``application_name`` and database; its start only in its own role's sessions."""
    rows = conn.execute(
        "SELECT pid, date_trunc('second', backend_start)::text FROM pg_stat_activity "
        "WHERE application_name = %s AND datname = current_database() "
        "AND pid <> pg_backend_pid() ORDER BY pid",
        (reader_name(slot),),
    ).fetchall()
    return [f"process {pid}" + (f" (since {since})" if since else "") for pid, since in rows]


FAILOVER_SLOTS_SINCE = 170000  # server_version_num of PostgreSQL 17


def failover_wanted(conn: psycopg.Connection[Any], setting: bool) -> bool | None:
    """What the slot's ``failover`` property should be: the setting on a PostgreSQL 17+
    primary, None where the property does not exist (before 17) or cannot be set (on a
    standby)."""
    if conn.info.server_version < FAILOVER_SLOTS_SINCE or in_recovery(conn):
        return None
    return setting


def wait_slot_released(
    conn: psycopg.Connection[Any],
    slot: str,
    timeout_s: float = 15.0,
    poll_s: float = 0.1,
    log_after_s: float | None = None,
) -> SlotInfo | None:
    """The slot once no process holds it (or None if it does not exist).

    A walsender notices that its client is gone (closed, or killed with -9) only after a
    moment; until then the slot stays ``active``. Raises SlotError if it is still held after
    ``timeout_s`` (then another reader really is streaming from it). With ``log_after_s``,
    a wait that lasts that long says what it waits for, once.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    said = log_after_s is None
    while True:
        info = slot_info(conn, slot)
        if info is None or not info.active:
            return info
        now = time.monotonic()
        if now >= deadline:
            raise SlotError(
                f"replication slot {slot} is in use by {slot_holder(conn, info.active_pid)}; "
                "is another reader running? Stop it, or give this one its own "
                "postgres.slot_name (CDC_POSTGRES__SLOT_NAME)"
            )
        if not said and log_after_s is not None and now - started >= log_after_s:
            said = True
            log.warning(
                "replication slot %s is in use by %s; waiting up to %.0fs more for it to be "
                "released (a reader stopped a moment ago releases it within seconds)",
                slot,
                slot_holder(conn, info.active_pid),
                deadline - now,
                extra={"slot": slot},
            )
        time.sleep(poll_s)


def drop_slot(conn: psycopg.Connection[Any], slot: str, timeout_s: float = 15.0) -> bool:
    """Drop the slot if it exists, once nobody streams from it; return whether it was dropped.

    Waits (up to ``timeout_s``) for a process that is just releasing it, e.g. our own
    replication connection that was closed a moment ago.
    """
    info = wait_slot_released(conn, slot, timeout_s)
    if info is None:
        return False
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    log.info("dropped replication slot", extra={"slot": slot})
    return True


class Action(enum.Enum):
    """What a run does before streaming."""

    SNAPSHOT = "snapshot"  # create the slot with an exported snapshot, copy the tables, stream
    NEW_SLOT = "new_slot"  # create the slot, stream from its consistent point (no_data)
    STREAM = "stream"  # the slot exists and was streamed from: resume
    ADOPT = "adopt"  # a slot this reader did not create, taken over (postgres.adopt_slot)
    SNAPSHOT_ONLY = "snapshot_only"  # initial_only: copy the tables without a slot, then stop
    NOTHING = "nothing"  # initial_only already done


@dataclass(frozen=True)
class StartPlan:
    action: Action
    drop_existing_slot: bool = False
    reason: str = ""


def _recovery_hint(slot: str, state: ReaderState) -> str:
    return (
        f"replication slot {slot} was used (last acknowledged LSN {state.acked_lsn}) but no "
        "longer exists, so changes after that position are lost. To recover, take a new "
        "snapshot: rerun with CDC_POSTGRES__SNAPSHOT_MODE=when_needed (or `cdc run "
        "--snapshot-mode when_needed`), or run `cdc reset-state` and start again"
    )


def lost_slot_error(slot: str, info: SlotInfo, state: ReaderState | None) -> SlotError:
    """The one line for a slot the server invalidated (``wal_status = lost``), with the ways
    out. The slot is left alone: dropping it is the user's decision."""
    acked = state.acked_lsn if state is not None and state.acked_lsn else info.confirmed_flush_lsn
    return SlotError(
        f"replication slot {slot} is lost (wal_status = lost): the server removed WAL it "
        f"still needed (max_slot_wal_keep_size), so changes after LSN {acked} can no longer "
        "be streamed. To recover with a new snapshot: rerun with --snapshot-mode when_needed "
        "(CDC_POSTGRES__SNAPSHOT_MODE=when_needed; it drops this slot and snapshots again), or "
        "run `cdc reset-state --drop-slot` and start again; to avoid it, raise "
        "max_slot_wal_keep_size or keep the reader running"
    )


def _generic_unowned(info: SlotInfo) -> str:
    return unowned_slot_message(info.slot_name, "this prefix", [], None, info.lost)


def plan_start(
    mode: SnapshotMode,
    slot: str,
    info: SlotInfo | None,
    state: ReaderState | None,
    *,
    adopt: bool = False,
    unowned: Callable[[SlotInfo], str] = _generic_unowned,
) -> StartPlan:
    """Decide how a run starts. Raises SlotError when starting would silently lose data, or
    would drop, recreate or advance a slot this reader cannot prove it created (a state
    record under this prefix claims it; ``unowned`` words the refusal, ``adopt`` takes the
    slot over instead)."""
    phase = state.phase if state else None
    if mode is SnapshotMode.INITIAL_ONLY:
        if phase is Phase.SNAPSHOT_ONLY_DONE:
            return StartPlan(Action.NOTHING, reason="initial_only snapshot already taken")
        return StartPlan(Action.SNAPSHOT_ONLY)
    if info is not None:
        if info.plugin != "pgoutput":
            raise SlotError(f"replication slot {slot} uses plugin {info.plugin}, not pgoutput")
        if info.active:
            raise SlotError(
                f"replication slot {slot} is in use by process {info.active_pid}; "
                "is another reader running?"
            )
        if phase not in (Phase.SNAPSHOT, Phase.STREAMING):
            if adopt and not info.lost:
                how = (
                    "without a snapshot (no_data)"
                    if mode is SnapshotMode.NO_DATA
                    else "and snapshots every captured table incrementally while streaming"
                )
                return StartPlan(
                    Action.ADOPT,
                    reason=f"adopting replication slot {slot} (postgres.adopt_slot): the reader "
                    f"streams from its position {info.confirmed_flush_lsn} {how}",
                )
            raise SlotError(unowned(info))
        if (
            phase is Phase.SNAPSHOT
            and state is not None
            and state.consistent_point is not None
            and info.confirmed_flush_lsn != state.consistent_point
        ):
            # Ours was created at consistent_point and never streamed from: not this one.
            raise SlotError(
                f"replication slot {slot} is not the one this reader created (at LSN "
                f"{state.consistent_point}; this one stands at {info.confirmed_flush_lsn}), "
                "so the reader leaves it as it is. Give this reader its own slot: "
                "postgres.slot_name (CDC_POSTGRES__SLOT_NAME), or, if nobody uses this one, "
                f"drop it yourself: SELECT pg_drop_replication_slot('{slot}')"
            )
        if info.lost and (phase is Phase.STREAMING or mode is SnapshotMode.NO_DATA):
            if mode is SnapshotMode.WHEN_NEEDED:
                return StartPlan(
                    Action.SNAPSHOT,
                    drop_existing_slot=True,
                    reason=f"slot {slot} is lost (wal_status = lost); dropping it and taking "
                    "a new snapshot (when_needed)",
                )
            raise lost_slot_error(slot, info, state)
        if phase is Phase.STREAMING or mode is SnapshotMode.NO_DATA:
            return StartPlan(Action.STREAM)
        # This reader's slot, whose snapshot never completed: its exported snapshot is gone,
        # so the only clean way is to start over with a new slot and a new snapshot.
        return StartPlan(
            Action.SNAPSHOT,
            drop_existing_slot=True,
            reason="the previous snapshot did not complete; starting it over",
        )
    if phase is Phase.STREAMING:
        assert state is not None
        if mode is SnapshotMode.WHEN_NEEDED:
            return StartPlan(
                Action.SNAPSHOT, reason=f"slot {slot} is gone; taking a new snapshot (when_needed)"
            )
        raise SlotError(_recovery_hint(slot, state))
    if mode is SnapshotMode.NO_DATA:
        return StartPlan(Action.NEW_SLOT)
    return StartPlan(Action.SNAPSHOT)
