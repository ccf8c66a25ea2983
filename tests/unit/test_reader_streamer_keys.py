"""The streaming loop's keys, without servers: a TOASTed key left unchanged keeps its value,
a keyless table's records have null keys, unchanged columns are named in a header, a
TRUNCATE deletes every live key inside its transaction's order, skipped operations are left
out. Uses the real event encoder; Kafka is the list publisher of test_reader_streamer."""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from cdc import pgoutput, streamer, table_topics, truncate
from cdc.live_keys import LiveKeys
from cdc.streamer import Streamer
from pgcdc.core.contract import HEADER_ORDER, HEADER_UNCHANGED, decode_unchanged_header
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import KafkaSettings, PostgresSettings, SchemaSettings, Settings
from schemas.envelope import EventEncoder
from schemas.model import Column, PgType, TableSchema
from tests.unit.test_reader_streamer import ListPublisher, ScriptedReplication, xlog

pytestmark = pytest.mark.unit

TEXT = PgType(25, "text", "b")
RID = 16384
TOPIC = "cdc.public.items"


@pytest.fixture(autouse=True)
def no_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streamer, "ACK_INTERVAL_S", 0.0)
    monkeypatch.setattr(table_topics, "cleanup_policy", lambda *_: "delete")


class Replication(ScriptedReplication):
    def keep_alive(self) -> None:
        pass


class Publisher(ListPublisher):
    def ensure_topics(
        self, topics: Sequence[str], partitions: int | None = None, config: Any = None
    ) -> None:
        self.topics.extend(topics)

    def on(self, topic: str) -> list[tuple[bytes | None, dict[str, Any] | None, dict[str, Any]]]:
        """(key, value, headers) of the records written to ``topic``."""
        return [
            (k, None if v is None else orjson.loads(v), h)
            for t, k, v, h in self.records
            if t == topic
        ]


class Catalog:
    """One table, keyed (``id``) or keyless."""

    conn: Any = None

    def __init__(self, keyed: bool) -> None:
        self.keyed = keyed

    def from_relation(self, rel: pgoutput.Relation) -> TableSchema:
        cols = tuple(
            Column(c.name, TEXT, -1, not (self.keyed and c.name == "id"), c.name == "id")
            for c in rel.columns
        )
        keys = ("id",) if self.keyed else ()
        return TableSchema(rel.namespace, rel.name, cols, keys, rel.replica_identity)


def relation(identity: bytes = b"d") -> bytes:
    cols = b"".join(
        struct.pack("!B", flags) + name + b"\x00" + struct.pack("!Ii", TEXT.oid, -1)
        for flags, name in ((1, b"id"), (0, b"v"))
    )
    return b"R" + struct.pack("!I", RID) + b"public\x00items\x00" + identity + b"\x00\x02" + cols


