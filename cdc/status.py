"""``cdc status``: where the reader stands, read from PostgreSQL and Kafka.

Besides the figures it lists ``warnings``: a lost slot, or one that retains more WAL than
``postgres.retained_wal_warn_bytes`` (a stopped reader makes the server keep WAL until its
disk fills). No DSN or password is ever part of it.

The reader knows only its own part (slot, state, topics). The entry point that calls
:func:`gather_status` passes any further sections (e.g. the followers' watermarks): each is
a function of the settings that returns a JSON-able mapping.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

import psycopg
from confluent_kafka import KafkaException, TopicPartition

from cdc.connection import connect, current_database, current_wal_lsn, parse_dsn
from cdc.incremental import load_snapshots
from cdc.kafka_clients import cluster_metadata, consumer, offset_bounds, read_to_end
from cdc.slots import slot_info
from cdc.state import StateStore
from cdc.topic_ids import describe_loss, lost_topics, topic_ids
from pgcdc.core.durations import duration
from pgcdc.core.errors import CdcError, ConfigError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import Settings
from pgcdc.core.verify_record import Outcome, VerifyPass

StatusSection = Callable[[Settings], dict[str, Any]]


def slot_status(settings: Settings) -> dict[str, Any]:
    """The slot: active, WAL status, confirmed flush LSN, retained WAL and lag in bytes."""
    with connect(settings.postgres.dsn.get_secret_value()) as conn:
        current = current_wal_lsn(conn)
        database = current_database(conn)
        info = slot_info(conn, settings.postgres.slot_name)
        lag_seconds = _replay_lag_seconds(conn, info.active_pid) if info is not None else None
    out: dict[str, Any] = {
        "database": database,
        "slot": settings.postgres.slot_name,
        "exists": info is not None,
        "server_wal_lsn": str(current),
    }
    if info is not None:
        out.update(
            active=info.active,
            active_pid=info.active_pid,
            wal_status=info.wal_status,
            safe_wal_size=info.safe_wal_size,
            confirmed_flush_lsn=str(info.confirmed_flush_lsn) if info.confirmed_flush_lsn else None,
            restart_lsn=str(info.restart_lsn) if info.restart_lsn else None,
            retained_wal_bytes=(current - info.restart_lsn) if info.restart_lsn else None,
            lag_bytes=(current - info.confirmed_flush_lsn) if info.confirmed_flush_lsn else None,
            lag_seconds=lag_seconds,
        )
    return out


def _replay_lag_seconds(conn: psycopg.Connection[Any], active_pid: int | None) -> float | None:
    """Seconds the reader's acknowledgments trail the server (``pg_stat_replication``).

    ``replay_lag`` is how long ago the WAL the reader last acknowledged was written, measured
    by the server; it is NULL once the reader has caught up and stays idle, which is 0 here.
    None when no reader holds the slot (nothing measures it then).
    """
    if active_pid is None:
        return None
    row = conn.execute(
        "SELECT EXTRACT(EPOCH FROM replay_lag)::float8 FROM pg_stat_replication WHERE pid = %s",
        (active_pid,),
    ).fetchone()
    if row is None:
        return None
    return 0.0 if row[0] is None else round(float(row[0]), 3)


def slot_warnings(slot: dict[str, Any], retained_wal_warn_bytes: int) -> list[str]:
    """What an operator must know about the slot (from :func:`slot_status`), one line each."""
    name = slot["slot"]
    if not slot["exists"]:
        return []
    out: list[str] = []
    if slot.get("wal_status") == "lost":
        out.append(
            f"replication slot {name} is lost (wal_status = lost): it can no longer stream; "
            "`cdc run --snapshot-mode when_needed` drops it and takes a new snapshot"
        )
    retained = slot.get("retained_wal_bytes")
    if retained is not None and retained > retained_wal_warn_bytes:
        out.append(
            f"replication slot {name} retains {_size(retained)} of WAL (more than "
            f"postgres.retained_wal_warn_bytes = {_size(retained_wal_warn_bytes)}): the server "
            "keeps it on disk until the reader acknowledges it; is the reader running?"
        )
    if slot.get("wal_status") == "unreserved":
        out.append(
            f"replication slot {name} is about to be lost (wal_status = unreserved): the "
            "server may remove WAL it still needs at the next checkpoint"
        )
    return out


def problems(
    status: Mapping[str, Any], retained_wal_warn_bytes: int, watermark_stale_s: float = 60.0
) -> list[str]:
    """What makes the reader unhealthy (``cdc status`` exits 3 when any), one line each.

    A server that cannot be read (PostgreSQL, Kafka); a missing or lost slot; an inactive slot
    that retains more WAL than the threshold (the reader is down and the server's disk fills);
    a follower whose store cannot be read, or whose watermark is stale
    (:func:`stale_follower`); drift found by ``cdc verify``'s last pass
    (:func:`verify_drift`); a table topic that lost what it held, until the reader's
    snapshot of its table into it is done; a table whose search index refuses some of its
    columns as they are now (a type change the index's mapping cannot take).
    """
    slot = status["slot"]
    name = slot["slot"]
    out: list[str] = list((status.get("errors") or {}).values())  # each names its server
    if slot.get("exists") is False:
        out.append(f"replication slot {name} does not exist (has the reader ever run?)")
    elif slot.get("wal_status") == "lost":
        out.append(f"replication slot {name} is lost")
    elif not slot.get("active") and (slot.get("retained_wal_bytes") or 0) > retained_wal_warn_bytes:
        out.append(
            f"replication slot {name} is inactive and retains "
            f"{_size(slot['retained_wal_bytes'])} of WAL"
        )
    for loss in status.get("lost_topics") or []:
        out.append(f"{loss}: the reader snapshots its table again when it runs (cdc run)")
    for snap in status.get("snapshots") or []:
        if snap.get("via") == "topic_lost":
            out.append(
                f"{snap['schema']}.{snap['table']} is being snapshotted again after its topic was lost "
                f"({snap.get('rows', 0)} rows so far): its topic does not hold the table yet"
            )
    drift = verify_drift(status.get("verify"))
    if drift:
        out.append(drift)
    acked = (status.get("state") or {}).get("last_commit_lsn")
    for job, follower in (status.get("followers") or {}).items():
        if "error" in follower:
            out.append(f"follower {job}: {follower['error']}")
            continue
        stale = stale_follower(follower, acked, watermark_stale_s)
        if stale:
            out.append(f"follower {job}: {stale}")
        for refused in follower.get("refused_tables") or []:
            if "switch" in refused:
                out.append(
                    f"follower {job}: index {refused['index']} cannot switch to version "
                    f"{refused['version']} ({refused['switch']}), which holds every document "
                    f"({refused['reason']}); searches read the version before it, which no "
                    "longer follows its table (docs/schema-changes.md)"
                )
                continue
            out.append(
                f"follower {job}: index {refused['index']} no longer follows table "
                f"{refused['table']}: {refused['columns']}; its changes are refused and "
                "dead-lettered until the index is built again (docs/schema-changes.md)"
            )
    return out


def verify_section(record: VerifyPass | None, now: float) -> dict[str, Any] | None:
    """``cdc verify``'s last pass as ``cdc status`` shows it (None: no pass recorded), with
    how long ago it finished."""
    if record is None:
        return None
    return {**record.to_dict(), "age_s": round(max(0.0, now - record.finished_at), 1)}


def _last_pass(verify: Mapping[str, Any]) -> str:
    every = verify.get("every_s")
    run = f"pass {verify.get('number', 1)} of cdc verify --every" if every else "cdc verify"
    return f"the last {run} (finished {duration(verify.get('age_s') or 0.0)} ago)"


def verify_drift(verify: Mapping[str, Any] | None) -> str | None:
    """A problem when ``cdc verify``'s last pass found drift (``cdc status`` exits 3, as for
    a follower behind): a follower that differs from PostgreSQL is not healthy."""
    if not verify or verify.get("outcome") != Outcome.DRIFT:
        return None
    found = [
        f"{c['table']} on {c['follower']} ("
        + ", ".join(f"{k} {c[k]}" for k in ("missing", "extra", "differ") if c.get(k))
        + ")"
        for c in verify.get("checks") or []
        if c.get("outcome") == Outcome.DRIFT
    ]
    return (
        f"{_last_pass(verify)} found drift: {'; '.join(found)}; `cdc verify --repair` "
        "publishes the missing and differing rows again (docs/verify.md)"
    )


def verify_warnings(verify: Mapping[str, Any] | None) -> list[str]:
    """A last pass that failed, or left keys unsettled, judged nothing: a warning, not a
    problem."""
    if not verify:
        return []
    if verify.get("outcome") == Outcome.FAILED:
        return [f"{_last_pass(verify)} failed: {verify.get('error')}"]
    if verify.get("outcome") == Outcome.UNSETTLED:
        keys = sum(int(c.get("unsettled") or 0) for c in verify.get("checks") or [])
        return [f"{_last_pass(verify)} left {keys} key(s) unsettled: they kept changing"]
    return []


def stale_follower(
    follower: Mapping[str, Any], last_commit_lsn: str | None, watermark_stale_s: float
) -> str | None:
    """Why a follower is stale, if it is: its watermark has not advanced for more than
    ``watermark_stale_s`` while the reader has acknowledged a commit past it (changes wait
    in Kafka for a job that is stopped or stuck). An idle database has no such commit, so a
    quiet follower of it is not stale; an unknown age or position judges nothing (nor do a
    first snapshot's rows before the reader's first streamed commit: the state keeps no
    position for them once streaming, and its acknowledged LSN also moves with other
    databases' WAL, which would make an idle database's follower look stale)."""
    age, mark = follower.get("watermark_age_s"), follower.get("watermark")
    if age is None or mark is None or last_commit_lsn is None or age <= watermark_stale_s:
        return None
    if Lsn.parse(last_commit_lsn) <= Lsn.parse(mark):
        return None
    return (
        f"watermark {mark} has not advanced for {duration(age)} (more than "
        f"spark.watermark_stale_s = {watermark_stale_s:g}s) while the reader acknowledged "
        f"changes up to {last_commit_lsn}; is the job running?"
    )


def _size(n: int) -> str:
    """Bytes in the largest binary unit that keeps a whole number in front."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def topic_status(settings: Settings) -> dict[str, dict[str, int]]:
    """End offsets of every partition of the reader's topics: {topic: {partition: offset}}."""
    prefix = settings.kafka.topic_prefix + "."
    reader = consumer(settings.kafka, "cdc-status")
    try:
        md = cluster_metadata(reader, settings.kafka.bootstrap_servers, timeout_s=5)
        out: dict[str, dict[str, int]] = {}
        for name in sorted(md.topics):
            if not name.startswith(prefix):
                continue
            ends: dict[str, int] = {}
            for p in sorted(md.topics[name].partitions):
                _low, high = offset_bounds(reader, TopicPartition(name, p), timeout_s=5)
                ends[str(p)] = high
            out[name] = ends
        return out
    finally:
        reader.close()


def dead_letter_counts(settings: Settings, timeout_s: float = 30.0) -> dict[str, int]:
    """Letters on ``kafka.dead_letter_topic`` by the job that wrote them (each sync job, and
    ``cdc-reader`` for records Kafka refused): a follower's watermark passes a change it
    dead-lettered, so the two are shown side by side."""
    topic = settings.kafka.dead_letter_topic
    reader = consumer(settings.kafka, "cdc-status", **{"enable.partition.eof": True})
    try:
        md = cluster_metadata(reader, settings.kafka.bootstrap_servers, timeout_s=5)
        if topic not in md.topics:
            return {}
        counts: collections.Counter[str] = collections.Counter()
        for msg in read_to_end(reader, topic, timeout_s):
            match = _JOB.search(msg.value() or b"")
            counts[match.group(1).decode() if match else "?"] += 1
        return dict(counts)
    finally:
        reader.close()


_JOB = re.compile(rb'"job":"([^"]*)"')

# What a part of the status may fail with when its server cannot be read: the part shows
# the error and the rest is still gathered (anything else is a bug, and propagates).
_UNREADABLE = (CdcError, psycopg.Error, KafkaException, OSError)


def gather_status(
    settings: Settings, sections: Mapping[str, StatusSection] | None = None
) -> dict[str, Any]:
    """Everything ``cdc status`` shows, as one JSON-able mapping.

    A server that cannot be read leaves its parts empty and its error under ``errors``
    (``postgres``, ``kafka``), and ``settings_wrong`` says whether one refused the settings
    themselves (a login, a certificate, a database that does not exist); each of ``sections``
    adds one key, computed by its function from the settings (or ``{"error": ...}``).
    """
    name = settings.postgres.slot_name
    out: dict[str, Any] = {
        "slot": {"slot": name, "exists": None},
        "warnings": [],
        "state": None,
        "topics": {},
        "snapshots": [],
        "verify": None,
        "errors": {},
        "settings_wrong": False,
    }
    try:
        out["slot"] = slot_status(settings)
        out["warnings"] = slot_warnings(out["slot"], settings.postgres.retained_wal_warn_bytes)
    except _UNREADABLE as e:
        out["errors"]["postgres"] = _line(e)
        out["settings_wrong"] |= isinstance(e, ConfigError)
    # The state's key names the database: the server's answer, else the DSN's.
    database = out["slot"].get("database") or _dsn_database(settings)
    try:
        out["topics"] = topic_status(settings)
        store = StateStore(settings.kafka, settings.kafka.topic_prefix)
        if database:
            store.latest()  # one read of the state topic serves every record below
        state = store.load(database, name) if database else None
        out["state"] = (
            None
            if state is None
            else {
                "phase": state.phase.value,
                "acked_lsn": str(state.acked_lsn) if state.acked_lsn else None,
                "last_commit_lsn": (str(state.last_commit_lsn) if state.last_commit_lsn else None),
            }
        )
        if out["state"] is not None:
            # kafka.exactly_once: the mode, and what Kafka holds committed (cdc.committed).
            committed = store.load_committed(database, name) if database else None
            out["state"]["delivery"] = (
                "exactly once" if settings.kafka.exactly_once else "at least once"
            )
            out["state"]["committed"] = committed.describe() if committed else None
        # Incremental snapshots queued or running (cdc.incremental), in their order.
        if database:
            snapshots = load_snapshots(store, database, name)
            out["snapshots"] = [asdict(snap) for snap in snapshots.queue]
            now = topic_ids(settings.kafka, snapshots.topics)
            out["warnings"] += [
                f"table {schema}.{table} left the captured set: its topic and the followers' "
                f"copies keep its last rows (`cdc forget {schema}.{table}` removes them)"
                for schema, table in store.load_left(database, name)
            ]
            out["lost_topics"] = [
                describe_loss(t, snapshots.topics[t], now[t])
                for t in lost_topics(snapshots.topics, now)
            ]
            # cdc verify's last pass, recorded beside the slot's state (cdc verify writes it).
            try:
                out["verify"] = verify_section(store.load_verify(database, name), time.time())
            except ValueError as e:  # written by another version: said, not fatal
                out["warnings"].append(f"the record of cdc verify's last pass is unreadable: {e}")
            out["warnings"] += verify_warnings(out["verify"])
    except _UNREADABLE as e:
        out["errors"]["kafka"] = _line(e)
        out["settings_wrong"] |= isinstance(e, ConfigError)
    try:
        out["dead_letters"] = dead_letter_counts(settings)
    except _UNREADABLE as e:
        out["dead_letters"] = {"error": _line(e)}
    for key, section in (sections or {}).items():
        try:
            out[key] = section(settings)
        except _UNREADABLE as e:
            out[key] = {"error": _line(e)}
    out["problems"] = problems(
        out, settings.postgres.retained_wal_warn_bytes, settings.spark.watermark_stale_s
    )
    out["healthy"] = not out["problems"]
    return out


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _dsn_database(settings: Settings) -> str | None:
    try:
        params = parse_dsn(settings.postgres.dsn.get_secret_value())
    except CdcError:
        return None
    return str(params.get("dbname") or params.get("user") or "") or None
