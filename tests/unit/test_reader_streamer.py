"""The streaming loop without servers: pgoutput frames in, records and acknowledgments out.

:class:`cdc.streamer.Streamer` gets every dependency from its caller, so these tests hand it
a scripted replication connection, a publisher that keeps records in a list (Kafka
acknowledges each at once), a stand-in encoder and catalog, and a recording observer.
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from cdc import pgoutput, streamer
from cdc.publisher import AckQueue, TxnTracker
from cdc.replication import Keepalive, XLogData
from cdc.streamer import Streamer
from pgcdc.core.contract import HEADER_COMMIT_LSN, HEADER_ORDER, HEARTBEAT_LSN_FIELD
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import KafkaSettings, PostgresSettings, SchemaSettings, Settings
from schemas.model import Column, PgType, TableSchema

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def acknowledge_every_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Acknowledge on every turn of the loop, not every 0.2 s: the outcome does not depend
    on how fast the machine runs the test."""
    monkeypatch.setattr(streamer, "ACK_INTERVAL_S", 0.0)


TEXT = PgType(25, "text", "b")
INT4 = PgType(23, "int4", "b")
RELATION_ID = 16384
TOPIC = "cdc.public.items"

# --- pgoutput frames, as the server sends them -----------------------------------------------


def begin(final_lsn: int, xid: int) -> bytes:
    return b"B" + struct.pack("!QqI", final_lsn, 0, xid)


def commit(commit_lsn: int, end_lsn: int) -> bytes:
    return b"C" + struct.pack("!BQQq", 0, commit_lsn, end_lsn, 0)


def relation() -> bytes:
    cols = b"".join(
        struct.pack("!B", flags) + name + b"\x00" + struct.pack("!Ii", oid, -1)
        for flags, name, oid in ((1, b"id", INT4.oid), (0, b"v", TEXT.oid))
    )
    head = struct.pack("!I", RELATION_ID) + b"public\x00items\x00d" + struct.pack("!H", 2)
    return b"R" + head + cols


def tuple_data(*values: str) -> bytes:
    out = struct.pack("!H", len(values))
    for v in values:
        raw = v.encode()
        out += b"t" + struct.pack("!I", len(raw)) + raw
    return out


def insert(*values: str) -> bytes:
    return b"I" + struct.pack("!I", RELATION_ID) + b"N" + tuple_data(*values)


def delete(key: str) -> bytes:
    return b"D" + struct.pack("!I", RELATION_ID) + b"K" + tuple_data(key, "")


def xlog(payload: bytes, at: int) -> XLogData:
    return XLogData(Lsn(at), Lsn(at), 0, payload)


# --- stand-ins for the streamer's dependencies -----------------------------------------------


class ScriptedReplication:
    """Hands out the scripted frames, then nothing; sets ``stop`` once they are all read
    (after ``idle_reads`` empty reads), so a test ends without sleeping."""

    def __init__(
        self, frames: Sequence[XLogData | Keepalive], stop: threading.Event | None, idle_reads: int
    ) -> None:
        self.frames = deque(frames)
        self.stop = stop
        self.idle_reads = idle_reads
        self.acknowledged: list[Lsn] = []
        self.reads = 0
        self.timeouts: list[float] = []  # each read's timeout, in order

    def read(self, timeout_s: float) -> XLogData | Keepalive | None:
        self.reads += 1
        self.timeouts.append(timeout_s)
        assert self.reads < 1_000, "the loop never ended"
        if self.frames:
            return self.frames.popleft()
        self.idle_reads -= 1
        if self.idle_reads <= 0 and self.stop is not None:
            self.stop.set()
        return None

    def acknowledge(self, lsn: Lsn) -> None:
        self.acknowledged.append(lsn)

    def request_keepalive(self) -> None:
        """The server's answer to a status update with the reply flag: a keepalive at the
        position decoding reached (``server_position``, when a test sets one)."""
        self.asked += 1
        if self.server_position is not None:
            self.frames.append(Keepalive(self.server_position, 0, False))

    asked = 0
    server_position: Lsn | None = None


