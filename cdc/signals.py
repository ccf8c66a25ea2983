"""Signals: requests to snapshot tables incrementally, or to stop doing so, in Debezium's words.

A signal is ``{"type": "execute-snapshot", "data": {"data-collections": ["public.orders"],
"type": "incremental", "additional-conditions": [{"data-collection": "public.orders",
"filter": "region = 'eu'"}]}}`` or ``{"type": "stop-snapshot", "data": {"data-collections":
[...]}}`` (no collections: stop every one). It reaches the reader three ways, each replayed
after a stop, so a signal written while the reader is down runs when it comes back:

- a transactional logical message with prefix :data:`SIGNAL_PREFIX` in the WAL (what
  ``cdc snapshot`` writes: it needs no table and no write access to user schemas);
- a row inserted into the signal table (``postgres.signal_data_collection``, Debezium's
  ``signal.data.collection``: columns ``id``, ``type``, ``data``), streamed from the slot;
- a record on the Kafka signal topic (``kafka.signal_topic``, Debezium's
  ``signal.kafka.topic``) keyed by the topic prefix; its offset is committed only once the
  request is in the reader's state.

Parsing is pure: a signal that cannot be understood is logged and ignored, never a stop.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg

from pgcdc.core.lsn import Lsn

log = logging.getLogger(__name__)

SIGNAL_PREFIX = "pgcdc-signal"
EXECUTE = "execute-snapshot"
STOP = "stop-snapshot"

Table = tuple[str, str]


@dataclass(frozen=True)
class SnapshotRequest:
    """Snapshot ``tables`` incrementally; ``filters`` holds a table's extra WHERE condition."""

    id: str
    tables: tuple[Table, ...]
    filters: tuple[tuple[Table, str], ...] = ()

    def where(self, table: Table) -> str | None:
        return next((f for t, f in self.filters if t == table), None)


@dataclass(frozen=True)
class StopRequest:
    """Stop the incremental snapshots of ``tables`` (empty: all of them)."""

    id: str
    tables: tuple[Table, ...]


Signal = SnapshotRequest | StopRequest


def split_table(name: str) -> Table:
    """``schema.table`` (a name without a schema is in ``public``)."""
    parts = name.strip().strip('"').split(".")
    if len(parts) == 1:
        return ("public", parts[0])
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"table {name!r} must be written as schema.table")
    return (parts[0].strip('"'), parts[1].strip('"'))


def parse_signal(signal_id: str | None, kind: str | None, data: Any) -> Signal | None:
    """The request a signal makes, or None (logged) if it is not one we carry out."""
    sid = signal_id or uuid.uuid4().hex
    try:
        body: dict[str, Any] = (
            orjson.loads(data) if isinstance(data, str | bytes) and data else (data or {})
        )
        tables = tuple(split_table(t) for t in body.get("data-collections") or ())
        if kind == EXECUTE:
            mode = body.get("type", "incremental")
            if str(mode).lower() != "incremental":
                log.warning("signal %s: snapshot type %r is not supported (incremental)", sid, mode)
                return None
            if not tables:
                log.warning("signal %s: execute-snapshot names no data-collections", sid)
                return None
            filters = tuple(
                (split_table(c["data-collection"]), str(c["filter"]))
                for c in body.get("additional-conditions") or ()
                if c.get("filter")
            )
            return SnapshotRequest(sid, tables, filters)
        if kind == STOP:
            return StopRequest(sid, tables)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        log.warning("signal %s (%s) cannot be read and is ignored: %s", sid, kind, e)
        return None
    log.info("signal %s of type %r ignored (not a snapshot signal)", sid, kind)
    return None


def parse_envelope(signal_id: str | None, raw: bytes | str) -> Signal | None:
    """A signal written as one JSON document ``{"id"?, "type", "data"}`` (WAL, Kafka)."""
    try:
        doc = orjson.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        log.warning("signal %s is not a JSON object and is ignored: %s", signal_id, e)
        return None
    return parse_signal(doc.get("id", signal_id), doc.get("type"), doc.get("data"))


def execute_document(tables: Sequence[Table], where: str | None = None) -> dict[str, Any]:
    """The ``execute-snapshot`` signal for ``tables``, each with ``where`` if given."""
    names = [f"{s}.{t}" for s, t in tables]
    data: dict[str, Any] = {"data-collections": names, "type": "incremental"}
    if where:
        data["additional-conditions"] = [{"data-collection": n, "filter": where} for n in names]
    return {"id": uuid.uuid4().hex, "type": EXECUTE, "data": data}


def stop_document(tables: Iterable[Table]) -> dict[str, Any]:
    names = [f"{s}.{t}" for s, t in tables]
    return {"id": uuid.uuid4().hex, "type": STOP, "data": {"data-collections": names}}


def emit_wal_signal(conn: psycopg.Connection[Any], document: dict[str, Any]) -> Lsn:
    """Write ``document`` into the WAL as a transactional logical message; its LSN."""
    row = conn.execute(
        "SELECT pg_logical_emit_message(true, %s, %s)::text",
        (SIGNAL_PREFIX, orjson.dumps(document).decode()),
    ).fetchone()
    assert row is not None
    return Lsn.parse(row[0])