def tuple_data(*values: str | None) -> bytes:
    """Column values: text, None for a NULL (or a column the old key leaves out), or
    "<unchanged>" for an unchanged TOAST value."""
    out = struct.pack("!H", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "<unchanged>":
            out += b"u"
        else:
            out += b"t" + struct.pack("!I", len(v.encode())) + v.encode()
    return out


def begin(final: int) -> bytes:
    return b"B" + struct.pack("!QqI", final, 0, 9)


def commit(final: int) -> bytes:
    return b"C" + struct.pack("!BQQq", 0, final, final + 8, 0)


def insert(*values: str | None) -> bytes:
    return b"I" + struct.pack("!I", RID) + b"N" + tuple_data(*values)


def update(old_kind: bytes, old: tuple[str | None, ...], *new: str | None) -> bytes:
    head = b"U" + struct.pack("!I", RID)
    return head + old_kind + tuple_data(*old) + b"N" + tuple_data(*new)


def delete(kind: bytes, *old: str | None) -> bytes:
    return b"D" + struct.pack("!I", RID) + kind + tuple_data(*old)


def truncate_message() -> bytes:
    return b"T" + struct.pack("!IBI", 1, 0, RID)


def run(
    *changes: bytes,
    keyed: bool = True,
    publisher: Publisher | None = None,
    captured: set[tuple[str, str]] | None = None,
    **postgres: Any,
) -> tuple[Publisher, Streamer]:
    frames = [xlog(begin(0x900), 0x100), xlog(relation(), 0x100)]
    frames += [xlog(c, 0x100 + i) for i, c in enumerate(changes, 1)]
    frames.append(xlog(commit(0x900), 0x900))
    stop = threading.Event()
    publisher = publisher or Publisher()
    settings = Settings(
        postgres=PostgresSettings(slot_name="s", **postgres),
        kafka=KafkaSettings(topic_prefix="cdc", heartbeat_enabled=False),
        schema=SchemaSettings(schemas_enable=False),
    )
    s = Streamer(
        Replication(frames, stop, 3),  # type: ignore[arg-type]
        settings=settings,
        publisher=publisher,  # type: ignore[arg-type]
        encoder=EventEncoder(settings.schema_, "cdc", "db"),
        catalog=Catalog(keyed),  # type: ignore[arg-type]
        stop=stop,
        checkpoint=lambda _: None,
        captured=captured,
    )
    s.run(Lsn(0x100))
    return publisher, s


def test_a_toasted_key_left_unchanged_takes_its_value_from_the_old_key() -> None:
    big = "k" * 5000
    publisher, _ = run(update(b"K", (big, None), "<unchanged>", "b"))
    [(key, value, headers)] = publisher.on(TOPIC)
    assert key == orjson.dumps({"id": big}) and value is not None
    assert value["op"] == "u" and value["after"] == {"id": big, "v": "b"}
    assert HEADER_UNCHANGED not in headers


def test_a_keyless_tables_delete_has_a_null_key_and_a_tombstone() -> None:
    publisher, _ = run(insert("1", "a"), delete(b"O", "1", "a"), keyed=False)
    records = publisher.on(TOPIC)
    assert [(k, v and v["op"]) for k, v, _ in records] == [(None, "c"), (None, "d"), (None, None)]


def test_unchanged_columns_are_named_in_a_header() -> None:
    publisher, _ = run(
        update(b"K", ("1", None), "1", "<unchanged>"), complete_unchanged_toast=False
    )
    [(_, value, headers)] = publisher.on(TOPIC)
    assert value is not None and value["after"]["v"] == "__debezium_unavailable_value"
    assert decode_unchanged_header(headers[HEADER_UNCHANGED]) == {"v"}


def test_a_truncate_deletes_every_live_key_between_what_came_before_and_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    publisher = Publisher()

    def scan(bootstrap: str, topic: str, before: Any, tick: Any = None) -> LiveKeys:
        # The topic as Kafka holds it once flushed: an older row, then this transaction's.
        store = LiveKeys()
        written = [(k, v is not None) for k, v, _ in publisher.on(topic)]
        store.load([(b'{"id":"0"}', True), *written])
        return store

    monkeypatch.setattr(truncate, "keys_live_before", scan)
    _, s = run(
        insert("1", "a"),
        truncate_message(),
        insert("2", "b"),
        publisher=publisher,
        skipped_operations="none",
    )
    records = publisher.on(TOPIC)
    summary = [(k, v and v["op"], int(h[HEADER_ORDER])) for k, v, h in records]
    assert summary == [
        (b'{"id":"1"}', "c", 0),
        (b'{"id":"0"}', "d", 1),  # every record of the truncate carries its one order
        (b'{"id":"0"}', None, 1),
        (b'{"id":"1"}', "d", 1),
        (b'{"id":"1"}', None, 1),
        (b'{"id":"2"}', "c", 2),
    ]
    assert records[1][1] is not None and records[1][1]["before"] == {"id": "0", "v": None}
    [(key, t_event, headers)] = publisher.on("cdc.__cdc_truncates")
    assert key == b'"public.items"' and t_event is not None and t_event["op"] == "t"
    assert headers[HEADER_ORDER] == b"1"
    assert s.events == 2 + 2 + 1  # two creates, two deletes, one truncate


@pytest.mark.parametrize("live", [[], [b'{"id":"0"}'], [b'{"id":"0"}', b'{"id":"7"}']])
def test_a_truncate_takes_one_order_however_many_keys_it_deletes(
    monkeypatch: pytest.MonkeyPatch, live: list[bytes]
) -> None:
    """A replayed truncate deletes fewer keys than the first run (those the first run's
    later records made newer): the transaction's later records keep their orders, or one
    could lose to a record of the first run in a follower rebuilt from compaction."""
    publisher = Publisher()

    def scan(bootstrap: str, topic: str, before: Any, tick: Any = None) -> LiveKeys:
        store = LiveKeys()
        store.load([(k, True) for k in live])
        return store

    monkeypatch.setattr(truncate, "keys_live_before", scan)
    run(insert("1", "a"), truncate_message(), insert("2", "b"), publisher=publisher)
    records = publisher.on(TOPIC)
    assert len(records) == 2 + 2 * len(live)
    assert [int(h[HEADER_ORDER]) for _k, _v, h in records] == [0, *[1] * 2 * len(live), 2]


def test_skipped_operations_are_left_out() -> None:
    publisher, _ = run(
        insert("1", "a"), update(b"K", ("1", None), "1", "b"), skipped_operations="c,u"
    )
    assert publisher.on(TOPIC) == []


def test_a_table_that_joins_while_streaming_is_named_in_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run(insert("1", "a"), relation(), insert("2", "b"), captured=set())
    warned = [r for r in caplog.records if "joined the captured tables" in r.getMessage()]
    assert len(warned) == 1 and "public.items" in warned[0].getMessage()
    assert "NOT snapshotted" in warned[0].getMessage()
    caplog.clear()
    run(insert("1", "a"), captured={("public", "items")})
    assert not [r for r in caplog.records if "joined the captured tables" in r.getMessage()]
