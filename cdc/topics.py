"""``cdc topic tail`` and ``cdc topic send``: look at a topic's newest records, or write one,
with the project's own Kafka settings (brokers, TLS, SASL), so nothing else (kcat, Kafka's
console tools) is needed.

A missing or empty topic is said in words (the dead-letter topic, for one, exists only once
something was dead-lettered).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer, TopicPartition

from cdc.kafka_clients import (
    client_conf,
    cluster_metadata,
    consumer,
    offset_bounds,
    read_assigned,
)
from pgcdc.core.errors import PublishError
from pgcdc.core.settings import KafkaSettings


@dataclass(frozen=True)
class TopicRecord:
    """One record as read back: where it is, when it was written, and its bytes."""

    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    @staticmethod
    def of(msg: Message) -> TopicRecord:
        kind, ts = msg.timestamp()
        raw = msg.headers() or []
        pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
        return TopicRecord(
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            timestamp_ms=ts if kind != 0 else None,  # 0: TIMESTAMP_NOT_AVAILABLE
            key=msg.key(),
            value=msg.value(),
            headers=tuple((k, v.encode() if isinstance(v, str) else v) for k, v in pairs),
        )

    def render(self) -> str:
        """Two lines: where, when, the key and headers; then the value (or ``(tombstone)``)."""
        when = (
            dt.datetime.fromtimestamp(self.timestamp_ms / 1000, dt.UTC).isoformat(
                timespec="milliseconds"
            )
            if self.timestamp_ms is not None
            else "-"
        )
        headers = " ".join(f"{k}={_text(v)}" for k, v in self.headers)
        head = f"partition {self.partition} offset {self.offset} at {when} key {_text(self.key)}"
        value = "(tombstone)" if self.value is None else _text(self.value)
        return f"{head}{'  headers ' + headers if headers else ''}\n{value}"


def _text(data: bytes | None) -> str:
    """Bytes as text: UTF-8 where it is, escapes where it is not (Avro, binary keys)."""
    if data is None:
        return "null"
    return data.decode("utf-8", errors="backslashreplace")


@dataclass(frozen=True)
class Tail:
    """What ``tail`` found: the records, or why there are none."""

    topic: str
    exists: bool
    total: int  # records the topic holds now (end offsets minus start offsets)
    records: list[TopicRecord]

    def summary(self) -> str:
        if not self.exists:
            return f"topic {self.topic} does not exist"
        if self.total == 0:
            return f"topic {self.topic} is empty"
        return f"topic {self.topic}: the newest {len(self.records)} of {self.total} records"


def tail(kafka: KafkaSettings, topic: str, last: int, timeout_s: float = 10.0) -> Tail:
    """The newest ``last`` records of ``topic`` across its partitions, oldest first."""
    reader = consumer(
        kafka,
        "cdc-topic-tail",
        **{"enable.auto.commit": False, "enable.partition.eof": True},
    )
    try:
        md = cluster_metadata(reader, kafka.bootstrap_servers, timeout_s=5)
        if topic not in md.topics:
            return Tail(topic, False, 0, [])
        starts: list[TopicPartition] = []
        ends: dict[int, int] = {}
        total = 0
        for p in sorted(md.topics[topic].partitions):
            low, high = offset_bounds(reader, TopicPartition(topic, p), timeout_s=5)
            total += high - low
            if high > low:
                starts.append(TopicPartition(topic, p, max(low, high - last)))
                ends[p] = high
        if not starts:
            return Tail(topic, True, 0, [])
        reader.assign(starts)
        records = sorted(
            (TopicRecord.of(m) for m in read_assigned(reader, topic, ends, timeout_s)),
            key=lambda r: (r.timestamp_ms or 0, r.partition, r.offset),
        )
        return Tail(topic, True, total, records[-last:] if last else [])
    finally:
        reader.close()


def send(kafka: KafkaSettings, topic: str, key: bytes | None, value: bytes) -> tuple[int, int]:
    """Write one record and wait for Kafka's acknowledgment; its (partition, offset)."""
    result: list[Message] = []
    failed: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(err.str())
        else:
            result.append(msg)

    producer = Producer(client_conf(kafka, acks="all", **{"linger.ms": 0}))
    md = cluster_metadata(producer, kafka.bootstrap_servers, timeout_s=5)  # a line if down
    if topic not in md.topics:
        raise PublishError(
            f"topic {topic} does not exist (the reader creates its topics, and "
            "kafka.signal_topic, when it starts; the brokers may not create topics on a write)"
        )
    producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    if producer.flush(10) != 0 or failed:
        raise PublishError(
            f"Kafka did not take the record for {topic}: {failed[0] if failed else 'timed out'}"
        )
    msg = result[0]
    return msg.partition() or 0, msg.offset() or 0