class ListPublisher:
    """Keeps records in order; Kafka acknowledges each record as it is sent."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None, dict[str, Any]]] = []
        self.plain: list[tuple[str, bytes | None, bytes | None]] = []
        self.topics: list[str] = []
        self._acks = AckQueue()
        self.hurried_after: list[int] = []  # records sent when each hurry() came
        self.transactional_id: str | None = None  # at least once (kafka.exactly_once off)
        self.auto_commit = True

    def ensure_topics(self, topics: Sequence[str], partitions: int | None = None) -> None:
        self.topics.extend(topics)

    def begin(self, commit_lsn: Lsn) -> TxnTracker:
        txn = TxnTracker(self, commit_lsn)  # type: ignore[arg-type]
        self._acks.append(txn)
        return txn

    def send(
        self,
        txn: TxnTracker,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, Any]],
    ) -> None:
        self.records.append((topic, key, value, dict(headers)))

    def holds(self, txn: TxnTracker) -> bool:
        return bool(txn.closed and txn.pending == 0)

    def close_txn(self, txn: TxnTracker, end_lsn: Lsn) -> None:
        txn.end_lsn = end_lsn
        txn.closed = True

    def poll(self, timeout_s: float = 0.0) -> None:
        pass

    def acked_lsn(self) -> Lsn | None:
        return self._acks.advance()

    def idle(self) -> bool:
        self._acks.advance()
        return len(self._acks) == 0

    def flush(self, timeout_s: float = 60.0) -> None:
        pass

    def hurry(self, timeout_s: float = 0.005) -> bool:
        self.hurried_after.append(len(self.records))
        return False  # everything is acknowledged at once here

    def settle(self, timeout_s: float = 60.0) -> None:
        self.flush(timeout_s)

    def produce_plain(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self.plain.append((topic, key, value))


class JsonEncoder:
    """Just enough of the event encoder: the key is the id, the value names op and rows."""

    def topic(self, table: TableSchema) -> str:
        return f"cdc.{table.schema}.{table.table}"

    def encode_key(self, table: TableSchema, row: Sequence[Any]) -> bytes:
        return orjson.dumps({"id": row[0]})

    def encode_change(
        self, table: TableSchema, op: str, before: Any, after: Any, source: Any, txn: Any
    ) -> tuple[bytes, bytes]:
        row = after if after is not None else before
        return self.encode_key(table, row), self.encode_value(table, op, before, after, source, txn)

    def encode_value(
        self, table: TableSchema, op: str, before: Any, after: Any, source: Any, txn: Any
    ) -> bytes:
        return orjson.dumps({"op": op, "before": before, "after": after, "lsn": source.lsn})


class RelationCatalog:
    """Table schemas straight from Relation messages (no pg_catalog behind it)."""

    conn: Any = None

    def from_relation(self, rel: pgoutput.Relation) -> TableSchema:
        types = {TEXT.oid: TEXT, INT4.oid: INT4}
        columns = tuple(
            Column(c.name, types[c.type_oid], c.type_modifier, not c.is_key, c.is_key)
            for c in rel.columns
        )
        keys = tuple(c.name for c in rel.columns if c.is_key)
        return TableSchema(rel.namespace, rel.name, columns, keys, rel.replica_identity)


class RecordingObserver:
    measures_lag = False

    def __init__(self) -> None:
        self.events: list[str] = []
        self.acknowledged: list[Lsn] = []

    def on_event(self, op: str) -> None:
        self.events.append(op)

    def on_acknowledged(self, lsn: Lsn) -> None:
        self.acknowledged.append(lsn)

    def on_lag(self, lag_bytes: int) -> None:
        raise AssertionError("lag is measured only when the observer asks for it")


def settings(heartbeats: bool = False) -> Settings:
    return Settings(
        postgres=PostgresSettings(slot_name="s"),
        kafka=KafkaSettings(topic_prefix="cdc", heartbeat_enabled=heartbeats),
        schema=SchemaSettings(),
    )


def make(
    frames: Sequence[XLogData | Keepalive],
    *,
    target: Lsn | None = None,
    heartbeats: bool = False,
    idle_reads: int = 3,
    checkpoints: list[Lsn | None] | None = None,
    encoder: JsonEncoder | None = None,
    last_commit: Lsn | None = None,
    publisher: ListPublisher | None = None,
) -> tuple[Streamer, ScriptedReplication, ListPublisher, RecordingObserver]:
    stop = threading.Event()
    repl = ScriptedReplication(frames, None if target else stop, idle_reads)
    publisher = publisher or ListPublisher()
    observer = RecordingObserver()
    s = Streamer(
        repl,  # type: ignore[arg-type]
        settings=settings(heartbeats),
        publisher=publisher,  # type: ignore[arg-type]
        encoder=encoder or JsonEncoder(),  # type: ignore[arg-type]
        catalog=RelationCatalog(),  # type: ignore[arg-type]
        stop=stop,
        checkpoint=(checkpoints if checkpoints is not None else []).append,
        observer=observer,
        target=target,
        last_commit=last_commit,
    )
    return s, repl, publisher, observer


ONE_TRANSACTION = [
    xlog(begin(0x200, 7), 0x100),
    xlog(relation(), 0x100),
    xlog(insert("1", "a"), 0x110),
    xlog(delete("2"), 0x120),
    xlog(commit(0x200, 0x210), 0x200),
]


def test_a_transaction_becomes_records_in_order_and_is_acknowledged_at_its_end() -> None:
    s, repl, publisher, observer = make(ONE_TRANSACTION)
    s.run(Lsn(0x100))
    assert publisher.topics == [TOPIC]
    assert [(t, k, v is None) for t, k, v, _ in publisher.records] == [
        (TOPIC, b'{"id":"1"}', False),
        (TOPIC, b'{"id":"2"}', False),
        (TOPIC, b'{"id":"2"}', True),  # the delete's tombstone
    ]
    headers = [h for *_, h in publisher.records]
    assert [h[HEADER_COMMIT_LSN] for h in headers] == [str(0x200).encode()] * 3
    assert [h[HEADER_ORDER] for h in headers] == [b"0", b"1", b"2"]
    created = orjson.loads(publisher.records[0][2] or b"")
    assert created == {"op": "c", "before": None, "after": ["1", "a"], "lsn": 0x110}
    assert s.events == 2 and observer.events == ["c", "d"]
    assert s.last_ack == Lsn(0x210)
    assert repl.acknowledged[-1] == Lsn(0x210)
    assert observer.acknowledged[-1] == Lsn(0x210)


def test_records_of_a_committed_transaction_are_hurried_to_kafka_once_the_source_is_idle() -> None:
    two = [
        *ONE_TRANSACTION,
        xlog(begin(0x300, 8), 0x220),
        xlog(insert("3", "c"), 0x230),
        xlog(commit(0x300, 0x310), 0x300),
    ]
    s, repl, publisher, _ = make(two, idle_reads=3)
    s.run(Lsn(0x100))
    # After each Commit the loop polls (timeout 0) instead of waiting; the second
    # transaction was already there, so only one hurry, when the poll found nothing.
    commits = [i for i, f in enumerate(two) if bytes(f.payload[:1]) == b"C"]
    assert [repl.timeouts[i + 1] for i in commits] == [0.0, 0.0]
    assert publisher.hurried_after == [4]
    # Nothing left to hurry: back to waiting reads.
    assert repl.timeouts[len(two) + 1 :] == [streamer.READ_TIMEOUT_S] * 2


def test_a_transaction_without_records_is_not_hurried() -> None:
    empty = [xlog(begin(0x200, 7), 0x100), xlog(commit(0x200, 0x210), 0x200)]
    s, repl, publisher, _ = make(empty)
    s.run(Lsn(0x100))
    assert publisher.hurried_after == [] and 0.0 not in repl.timeouts


def test_an_open_transaction_is_not_acknowledged_when_stopped() -> None:
    s, repl, publisher, _ = make(ONE_TRANSACTION[:-1])
    s.run(Lsn(0x100))
    assert len(publisher.records) == 3
    assert s.last_ack == Lsn(0x100)
    assert repl.acknowledged == [Lsn(0x100)]  # the start position, forced on the way out


def test_an_idle_keepalive_position_is_acknowledged() -> None:
    s, repl, _, _ = make([Keepalive(Lsn(0x500), 0, False)])
    s.run(Lsn(0x100))
    assert s.last_ack == Lsn(0x500) and repl.acknowledged[-1] == Lsn(0x500)


def test_a_keepalive_inside_a_transaction_is_not_acknowledged() -> None:
    s, _, _, _ = make([*ONE_TRANSACTION[:3], Keepalive(Lsn(0x500), 0, False)])
    s.run(Lsn(0x100))
    assert s.last_ack == Lsn(0x100)


def test_until_a_target_the_loop_returns_once_it_is_acknowledged() -> None:
    s, repl, _, _ = make(ONE_TRANSACTION, target=Lsn(0x210))
    s.run(Lsn(0x100))  # nothing sets the stop signal: only reaching the target ends the run
    assert s.last_ack == Lsn(0x210) and repl.acknowledged[-1] == Lsn(0x210)


def test_an_idle_reader_before_its_target_asks_the_server_where_decoding_stands() -> None:
    # Nothing to stream: only the keepalive it asks for (not the server's own, 30 s away)
    # tells the reader that the WAL up to the target held nothing for it.
    s, repl, _, _ = make([], target=Lsn(0x900))
    repl.server_position = Lsn(0x900)
    s.run(Lsn(0x100))
    assert repl.asked == 1 and s.last_ack == Lsn(0x900)


def test_heartbeats_carry_the_acknowledged_position_up_to_the_last() -> None:
    s, _, publisher, _ = make(ONE_TRANSACTION, heartbeats=True)
    s.run(Lsn(0x100))
    assert "__cdc-heartbeat.cdc" in publisher.topics
    assert publisher.plain, "no heartbeat"
    topic, key, value = publisher.plain[-1]
    assert topic == "__cdc-heartbeat.cdc" and key is not None
    assert orjson.loads(value or b"")[HEARTBEAT_LSN_FIELD] == 0x210


def test_the_checkpoint_receives_the_acknowledged_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(streamer, "STATE_INTERVAL_S", 0.0)
    saved: list[Lsn | None] = []
    s, _, _, _ = make(ONE_TRANSACTION, checkpoints=saved)
    s.run(Lsn(0x100))
    assert saved and saved[0] == Lsn(0x100) and saved[-1] == Lsn(0x210)


class SequenceEncoder(JsonEncoder):
    """The value says the change's LSN and its source.sequence[0] (the last commit's end)."""

    def encode_value(
        self, table: TableSchema, op: str, before: Any, after: Any, source: Any, txn: Any
    ) -> bytes:
        return orjson.dumps({"lsn": source.lsn, "last_commit": source.last_commit_lsn})


SECOND_TRANSACTION = [
    xlog(begin(0x400, 8), 0x300),
    xlog(insert("3", "c"), 0x310),
    xlog(commit(0x400, 0x410), 0x400),
]


def test_the_first_transaction_after_a_restart_says_where_the_last_commit_ended() -> None:
    # Debezium's source.sequence[0]: the pipeline passes the commit it knows from the state.
    s, _, publisher, _ = make(
        [*ONE_TRANSACTION, *SECOND_TRANSACTION], encoder=SequenceEncoder(), last_commit=Lsn(0x90)
    )
    s.run(Lsn(0x100))
    values = [orjson.loads(v) for _, _, v, _ in publisher.records if v is not None]
    assert [v["last_commit"] for v in values] == [0x90, 0x90, 0x210]
    assert s.acked_commit == Lsn(0x410)


def test_the_acknowledged_commit_is_a_commit_not_an_idle_or_snapshot_position() -> None:
    # What the state records for the next start: the last commit Kafka holds, though the slot
    # is confirmed further (an idle keepalive), and never a snapshot's position (the
    # snapshot's records were tracked by the same publisher).
    publisher = ListPublisher()
    snapshot = publisher.begin(Lsn(0x80))
    publisher.close_txn(snapshot, Lsn(0x80))
    s, _, _, _ = make([Keepalive(Lsn(0x90), 0, False)], publisher=publisher)
    s.run(Lsn(0x80))
    assert s.last_ack == Lsn(0x90) and s.acked_commit is None
    s, _, _, _ = make([*ONE_TRANSACTION, Keepalive(Lsn(0x500), 0, False)])
    s.run(Lsn(0x100))
    assert s.last_ack == Lsn(0x500) and s.acked_commit == Lsn(0x210)
