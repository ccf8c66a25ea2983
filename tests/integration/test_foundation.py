"""The ground every later test stands on: each real server does the one thing we need of it.

These talk to the servers with their plain client libraries, not through our code, so that a
failure here means the stack is broken, not the pipeline.
"""

from __future__ import annotations

import select
import struct
import uuid
from typing import Any

import pytest

from tests.conftest import Endpoints, unique, wait_until

pytestmark = pytest.mark.integration


def _copy_frames(conn: Any, deadline_s: float) -> list[bytes]:
    """Read XLogData payloads from a COPY_BOTH replication stream until the deadline."""
    import time

    pgconn = conn.pgconn
    frames: list[bytes] = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        nbytes, data = pgconn.get_copy_data(1)  # non-blocking
        if nbytes == 0:
            select.select([pgconn.socket], [], [], 0.2)
            pgconn.consume_input()
            continue
        if nbytes < 0:
            break
        buf = bytes(data)
        if buf[:1] == b"w":
            frames.append(buf[25:])  # 'w' + start + end + clock, then the pgoutput message
        if any(f[:1] == b"C" for f in frames):  # a Commit: the transaction is complete
            break
    return frames


def test_pgoutput_change_read_through_logical_slot(pg_database: str) -> None:
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("CREATE PUBLICATION foundation_pub FOR TABLE items")

    slot = unique("slot")
    repl = psycopg.connect(pg_database, autocommit=True, replication="database")
    try:
        row = repl.execute(f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput").fetchone()
        assert row is not None and row[0] == slot

        marker = uuid.uuid4().hex
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (1, %s)", (marker,))

        repl.execute(
            f"START_REPLICATION SLOT {slot} LOGICAL 0/0 "
            "(proto_version '1', publication_names 'foundation_pub')"
        )
        frames = _copy_frames(repl, deadline_s=30)
    finally:
        repl.close()

    kinds = [f[:1] for f in frames]
    assert b"R" in kinds, f"no Relation message in {kinds}"
    assert b"I" in kinds, f"no Insert message in {kinds}"
    relation = next(f for f in frames if f[:1] == b"R")
    assert b"items\x00" in relation
    insert = next(f for f in frames if f[:1] == b"I")
    # 'I', relation oid, 'N', column count, then ('t', length, text) per column.
    ncols = struct.unpack_from("!h", insert, 6)[0]
    assert ncols == 2
    assert insert[8:9] == b"t"
    first_len = struct.unpack_from("!i", insert, 9)[0]
    assert insert[13 : 13 + first_len] == b"1"
    assert marker.encode() in insert


def test_compacted_topic_produce_and_consume(endpoints: Endpoints, topic_prefix: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from cdc.table_topics import cleanup_policy

    topic = f"{topic_prefix}.public.things"
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(
                topic, num_partitions=1, replication_factor=1, config={"cleanup.policy": "compact"}
            )
        ]
    )
    futures[topic].result(timeout=30)
    # The reader's own read of it, which waits out a topic created a moment ago that the
    # answering broker does not know yet (UNKNOWN_TOPIC_OR_PART: CI failed on that race once).
    assert cleanup_policy(endpoints.kafka_bootstrap, topic) == "compact"

    producer = Producer(
        {"bootstrap.servers": endpoints.kafka_bootstrap, "acks": "all", "enable.idempotence": True}
    )
    sent = {f"k{i}".encode(): f"v{i}".encode() for i in range(10)}
    for k, v in sent.items():
        producer.produce(topic, key=k, value=v)
    producer.produce(topic, key=b"k0", value=None)  # a tombstone
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": endpoints.kafka_bootstrap,
            "group.id": unique("g"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[tuple[bytes, bytes | None]] = []

    def read_all() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append((msg.key(), msg.value()))
        return len(got) == 11

    try:
        wait_until(read_all, timeout=60, interval=0, what="11 records")
    finally:
        consumer.close()
    assert got[:10] == list(sent.items())
    assert got[10] == (b"k0", None)


def test_redis_set_and_get(endpoints: Endpoints, key_prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(endpoints.redis_url)
    key = f"{key_prefix}:greeting"
    assert r.set(key, "hello") is True
    assert r.get(key) == b"hello"
    r.close()


def test_opensearch_full_text_query(endpoints: Endpoints, index_prefix: str) -> None:
    from opensearchpy import OpenSearch

    client = OpenSearch(endpoints.search_url)
    index = f"{index_prefix}-docs"
    client.indices.create(
        index=index, body={"settings": {"number_of_shards": 1, "number_of_replicas": 0}}
    )
    client.index(
        index=index, id="1", body={"title": "Stainless steel kettle", "body": "boils water quickly"}
    )
    client.index(index=index, id="2", body={"title": "Cast iron pan", "body": "heavy and slow"})
    client.indices.refresh(index=index)
    hits = client.search(index=index, body={"query": {"match": {"body": "water"}}})["hits"]
    assert [h["_id"] for h in hits["hits"]] == ["1"]
    client.close()


@pytest.mark.spark
@pytest.mark.slow
def test_spark_structured_streaming_reads_kafka(
    endpoints: Endpoints, topic_prefix: str, spark: Any, tmp_path: Any
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"{topic_prefix}.public.stream"
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(
        timeout=30
    )
    producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap})
    expected = {f"key-{i}": f"value-{i}" for i in range(50)}
    for k, v in expected.items():
        producer.produce(topic, key=k.encode(), value=v.encode())
    assert producer.flush(30) == 0

    name = unique("q")
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v")
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300), "the available-now query did not finish"
    assert query.exception() is None
    rows = {r["k"]: r["v"] for r in spark.sql(f"SELECT k, v FROM {name}").collect()}
    assert rows == expected
