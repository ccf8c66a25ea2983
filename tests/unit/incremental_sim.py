"""An in-memory world for the incremental snapshot engine: a table with MVCC visibility, a
WAL, a stream that publishes it, Kafka as an append-only log, the state topic and a chunk
worker whose steps (low watermark, snapshot and read, high watermark, failure) happen when
the test says. The engine (:class:`cdc.incremental.engine.IncrementalSnapshots`), the merge
and the truncate's key rule (:meth:`cdc.live_keys.LiveKeys.load_versioned`) are the real
code; the rest stands in for PostgreSQL, the streamer and Kafka, with their ordering rules:

- a transaction's commit record enters the WAL when it commits; it becomes visible to new
  snapshots then, or later when *held* (a synchronous standby's wait);
- the stream reads the WAL in order; a transaction's records carry (commit LSN, order);
  it publishes and observes every change (no operation is skipped here: the real loop's
  order, a change in ``postgres.skipped_operations`` returning before the engine observes
  it, is tested on the real streamer in ``test_incremental_stream_order.py``);
- the worker writes L, reads at a snapshot (rows and columns as that snapshot sees them),
  writes H; a lock taken before its snapshot keeps DDL out of the read;
- Kafka holds every record sent; the slot is confirmed up to a position the stream passed;
  a kill loses everything but the state topic, Kafka and the confirmed position.

The test (``test_incremental_model.py``) checks what a follower holds after applying every
record by version against the table.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from cdc import pgoutput
from cdc.incremental.auth import Verifier
from cdc.incremental.channels import SignalIntake
from cdc.incremental.engine import RETRY_BASE_S, RETRY_MAX_S, IncrementalSnapshots
from cdc.incremental.merge import ReadSnapshot, Window, merge_chunk
from cdc.incremental.queue import SnapshotsState, Table, start_slot
from cdc.incremental.requests import EngineConfig
from cdc.incremental.worker import WATERMARK_PREFIX, ChunkFailure, ChunkRead, ChunkRequest
from cdc.live_keys import LiveKeys
from pgcdc.core.contract import HEADER_COMMIT_LSN, HEADER_ORDER, table_topic
from pgcdc.core.lsn import Lsn
from schemas.model import Column, PgType, TableSchema

# Paths the runs took, summed over every example (the test checks each was taken).
SEEN: collections.Counter[str] = collections.Counter()
TABLE: Table = ("public", "t")
_SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the truncate's key store
TOPIC = table_topic("m", *TABLE)
Version = tuple[int, int]
_INT = PgType(oid=23, name="int4", kind="b")


@dataclass(frozen=True)
class Schema:
    key_type: str = "int32"  # int32 | int64: what the record key's schema says
    columns: tuple[str, ...] = ("v",)


def key_bytes(schema: Schema, key: int) -> bytes:
    """A record key as the reader writes it: the key's schema is part of its bytes."""
    return json.dumps({"schema": schema.key_type, "payload": {"id": key}}).encode()


@dataclass
class Change:
    kind: str  # c u d k(ey change) t(runcate) ddl
    key: int | None = None
    new_key: int | None = None
    row: dict[str, int | None] | None = None
    schema: Schema | None = None  # ddl: the schema after it


@dataclass
class Txn:
    xid: int
    lsn: int  # commit LSN
    changes: list[Change]


@dataclass
class Msg:
    lsn: int
    content: bytes


@dataclass
class Record:
    key: bytes
    value: dict[str, Any] | None
    version: Version
    chunk: bool = False


