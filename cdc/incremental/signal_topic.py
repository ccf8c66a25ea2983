"""The Kafka signal topic (``kafka.signal_topic``, Debezium's ``signal.kafka.topic``).

Records keyed by the topic prefix (as Debezium asks: other keys are ignored) carry a signed
signal (:mod:`cdc.incremental.auth`; the caller verifies it). The reader's group
``cdc-signals.<database>.<slot>`` commits an offset only after the caller has made the
request durable (:meth:`SignalTopic.commit`), so a signal written while the reader is down,
or read just before a crash, runs on the next start.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.cimpl import NewTopic

from cdc.kafka_clients import admin_client, consumer, create_topics
from pgcdc.core.settings import KafkaSettings

log = logging.getLogger(__name__)

BACKLOG_TIMEOUT_S = 15.0  # how long the first poll waits for the records already there


class SignalTopic:
    """Polls the signal topic without blocking; :meth:`commit` after acting on a batch."""

    def __init__(self, kafka: KafkaSettings, topic: str, database: str, slot: str) -> None:
        self.topic = topic
        self._key = kafka.topic_prefix.encode()
        admin = admin_client(kafka)
        if topic not in admin.list_topics(timeout=10).topics:
            create_topics(admin, [NewTopic(topic, 1, kafka.replication_factor)])
        self._consumer: Consumer = consumer(
            kafka,
            f"cdc-signals.{database}.{slot}",
            **{"enable.auto.commit": False, "auto.offset.reset": "earliest"},
        )
        # Assigned, not subscribed: no rebalance to wait for, so the first poll reads what
        # was written while the reader was down (from the group's committed offsets).
        md = self._consumer.list_topics(topic, timeout=10).topics[topic]
        parts = [TopicPartition(topic, p) for p in sorted(md.partitions)]
        committed = self._consumer.committed(parts, timeout=10)
        self._consumer.assign(
            [
                TopicPartition(
                    topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                )
                for tp in committed
            ]
        )
        self._last: Message | None = None
        # Records already there at start (written while the reader was down) are read by
        # the first poll, waiting for them if need be: `--until current` must see them.
        self._backlog = {
            tp.partition: self._consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts
        }

    def poll(self) -> list[tuple[str, bytes]]:
        """(source, value) of the records that arrived since the last call (never waits)."""
        out: list[tuple[str, bytes]] = []
        for msg in self._read():
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("signal topic: %s", err.str(), extra={"topic": self.topic})
                continue
            self._last = msg
            if msg.key() != self._key:
                log.warning(
                    "signal record at offset %d ignored: its key is not the topic prefix %r",
                    msg.offset(),
                    self._key.decode(),
                    extra={"topic": self.topic},
                )
                continue
            value = msg.value()
            if value:
                out.append((f"kafka {self.topic}@{msg.partition()}:{msg.offset()}", value))
        return out

    def _read(self) -> list[Message]:
        if not self._backlog:
            return list(self._consumer.consume(100, 0))
        msgs: list[Message] = []
        deadline = time.monotonic() + BACKLOG_TIMEOUT_S
        while self._backlog and time.monotonic() < deadline:
            for msg in self._consumer.consume(100, 0.2):
                msgs.append(msg)
                part, offset = msg.partition(), msg.offset()
                caught_up = offset is not None and offset + 1 >= self._backlog.get(part or 0, 0)
                if part is not None and caught_up:
                    self._backlog.pop(part, None)
            for tp in self._consumer.position(
                [TopicPartition(self.topic, p) for p in list(self._backlog)]
            ):
                if tp.offset >= self._backlog[tp.partition]:
                    self._backlog.pop(tp.partition, None)
        self._backlog.clear()
        return msgs

    def commit(self) -> None:
        """Everything polled so far has been acted on (and saved): commit its offsets."""
        if self._last is not None:
            self._consumer.commit(message=self._last, asynchronous=False)
            self._last = None

    def close(self) -> None:
        self._consumer.close()
