"""The reader's durable state: one record per slot in a compacted Kafka topic.

It lives next to the data (``<prefix>.__cdc_state``) rather than on the reader's disk, so a
reader that loses its disk still knows that its slot was used and can refuse to re-snapshot
silently. The record says which phase the slot is in and the last LSN Kafka acknowledged.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from cdc.publisher import rdkafka_log, watermarks
from pgcdc.core.contract import state_topic
from pgcdc.core.errors import PublishError
from pgcdc.core.lsn import Lsn

log = logging.getLogger(__name__)


class Phase(enum.StrEnum):
    SNAPSHOT = "snapshot"  # slot created, snapshot running (not yet streamed from)
    STREAMING = "streaming"  # snapshot complete (or none needed); the slot holds our position
    SNAPSHOT_ONLY_DONE = "snapshot_only_done"  # initial_only finished


@dataclass(frozen=True)
class ReaderState:
    """What the reader must remember about one slot across restarts and disk loss."""

    slot: str
    database: str
    phase: Phase
    consistent_point: Lsn | None = None
    acked_lsn: Lsn | None = None
    updated_at: float = 0.0

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "slot": self.slot,
                "database": self.database,
                "phase": self.phase.value,
                "consistent_point": str(self.consistent_point) if self.consistent_point else None,
                "acked_lsn": str(self.acked_lsn) if self.acked_lsn else None,
                "updated_at": self.updated_at,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> ReaderState:
        d: dict[str, Any] = orjson.loads(data)
        return cls(
            slot=d["slot"],
            database=d["database"],
            phase=Phase(d["phase"]),
            consistent_point=Lsn.parse(d["consistent_point"])
            if d.get("consistent_point")
            else None,
            acked_lsn=Lsn.parse(d["acked_lsn"]) if d.get("acked_lsn") else None,
            updated_at=float(d.get("updated_at", 0.0)),
        )


class StateStore:
    """Reads and writes :class:`ReaderState` records keyed by ``<database>/<slot>``."""

    def __init__(self, bootstrap_servers: str, topic_prefix: str, replication_factor: int = 1):
        self._bootstrap = bootstrap_servers
        self.topic = state_topic(topic_prefix)
        self._rf = replication_factor
        self._producer: Producer | None = None

    @staticmethod
    def key(database: str, slot: str) -> bytes:
        return f"{database}/{slot}".encode()

    def ensure_topic(self) -> None:
        """Create the compacted state topic if it is missing."""
        conf: dict[str, Any] = {"bootstrap.servers": self._bootstrap, "logger": rdkafka_log}
        admin = AdminClient(conf)
        if self.topic in admin.list_topics(timeout=10).topics:
            return
        new = NewTopic(self.topic, 1, self._rf, config={"cleanup.policy": "compact"})
        for fut in admin.create_topics([new], operation_timeout=30).values():
            try:
                fut.result()
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise PublishError(f"cannot create state topic {self.topic}: {e}") from e

    def load(self, database: str, slot: str, timeout_s: float = 15.0) -> ReaderState | None:
        """The latest state record for the slot, or None if there is none (or it was reset)."""
        key = self.key(database, slot)
        consumer = Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": "cdc-state-reader",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "logger": rdkafka_log,
            }
        )
        try:
            md = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if md is None or md.error is not None or not md.partitions:
                return None
            parts = sorted(md.partitions)
            ends: dict[int, int] = {}
            for p in parts:
                low, high = watermarks(consumer, TopicPartition(self.topic, p), 30.0)
                if high > low:
                    ends[p] = high
            if not ends:
                return None
            consumer.assign([TopicPartition(self.topic, p, 0) for p in ends])
            latest: bytes | None = None
            found = False
            deadline = time.monotonic() + timeout_s
            done: set[int] = set()
            while len(done) < len(ends):
                if time.monotonic() > deadline:
                    raise PublishError(f"timed out reading state topic {self.topic}")
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                part = msg.partition()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and part is not None:
                        done.add(part)
                        continue
                    raise PublishError(f"cannot read state topic {self.topic}: {err}")
                if msg.key() == key:
                    latest = msg.value()
                    found = True
                offset = msg.offset()
                if part is not None and offset is not None and offset + 1 >= ends[part]:
                    done.add(part)
            if not found or latest is None:  # never written, or reset by a tombstone
                return None
            return ReaderState.from_json(latest)
        finally:
            consumer.close()

    def _get_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    "bootstrap.servers": self._bootstrap,
                    "acks": "all",
                    "linger.ms": 0,
                    "logger": rdkafka_log,
                }
            )
        return self._producer

    def save(self, state: ReaderState, *, wait: bool = True) -> None:
        """Write the state; with ``wait`` block until Kafka acknowledged it."""
        self._write(self.key(state.database, state.slot), state.to_json(), wait=wait)

    def reset(self, database: str, slot: str) -> None:
        """Forget the slot (a tombstone), so the next run starts from scratch."""
        self._write(self.key(database, slot), None, wait=True)

    def _write(self, key: bytes, value: bytes | None, *, wait: bool) -> None:
        errors: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        producer = self._get_producer()
        producer.produce(self.topic, key=key, value=value, on_delivery=on_delivery)
        if wait:
            if producer.flush(30) != 0:
                raise PublishError(f"state record was not acknowledged by {self.topic}")
        else:
            producer.poll(0)
        if errors:
            raise PublishError(f"cannot write state to {self.topic}: {errors[0]}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
