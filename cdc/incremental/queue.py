"""The durable queue of incremental snapshots: one record per slot in the state topic.

The record (key ``<database>/<slot>#snapshots`` in ``<prefix>.__cdc_state``, see
:mod:`cdc.state`) holds the tables captured so far (a table that joins later is snapshotted),
the queue of snapshots with each one's progress, and the signals already carried out (so a
signal replayed from the WAL or the signal topic runs once). It is written, and Kafka's
acknowledgement awaited, before anything it records is acted on: a queued request before the
signal that made it is acknowledged, a chunk's progress after the chunk is in Kafka.

A snapshot may be restricted to key ranges (:class:`KeyRange`): ``cdc verify``'s repair
re-reads only the ranges that drifted. Progress is then (range, last key in it).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import orjson

Table = tuple[str, str]
KeyText = list[str]  # a key as its columns' text, in key order

# Signals carried out are remembered until a replay of them would be refused as too old
# (cdc.incremental.auth.SIGNAL_MAX_AGE_S), never forgotten sooner; past this many at once new
# ones are refused instead (cdc.incremental.channels), so the state record stays bounded.
SEEN_SIGNALS_MAX = 100_000


@dataclass(frozen=True)
class KeyRange:
    """Keys ``start <= key <= end`` (in the key's order); None leaves that end open."""

    start: KeyText | None = None
    end: KeyText | None = None

    def to_json(self) -> list[KeyText | None]:
        return [self.start, self.end]

    @classmethod
    def from_json(cls, v: Sequence[Any]) -> KeyRange:
        start, end = v
        return cls(
            None if start is None else [str(x) for x in start],
            None if end is None else [str(x) for x in end],
        )


@dataclass
class TableSnapshot:
    """One table's incremental snapshot, as kept in the state topic."""

    id: str
    schema: str
    table: str
    where: str | None = None  # the filter, as checked and rewritten (cdc.incremental.filters)
    via: str = "signal"  # wal | table | kafka | joined | initial | api | topic_lost | schema_change
    last_key: KeyText | None = None  # the key columns' text of the last row read
    chunks: int = 0  # chunks published and acknowledged
    rows: int = 0  # rows published by those chunks
    estimated_rows: int = 0
    ranges: list[KeyRange] | None = None  # None: every key
    range_index: int = 0  # the range last_key is in

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def key(self) -> Table:
        return (self.schema, self.table)

    def current_range(self) -> KeyRange | None:
        if self.ranges is None or self.range_index >= len(self.ranges):
            return None
        return self.ranges[self.range_index]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranges"] = None if self.ranges is None else [r.to_json() for r in self.ranges]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TableSnapshot:
        d = dict(d)
        ranges = d.pop("ranges", None)
        snap = cls(**d)
        snap.ranges = None if ranges is None else [KeyRange.from_json(r) for r in ranges]
        return snap


@dataclass
class SnapshotsState:
    """The slot's incremental snapshots: captured tables, the queue, signals carried out."""

    captured: list[Table] | None = None  # None: never recorded (a reader from before)
    queue: list[TableSnapshot] = field(default_factory=list)
    # Signals carried out: their id (or channel and position) -> when they were signed.
    seen: dict[str, float] = field(default_factory=dict)
    # The captured tables' topics as the reader last wrote them: name -> Kafka topic id
    # (cdc.topic_ids: another id, or none, means the topic lost what it held).
    topics: dict[str, str] = field(default_factory=dict)
    # The captured tables' shapes as the reader last saw them: "schema.table" ->
    # [[column, type, typmod], ...] (cdc.schema_changes: another shape snapshots it again).
    relations: dict[str, list[list[Any]]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "captured": None if self.captured is None else [list(t) for t in self.captured],
                "queue": [s.to_json() for s in self.queue],
                "seen": self.seen,
                "topics": self.topics,
                "relations": self.relations,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | None) -> SnapshotsState:
        if not data:
            return cls()
        d: dict[str, Any] = orjson.loads(data)
        captured = d.get("captured")
        return cls(
            captured=None if captured is None else [(s, t) for s, t in captured],
            queue=[TableSnapshot.from_json(s) for s in d.get("queue", [])],
            seen={str(k): float(v) for k, v in (d.get("seen") or {}).items()},
            topics={str(k): str(v) for k, v in (d.get("topics") or {}).items()},
            relations={str(k): [list(c) for c in v] for k, v in (d.get("relations") or {}).items()},
        )

    def remember(self, signal_key: str, ts: float, oldest: float) -> None:
        """Record a signal carried out; forget those signed before ``oldest`` (a replay of
        them is refused as too old), and only those."""
        self.seen[signal_key] = ts
        if any(t < oldest for t in self.seen.values()):
            self.seen = {k: t for k, t in self.seen.items() if t >= oldest}

    def remembers_enough(self) -> bool:
        """Whether no more signals can be remembered (see :data:`SEEN_SIGNALS_MAX`)."""
        return len(self.seen) >= SEEN_SIGNALS_MAX


class RecordStore(Protocol):
    """Where the record lives (:class:`cdc.state.StateStore`)."""

    def load_record(self, key: bytes, timeout_s: float = ...) -> bytes | None: ...
    def save_record(self, key: bytes, value: bytes, *, wait: bool = True) -> None: ...


def snapshots_key(database: str, slot: str) -> bytes:
    return f"{database}/{slot}#snapshots".encode()


def load_snapshots(store: RecordStore, database: str, slot: str) -> SnapshotsState:
    return SnapshotsState.from_json(store.load_record(snapshots_key(database, slot)))


def save_snapshots(store: RecordStore, database: str, slot: str, state: SnapshotsState) -> None:
    """Write the record and wait for Kafka: what it records counts from now on."""
    store.save_record(snapshots_key(database, slot), state.to_json(), wait=True)


def join_tables(state: SnapshotsState, tables: Sequence[Table]) -> list[Table]:
    """Tables of ``tables`` not captured before (all of them if nothing was recorded)."""
    if state.captured is None:
        return list(tables)
    return [t for t in tables if t not in state.captured]


def start_slot(
    state: SnapshotsState,
    tables: Sequence[Table],
    *,
    incremental_initial: bool,
    signal_table: Table | None,
    save_queue: Callable[[SnapshotsState], None],
    save_streaming: Callable[[], None],
) -> None:
    """A slot this run created, before anything is streamed from it: nothing queued from
    before, every table captured now, and with an incremental initial snapshot every table
    queued. The queue is durable *before* the reader's phase says STREAMING: a stop between
    the two then starts over (the slot was never streamed from), instead of streaming a
    slot whose tables were never copied."""
    state.queue.clear()
    state.captured = list(tables)
    if incremental_initial:
        state.queue.extend(
            TableSnapshot(uuid.uuid4().hex, *t, via="initial") for t in tables if t != signal_table
        )
    save_queue(state)
    save_streaming()