class Db:
    """Rows before the slot, then the WAL; ``held``: committed, not yet visible."""

    def __init__(self, rows: dict[int, dict[str, int | None]]) -> None:
        self.initial = {k: dict(v) for k, v in rows.items()}
        self.wal: list[Txn | Msg] = []
        self.held: set[int] = set()
        self.next_xid = 100
        self.next_lsn = 1000

    def lsn(self) -> int:
        self.next_lsn += 16
        return self.next_lsn

    def commit(self, changes: list[Change], hold: bool = False) -> Txn:
        txn = Txn(self.next_xid, self.lsn(), changes)
        self.next_xid += 1
        self.wal.append(txn)
        if hold:
            self.held.add(txn.xid)
        return txn

    def emit(self, content: bytes) -> Msg:
        msg = Msg(self.lsn(), content)
        self.wal.append(msg)
        return msg

    def state(
        self, upto: int | None = None, visible: Callable[[int], bool] = lambda _x: True
    ) -> tuple[Schema, dict[int, dict[str, int | None]]]:
        """The schema and rows after the WAL's first ``upto`` entries (every one), counting
        only transactions ``visible`` says."""
        schema, rows = Schema(), {k: dict(v) for k, v in self.initial.items()}
        for entry in self.wal[:upto]:
            if not isinstance(entry, Txn) or not visible(entry.xid):
                continue
            for c in entry.changes:
                schema, rows = apply(schema, rows, c)
        return schema, rows

    def locked_keys(self) -> set[int]:
        """Keys a held transaction changed (another writer would wait for it)."""
        out: set[int] = set()
        for entry in self.wal:
            if isinstance(entry, Txn) and entry.xid in self.held:
                out |= {k for c in entry.changes for k in (c.key, c.new_key) if k is not None}
        return out


def apply(
    schema: Schema, rows: dict[int, dict[str, int | None]], c: Change
) -> tuple[Schema, dict[int, dict[str, int | None]]]:
    if c.kind in ("c", "u"):
        assert c.key is not None and c.row is not None
        rows[c.key] = dict(c.row)
    elif c.kind == "d":
        rows.pop(c.key, None)  # type: ignore[arg-type]
    elif c.kind == "k":
        assert c.key is not None and c.new_key is not None and c.row is not None
        rows.pop(c.key, None)
        rows[c.new_key] = dict(c.row)
    elif c.kind == "t":
        rows.clear()
    elif c.kind == "ddl":
        assert c.schema is not None
        for col in c.schema.columns:
            if col not in schema.columns:
                for r in rows.values():
                    r[col] = None
        for col in schema.columns:
            if col not in c.schema.columns:
                for r in rows.values():
                    r.pop(col, None)
        schema = c.schema
    return schema, rows


