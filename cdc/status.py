"""``cdc status``: where the reader stands, read from PostgreSQL and Kafka.

Other components add their own sections (e.g. the followers' watermarks) with
:func:`register_status_hook`; a hook gets the settings and returns a JSON-able mapping.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from cdc.publisher import rdkafka_log
from cdc.slots import slot_info
from cdc.state import StateStore
from pgcdc.core.errors import ConnectionFailed
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import Settings

log = logging.getLogger(__name__)

StatusHook = Callable[[Settings], dict[str, Any]]
_HOOKS: dict[str, StatusHook] = {}


def register_status_hook(name: str, hook: StatusHook) -> None:
    """Add a section ``name`` to ``cdc status`` (e.g. "followers")."""
    _HOOKS[name] = hook


def slot_status(settings: Settings) -> dict[str, Any]:
    """The slot: active, confirmed flush LSN, retained WAL and lag in bytes."""
    from cdc.pipeline import connect

    with connect(settings.postgres.dsn.get_secret_value()) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text, current_database()").fetchone()
        assert row is not None
        current = Lsn.parse(row[0])
        info = slot_info(conn, settings.postgres.slot_name)
    out: dict[str, Any] = {
        "database": row[1],
        "slot": settings.postgres.slot_name,
        "exists": info is not None,
        "server_wal_lsn": str(current),
    }
    if info is not None:
        out.update(
            active=info.active,
            active_pid=info.active_pid,
            confirmed_flush_lsn=str(info.confirmed_flush_lsn) if info.confirmed_flush_lsn else None,
            restart_lsn=str(info.restart_lsn) if info.restart_lsn else None,
            retained_wal_bytes=(current - info.restart_lsn) if info.restart_lsn else None,
            lag_bytes=(current - info.confirmed_flush_lsn) if info.confirmed_flush_lsn else None,
        )
    return out


def topic_status(settings: Settings) -> dict[str, dict[str, int]]:
    """End offsets of every partition of the reader's topics: {topic: {partition: offset}}."""
    prefix = settings.kafka.topic_prefix + "."
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": "cdc-status",
            "logger": rdkafka_log,
        }
    )
    try:
        try:
            md = consumer.list_topics(timeout=5)
        except KafkaException as e:
            raise ConnectionFailed(
                f"Kafka at {settings.kafka.bootstrap_servers} is unreachable: {e.args[0].str()}"
            ) from e
        out: dict[str, dict[str, int]] = {}
        for name in sorted(md.topics):
            if not name.startswith(prefix):
                continue
            ends: dict[str, int] = {}
            for p in sorted(md.topics[name].partitions):
                _low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=5)
                ends[str(p)] = high
            out[name] = ends
        return out
    finally:
        consumer.close()


def gather_status(settings: Settings) -> dict[str, Any]:
    """Everything ``cdc status`` shows, as one JSON-able mapping."""
    slot = slot_status(settings)
    store = StateStore(settings.kafka.bootstrap_servers, settings.kafka.topic_prefix)
    topics = topic_status(settings)
    state = store.load(str(slot["database"]), settings.postgres.slot_name)
    out: dict[str, Any] = {
        "slot": slot,
        "state": None
        if state is None
        else {
            "phase": state.phase.value,
            "acked_lsn": str(state.acked_lsn) if state.acked_lsn else None,
        },
        "topics": topics,
    }
    if "followers" not in _HOOKS:
        from sinks.status import status_hook

        register_status_hook("followers", status_hook)
    for name, hook in _HOOKS.items():
        out[name] = hook(settings)
    return out
