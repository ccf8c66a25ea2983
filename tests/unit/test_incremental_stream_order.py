"""What the streaming loop tells an incremental snapshot's window, in the loop's own order:
the real :class:`cdc.streamer.Streamer`, engine and merge, pgoutput frames in, no servers.

The model-based test (``test_incremental_model.py``) streams through a stand-in that
observes every change. The real loop returns from a change in
``postgres.skipped_operations`` before the engine observes it (``Streamer._change``): a
skipped change is published nowhere, so it must not take its key out of a chunk, whose row
is then the key's only record. A TRUNCATE marks the window whether or not its ``t`` event
is skipped (its deletes are written either way). Observing a change before the skip, or
marking the truncate only when its ``t`` event is written, fails a test here.
"""

from __future__ import annotations

import struct
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest

from cdc import streamer, table_topics, truncate
from cdc.incremental.auth import Verifier
from cdc.incremental.channels import SignalIntake
from cdc.incremental.engine import IncrementalSnapshots
from cdc.incremental.merge import ReadSnapshot
from cdc.incremental.queue import SnapshotsState, Table
from cdc.incremental.requests import EngineConfig
from cdc.incremental.worker import WATERMARK_PREFIX, ChunkRead, ChunkRequest
from cdc.live_keys import LiveKeys
from cdc.streamer import Streamer
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import KafkaSettings, PostgresSettings, SchemaSettings, Settings
from schemas.envelope import EventEncoder
from schemas.model import Column, TableSchema
from tests.unit.test_reader_streamer import xlog
from tests.unit.test_reader_streamer_keys import (
    TEXT,
    TOPIC,
    Catalog,
    Publisher,
    Replication,
    begin,
    commit,
    delete,
    insert,
    relation,
    truncate_message,
    update,
)

pytestmark = pytest.mark.unit

TABLE: Table = ("public", "items")
CHUNK = ("1", "2")  # the chunk's keys, as its read saw them (key 1 as the change leaves it)
CHANGES = {
    "c": insert("1", "a"),
    "u": update(b"K", ("1", None), "1", "b"),
    "d": delete(b"K", "1", None),
}


@pytest.fixture(autouse=True)
def no_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streamer, "ACK_INTERVAL_S", 0.0)
    monkeypatch.setattr(table_topics, "cleanup_policy", lambda *_: "delete")
    # A TRUNCATE's scan of the topic: nothing is live in it.
    monkeypatch.setattr(truncate, "keys_live_before", lambda *_a, **_k: LiveKeys())


class Worker:
    """The chunk worker: the chunk asked for is read at once (``CHUNK``)."""

    request: ChunkRequest

    def submit(self, request: ChunkRequest) -> Future[ChunkRead]:
        self.request = request
        table = TableSchema(
            *TABLE,
            (Column("id", TEXT, -1, False, True), Column("v", TEXT, -1, True, False)),
            ("id",),
            "d",
        )
        future: Future[ChunkRead] = Future()
        future.set_result(
            ChunkRead(
                table,
                [(k,) for k in CHUNK],
                [k.encode() for k in CHUNK],
                [b"{}" for _ in CHUNK],
                [CHUNK[-1]],
                True,
                ReadSnapshot(frozenset(), 100),  # it saw every transaction here
                None,
            )
        )
        return future

    def close(self) -> None:
        pass


@dataclass
class Txn:
    closed: bool = False
    pending: int = 0


class ChunkSink:
    """The engine's publisher: the record keys of the chunk rows that went out."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    def begin(self, commit_lsn: Lsn) -> Txn:
        return Txn()

    def send_many(self, txn: Txn, topic: str, records: Any) -> None:
        assert topic == TOPIC
        self.keys += [key for key, _, _ in records]

    def holds(self, txn: Txn) -> bool:
        return bool(txn.closed and txn.pending == 0)

    def close_txn(self, txn: Txn, end_lsn: Lsn) -> None:
        txn.closed = True

    def poll(self, timeout_s: float = 0.0) -> None:
        pass


class EngineCatalog:
    def captured(self) -> list[Table]:
        return [TABLE]

    def shapes(self) -> dict[str, Any]:
        return {}

    def visibility(self) -> ReadSnapshot:
        return ReadSnapshot(frozenset(), 100)

    def committed_invisible(self) -> frozenset[int]:
        return frozenset()

    def check_filter(self, table: Table, where: str) -> str:
        return where

    def close(self) -> None:
        pass


def watermark(content: bytes, lsn: int) -> bytes:
    """A logical message as the worker writes it (pg_logical_emit_message(false, …))."""
    head = struct.pack("!BQ", 0, lsn) + WATERMARK_PREFIX.encode() + b"\x00"
    return b"M" + head + struct.pack("!I", len(content)) + content


def window(*changes: bytes, **postgres: Any) -> list[bytes]:
    """A chunk of ``CHUNK`` asked for, then streamed: its L, one transaction of
    ``changes``, its H. The record keys of the chunk rows published at H."""
    state = SnapshotsState()
    worker, sink = Worker(), ChunkSink()
    engine = IncrementalSnapshots(
        EngineConfig("cdc", "pub", chunk_rows=10),
        state=state,
        save=lambda _: None,
        chunks=worker,
        publisher=sink,
        catalog=EngineCatalog(),
        intake=SignalIntake(Verifier(None, "cdc", "cdc_slot"), state),
    )
    assert engine.requests.request(TABLE)
    engine.tick(0.0)
    assert engine.window_topic == TOPIC, "the chunk is asked for"
    low, high = worker.request.low, worker.request.high
    frames = [xlog(watermark(low, 0x100), 0x100), xlog(begin(0x900), 0x200)]
    frames += [xlog(c, 0x200 + i) for i, c in enumerate([relation(), *changes], 1)]
    frames += [xlog(commit(0x900), 0x900), xlog(watermark(high, 0x910), 0x910)]
    stop = threading.Event()
    settings = Settings(
        postgres=PostgresSettings(slot_name="s", **postgres),
        kafka=KafkaSettings(topic_prefix="cdc", heartbeat_enabled=False),
        schema=SchemaSettings(schemas_enable=False),
    )
    Streamer(
        Replication(frames, stop, 3),  # type: ignore[arg-type]
        settings=settings,
        publisher=Publisher(),  # type: ignore[arg-type]
        encoder=EventEncoder(settings.schema_, "cdc", "db"),
        catalog=Catalog(keyed=True),  # type: ignore[arg-type]
        stop=stop,
        checkpoint=lambda _: None,
        snapshots=engine,
    ).run(Lsn(0x100))
    assert engine.published == 1, "the chunk went out at its H"
    return sink.keys


@pytest.mark.parametrize("op", sorted(CHANGES))
def test_a_skipped_change_leaves_its_key_in_the_chunk(op: str) -> None:
    assert window(CHANGES[op], skipped_operations=op) == [b"1", b"2"]


@pytest.mark.parametrize("op", sorted(CHANGES))
def test_a_published_change_takes_its_key_out_of_the_chunk(op: str) -> None:
    assert window(CHANGES[op], skipped_operations="none") == [b"2"]


@pytest.mark.parametrize("skipped", ["t", "none"])
def test_a_truncate_empties_the_chunk_whether_its_t_event_is_skipped_or_not(
    skipped: str,
) -> None:
    assert window(truncate_message(), skipped_operations=skipped) == []