class Kafka:
    """The topic as an append-only log, and the publisher the engine writes chunks through."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def begin(self, commit_lsn: Lsn) -> Any:
        return _Txn()

    def send_many(self, txn: Any, topic: str, records: Iterable[Any]) -> None:
        assert topic == TOPIC
        for key, value, headers in records:
            h = dict(headers)
            version = (int(h[HEADER_COMMIT_LSN]), int(h[HEADER_ORDER]))
            self.records.append(Record(key, json.loads(value), version, chunk=True))

    def holds(self, txn: Any) -> bool:
        return bool(txn.closed and txn.pending == 0)

    def close_txn(self, txn: Any, end_lsn: Lsn) -> None:
        txn.closed = True

    def poll(self, timeout_s: float = 0.0) -> None:
        pass


@dataclass
class _Txn:
    closed: bool = False
    pending: int = 0


class Store:
    """The state topic: the last record saved survives a kill."""

    def __init__(self) -> None:
        self.saved: bytes | None = None
        self.phase: str | None = None
        self.fail_at = 0  # > 0: the process dies at that save from now (1: the next one)

    def save(self, state: SnapshotsState) -> None:
        self.crash_if_asked()
        self.saved = state.to_json()

    def save_phase(self, phase: str) -> None:
        self.crash_if_asked()
        self.phase = phase

    def crash_if_asked(self) -> None:
        if self.fail_at:
            self.fail_at -= 1
            if not self.fail_at:
                raise Killed("killed at a save")

    def load(self) -> SnapshotsState:
        return SnapshotsState.from_json(self.saved)


class Killed(Exception):
    pass


@dataclass
class Pending:
    request: ChunkRequest
    future: Future[ChunkRead]
    low: bool = False
    read: ChunkRead | None = None


class Worker:
    """The chunk worker, one step at a time (see the module docstring)."""

    def __init__(self, db: Db, on_submit: Callable[[], None] = lambda: None) -> None:
        self.db = db
        self.pending: Pending | None = None
        self.on_submit = on_submit

    def submit(self, request: ChunkRequest) -> Future[ChunkRead]:
        self.on_submit()
        future: Future[ChunkRead] = Future()
        self.pending = Pending(request, future)
        return future

    def close(self) -> None:
        self.pending = None

    def low(self) -> None:
        assert self.pending is not None and not self.pending.low
        self.db.emit(self.pending.request.low)
        self.pending.low = True

    def chunk_keys(self) -> list[int]:
        """The keys the chunk asked for would read now."""
        held = frozenset(self.db.held)
        _, rows = self.db.state(visible=lambda x: x not in held)
        return self._first_keys(rows)

    def _first_keys(self, rows: dict[int, dict[str, int | None]]) -> list[int]:
        p = self.pending
        assert p is not None
        after = int(p.request.after[0]) if p.request.after else None
        return sorted(k for k in rows if after is None or k > after)[: p.request.rows]

    def read(self) -> None:
        p = self.pending
        assert p is not None and p.low and p.read is None
        held = frozenset(self.db.held)
        schema, rows = self.db.state(visible=lambda x: x not in held)
        keys = self._first_keys(rows)
        table = TableSchema(
            *TABLE,
            tuple(Column(c, _INT, -1, c != "id", c == "id") for c in ("id", *schema.columns)),
            ("id",),
            "d",
        )
        p.read = ChunkRead(
            table,
            [(str(k),) for k in keys],
            [key_bytes(schema, k) for k in keys],
            [
                json.dumps({"id": k, **{c: rows[k].get(c) for c in schema.columns}}).encode()
                for k in keys
            ],
            [str(keys[-1])] if keys else None,
            len(keys) < p.request.rows,
            ReadSnapshot(held, self.db.next_xid & 0xFFFFFFFF),
            len(rows) if p.request.count else None,
        )

    def high(self) -> None:
        p = self.pending
        assert p is not None and p.read is not None
        self.db.emit(p.request.high)
        self.pending = None
        p.future.set_result(p.read)

    def fail(self, timeout: bool) -> None:
        p = self.pending
        assert p is not None
        self.pending = None
        p.future.set_exception(ChunkFailure("canceling statement", retry=True, timeout=timeout))
        SEEN["chunk failed"] += 1


class Catalog:
    def __init__(self, db: Db) -> None:
        self.db = db

    def captured(self) -> list[Table]:
        return [TABLE]

    def shapes(self) -> dict[str, list[list[Any]]]:
        return {}  # the simulated table never changes shape

    def visibility(self) -> ReadSnapshot:
        return ReadSnapshot(frozenset(self.db.held), self.db.next_xid)

    def committed_invisible(self) -> frozenset[int]:
        return frozenset(self.db.held)

    def check_filter(self, table: Table, where: str) -> str:
        return where

    def close(self) -> None:
        pass


@dataclass
class Reader:
    """One run of the reader: its engine, where its stream stands, its schema view."""

    engine: IncrementalSnapshots
    pos: int  # the next WAL entry to stream
    order: int = 0


@dataclass
class World:
    db: Db
    kafka: Kafka = field(default_factory=Kafka)
    store: Store = field(default_factory=Store)
    now: float = 0.0
    confirmed: int = 0  # the slot's confirmed LSN
    furthest: int = 0  # the furthest WAL entry any run streamed
    reader: Reader | None = None
    worker: Worker | None = None
    chunk_rows: int = 3
    newer_tombstoned: list[str] = field(default_factory=list)
    committed_only_when_busy: bool = False  # the old rule (a revert check flips it)
    early_retries: list[str] = field(default_factory=list)  # chunks asked before their backoff
    _streak: list[float] = field(default_factory=list)  # times of the retries in a row
    _counts: tuple[int, int, int, int] = (0, 0, 0, 0)  # the engine's counters last seen

    def track(self) -> None:
        """After the engine ran: note its retries (a failed or unusable chunk) and whether
        a chunk went out (which ends a streak of retries)."""
        r = self.reader
        if r is None:
            return
        e = r.engine
        counts = (e.retries, e.published, e.invisible, e.dropped)
        before = self._counts
        SEEN["chunk published"] += counts[1] - before[1]
        SEEN["chunk read again"] += counts[0] - before[0]
        SEEN["chunk read again: a streamed transaction was invisible"] += counts[2] - before[2]
        SEEN["chunk rows dropped for a streamed change"] += counts[3] - before[3]
        if counts[1] > before[1]:
            self._streak.clear()
        self._streak.extend([self.now] * (counts[0] - before[0]))
        self._counts = counts

    def _submitted(self) -> None:
        if self._streak:
            wait = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (len(self._streak) - 1))
            if self.now - self._streak[-1] < wait - 1e-9:
                self.early_retries.append(
                    f"retry {len(self._streak)} asked {self.now - self._streak[-1]:.3f} s "
                    f"after the failure (backoff {wait} s)"
                )

    # --- a run of the reader ---------------------------------------------------------

    def start(self) -> None:
        """A run: a new slot (incremental initial snapshot) or the existing one resumed."""
        self.worker = Worker(self.db, self._submitted)
        self._streak.clear()
        self._counts = (0, 0, 0, 0)
        state = self.store.load()
        engine = IncrementalSnapshots(
            EngineConfig("m", "pub", chunk_rows=self.chunk_rows),
            state=state,
            save=self.store.save,
            chunks=self.worker,
            publisher=self.kafka,
            catalog=Catalog(self.db),
            intake=SignalIntake(Verifier(None, "sim", "sim_slot"), state),
            clock=lambda: self.now,
        )
        if self.store.phase != "streaming":
            # The slot is (re)created here: it streams from the WAL's end.
            self.confirmed = self.db.wal[-1].lsn if self.db.wal else 0
            self.furthest = len(self.db.wal)
            self.reader = Reader(engine, len(self.db.wal))
            try:
                start_slot(
                    state,
                    [TABLE],
                    incremental_initial=True,
                    signal_table=None,
                    save_queue=self.store.save,
                    save_streaming=lambda: self.store.save_phase("streaming"),
                )
            finally:
                self.store.fail_at = 0
            return
        pos = next(
            (i for i, e in enumerate(self.db.wal) if e.lsn > self.confirmed), len(self.db.wal)
        )
        if pos < self.furthest:
            SEEN["restart replays what was streamed"] += 1
        self.reader = Reader(engine, pos)
        self.store.fail_at = 0

    def tick(self) -> None:
        if self.reader is not None:
            self.reader.engine.tick(self.now)
            self.track()

    def kill(self) -> None:
        SEEN["kill"] += 1
        if self.store.phase != "streaming":
            SEEN["killed before the slot was ready"] += 1
        self.reader = None
        self.worker = None

    # --- the stream ------------------------------------------------------------------

    def stream_one(self) -> bool:
        r = self.reader
        if r is None or r.pos >= len(self.db.wal):
            return False
        entry = self.db.wal[r.pos]
        r.pos += 1
        self.furthest = max(self.furthest, r.pos)
        if isinstance(entry, Msg):
            chunk = r.engine._open  # the chunk this message may end (its H)
            merges = r.engine.published + r.engine.invisible
            r.engine.on_message(
                pgoutput.LogicalMessage(False, Lsn(entry.lsn), WATERMARK_PREFIX, entry.content)
            )
            if chunk is not None and r.engine.published + r.engine.invisible > merges:
                assert chunk.future is not None
                self._rules_needed(chunk.window, chunk.future.result(), r.pos)
            self.track()
        else:
            self._stream_txn(r, entry)
            self.tick()
        return True

    def _stream_txn(self, r: Reader, txn: Txn) -> None:
        schema, _ = self.db.state(upto=self.db.wal.index(txn))
        order = 0
        for c in txn.changes:
            if c.kind == "ddl":
                assert c.schema is not None
                schema = c.schema
                continue
            if c.kind == "t":
                order = self._truncate(r, txn, order)
                continue
            for key, value in _records(c):
                doc = (
                    None
                    if value is None
                    else {"id": key, **{k: value.get(k) for k in schema.columns}}
                )
                self.kafka.records.append(Record(key_bytes(schema, key), doc, (txn.lsn, order)))
                order += 2 if value is None else 1
                if r.engine.window_topic == TOPIC:
                    r.engine.observe((str(key),), txn.xid)
                    pending = self.worker.pending if self.worker else None
                    read = pending.read if pending else None
                    if (
                        read is not None
                        and key_bytes(schema, key) not in read.keys
                        and ((str(key),) in read.ids)
                    ):
                        SEEN["key in a window under other bytes than the chunk's"] += 1
        if not self.committed_only_when_busy or r.engine.busy:
            r.engine.committed(txn.xid)

    def _rules_needed(self, window: Window, read: ChunkRead, upto: int) -> None:
        """Count each merge rule this chunk needed: the merge with that rule's input taken
        away (the rest as the engine noted it) would publish a row that is not its key's
        state at H (the WAL's first ``upto`` entries)."""
        schema, rows = self.db.state(upto=upto)
        table = as_table(schema, rows)

        def wrong(i: int) -> bool:
            want = table.get(read.ids[i][0] or "")
            doc = json.loads(read.values[i])
            return want is None or {c: doc.get(c) for c in want} != want

        for path, without in RULES.items():
            kept = merge_chunk(read.ids, read.seen, without(window))
            if kept is not None and any(wrong(i) for i in kept):
                SEEN[path] += 1

    def _truncate(self, r: Reader, txn: Txn, order: int) -> int:
        r.engine.on_truncate(TABLE)
        version = (txn.lsn, order)
        with LiveKeys(_SCRATCH) as live:
            live.load_versioned(
                ((x.key, x.value is not None, x.version) for x in self.kafka.records),
                before=version,
            )
            doomed = list(live)
        last = {x.key: x.value is not None for x in self.kafka.records}
        if sum(last.values()) > len(doomed):
            SEEN["truncate left a key with a newer record"] += 1
        for key in doomed:
            if any(x.key == key and x.version > version and x.version[0] != txn.lsn
                   for x in self.kafka.records):  # fmt: skip
                self.newer_tombstoned.append(key.decode())
            self.kafka.records.append(Record(key, None, (txn.lsn, order)))  # one order for all
        return order + 1

    def confirm(self) -> None:
        """The slot confirms everything the stream passed (Kafka holds it all)."""
        r = self.reader
        if r is not None and r.pos > 0:
            self.confirmed = max(self.confirmed, self.db.wal[r.pos - 1].lsn)

    # --- what the followers hold -------------------------------------------------------

    def follower(self, records: Iterable[Record] | None = None) -> dict[str, dict[str, Any]]:
        """Every record applied in offset order, newer version wins; live rows by key id."""
        held: dict[str, tuple[Version, dict[str, Any] | None]] = {}
        for rec in self.kafka.records if records is None else records:
            ident = str(json.loads(rec.key)["payload"]["id"])
            if ident not in held or rec.version > held[ident][0]:
                held[ident] = (rec.version, rec.value)
        return {k: v for k, (_, v) in held.items() if v is not None}

    def compacted(self) -> list[Record]:
        """What log compaction keeps: each key's last record (tombstones kept)."""
        last: dict[bytes, int] = {}
        for i, rec in enumerate(self.kafka.records):
            last[rec.key] = i
        return [self.kafka.records[i] for i in sorted(last.values())]


# Each merge rule (cdc.incremental.merge), by the path that needs it: the window without
# what the rule reads.
RULES: dict[str, Callable[[Window], Window]] = {
    "rule 1 needed: an unseen transaction streamed before the request": lambda w: replace(
        w, unconfirmed=frozenset()
    ),
    "rule 2 needed: an early key of an unseen transaction": lambda w: replace(w, early={}),
    "rule 3 needed: a key changed in the window": lambda w: replace(w, window=set()),
    "rule 4 needed: a TRUNCATE in the window": lambda w: replace(w, truncated=False),
}


def _records(c: Change) -> list[tuple[int, dict[str, int | None] | None]]:
    if c.kind in ("c", "u"):
        assert c.key is not None
        return [(c.key, c.row)]
    if c.kind == "d":
        assert c.key is not None
        return [(c.key, None)]
    assert c.kind == "k" and c.key is not None and c.new_key is not None
    return [(c.key, None), (c.new_key, c.row)]


def as_table(schema: Schema, rows: dict[int, dict[str, int | None]]) -> dict[str, dict[str, Any]]:
    return {str(k): {"id": k, **{c: r.get(c) for c in schema.columns}} for k, r in rows.items()}


def same(follower: dict[str, dict[str, Any]], table: dict[str, dict[str, Any]]) -> bool:
    """Equal, a column missing from a follower's document reading as NULL (a column added
    since its last write), a column dropped since ignored."""
    if follower.keys() != table.keys():
        return False
    return all({c: follower[k].get(c) for c in row} == row for k, row in table.items())


__all__ = ["SEEN", "Change", "Killed", "Schema", "World", "as_table", "replace", "same"]
