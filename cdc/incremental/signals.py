"""Signals: requests to snapshot tables incrementally, or to stop doing so, in Debezium's words.

A signal is ``{"type": "execute-snapshot", "data": {"data-collections": ["public.orders"],
"type": "incremental", "additional-conditions": [{"data-collection": "public.orders",
"filter": "region = 'eu'"}]}}`` or ``{"type": "stop-snapshot", "data": {"data-collections":
[...]}}`` (no collections: stop every one). ``data`` may also hold ``pgcdc-key-ranges``:
``[{"data-collection": "public.orders", "ranges": [[start, end], ...]}]``, each end a list of
the key columns' text or null (open): only those keys are read (``cdc verify``'s repair).

Signals reach the reader three ways (:mod:`cdc.incremental.channels`): a logical message in
the WAL and a record on the Kafka signal topic, both signed (:mod:`cdc.incremental.auth`),
and a row of the signal table, which its grants protect. This module only parses: a signal
that cannot be understood is logged and ignored, never a stop.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.incremental.queue import KeyRange

# Names are read and written by the one rule (re-exported: the signal modules import them here).
from pgcdc.core.qualified_names import quote_table as quote_table
from pgcdc.core.qualified_names import split_name as split_name

log = logging.getLogger(__name__)

SIGNAL_PREFIX = "pgcdc-signal"
EXECUTE = "execute-snapshot"
STOP = "stop-snapshot"
KEY_RANGES = "pgcdc-key-ranges"

Table = tuple[str, str]


@dataclass(frozen=True)
class SnapshotRequest:
    """Snapshot ``tables`` incrementally; ``filters`` holds a table's extra WHERE condition,
    ``ranges`` the key ranges a table is restricted to."""

    id: str
    tables: tuple[Table, ...]
    filters: tuple[tuple[Table, str], ...] = ()
    ranges: tuple[tuple[Table, tuple[KeyRange, ...]], ...] = ()

    def where(self, table: Table) -> str | None:
        return next((f for t, f in self.filters if t == table), None)

    def key_ranges(self, table: Table) -> list[KeyRange] | None:
        return next((list(r) for t, r in self.ranges if t == table), None)


@dataclass(frozen=True)
class StopRequest:
    """Stop the incremental snapshots of ``tables`` (empty: all of them)."""

    id: str
    tables: tuple[Table, ...]


Signal = SnapshotRequest | StopRequest


def split_table(name: str) -> Table:
    """``schema.table`` (a signal names tables qualified; a bare name is read as ``public``,
    Debezium's default, and the reader refuses it if that table is not captured)."""
    parts = split_name(name.strip())
    if len(parts) == 1:
        return ("public", parts[0])
    if len(parts) != 2:
        raise ValueError(f"table {name!r} must be written as schema.table")
    return (parts[0], parts[1])


def _ranges(body: dict[str, Any]) -> tuple[tuple[Table, tuple[KeyRange, ...]], ...]:
    out = []
    for entry in body.get(KEY_RANGES) or ():
        table = split_table(entry["data-collection"])
        out.append((table, tuple(KeyRange.from_json(r) for r in entry["ranges"])))
    return tuple(out)


def parse_signal(signal_id: str | None, kind: str | None, data: Any) -> Signal | None:
    """The request a signal makes, or None (logged) if it is not one we carry out."""
    sid = signal_id or uuid.uuid4().hex
    try:
        body: dict[str, Any] = (
            orjson.loads(data) if isinstance(data, str | bytes) and data else (data or {})
        )
        if not isinstance(body, dict):
            raise ValueError("data is not a JSON object")
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
            return SnapshotRequest(sid, tables, filters, _ranges(body))
        if kind == STOP:
            return StopRequest(sid, tables)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        log.warning("signal %s (%s) cannot be read and is ignored: %s", sid, kind, e)
        return None
    log.info("signal %s of type %r ignored (not a snapshot signal)", sid, kind)
    return None


def parse_document(signal_id: str | None, doc: Any) -> Signal | None:
    """A signal written as one JSON document ``{"id"?, "type", "data"}`` (WAL, Kafka)."""
    if not isinstance(doc, dict):
        log.warning("signal %s is not a JSON object and is ignored", signal_id)
        return None
    return parse_signal(doc.get("id", signal_id), doc.get("type"), doc.get("data"))


def execute_document(
    tables: Sequence[Table],
    where: str | None = None,
    ranges: Sequence[KeyRange] | None = None,
) -> dict[str, Any]:
    """The ``execute-snapshot`` signal for ``tables``, each with ``where`` and ``ranges`` if
    given."""
    names = [quote_table(t) for t in tables]
    data: dict[str, Any] = {"data-collections": names, "type": "incremental"}
    if where:
        data["additional-conditions"] = [{"data-collection": n, "filter": where} for n in names]
    if ranges is not None:
        data[KEY_RANGES] = [
            {"data-collection": n, "ranges": [r.to_json() for r in ranges]} for n in names
        ]
    return {"id": uuid.uuid4().hex, "type": EXECUTE, "data": data}


def stop_document(tables: Iterable[Table]) -> dict[str, Any]:
    names = [quote_table(t) for t in tables]
    return {"id": uuid.uuid4().hex, "type": STOP, "data": {"data-collections": names}}
