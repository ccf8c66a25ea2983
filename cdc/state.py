"""The reader's durable state: one record per slot in a compacted Kafka topic.

It lives next to the data (``<prefix>.__cdc_state``) rather than on the reader's disk, so a
reader that loses its disk still knows that its slot was used and can refuse to re-snapshot
silently. The record says which phase the slot is in and the last LSN Kafka acknowledged.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.cimpl import NewTopic

from cdc.committed import Committed, committed_key
from cdc.kafka_clients import admin_client, client_conf, create_topics, read_topic
from pgcdc.core.contract import state_topic
from pgcdc.core.errors import PublishError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import KafkaSettings
from pgcdc.core.verify_record import VerifyPass, state_key

# A state record holds a slot's incremental snapshots, the captured tables' shapes and the
# signals carried out in the last 7 days (up to 100,000): more than Kafka's 1 MB default.
STATE_RECORD_BYTES = 16 * 1024 * 1024
STATE_TOPIC_CONFIG = {"cleanup.policy": "compact", "max.message.bytes": str(STATE_RECORD_BYTES)}

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
    # End of the last commit at or before acked_lsn (source.sequence[0] after a restart).
    last_commit_lsn: Lsn | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "slot": self.slot,
                "database": self.database,
                "phase": self.phase.value,
                "consistent_point": str(self.consistent_point) if self.consistent_point else None,
                "acked_lsn": str(self.acked_lsn) if self.acked_lsn else None,
                "updated_at": self.updated_at,
                "last_commit_lsn": str(self.last_commit_lsn) if self.last_commit_lsn else None,
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
            last_commit_lsn=Lsn.parse(d["last_commit_lsn"]) if d.get("last_commit_lsn") else None,
        )


class StateStore:
    """Reads and writes :class:`ReaderState` records keyed by ``<database>/<slot>``."""

    def __init__(self, kafka: KafkaSettings, topic_prefix: str, replication_factor: int = 1):
        self._kafka = kafka
        self.topic = state_topic(topic_prefix)
        self._rf = replication_factor
        self._producer: Producer | None = None
        # The topic as read once by latest(), kept up to date by this store's writes: a
        # run's start reads it once, not once per record it looks up.
        self._records: dict[bytes, bytes | None] | None = None

    @staticmethod
    def key(database: str, slot: str) -> bytes:
        return f"{database}/{slot}".encode()

    @staticmethod
    def snapshots_key(database: str, slot: str) -> bytes:
        """The slot's incremental snapshots record (:mod:`cdc.incremental.queue`)."""
        return f"{database}/{slot}#snapshots".encode()

    def load_known_keys(self, database: str, slot: str) -> dict[int, tuple[str, ...]]:
        """The primary keys of REPLICA IDENTITY FULL tables, by relation OID, as recorded by
        :meth:`save_known_keys` (see :class:`cdc.catalog.SchemaCatalog`)."""
        data = self.load_record(f"{database}/{slot}#keys".encode())
        if not data:
            return {}
        return {int(k): tuple(v) for k, v in orjson.loads(data).items()}

    def save_known_keys(self, database: str, slot: str, keys: dict[int, tuple[str, ...]]) -> None:
        """Record them, waiting for Kafka: a change keyed by them may be acknowledged next."""
        value = orjson.dumps({str(k): list(v) for k, v in keys.items()})
        self.save_record(f"{database}/{slot}#keys".encode(), value, wait=True)

    def load_left(self, database: str, slot: str) -> list[tuple[str, str]]:
        """Tables that left the captured set while their topic still holds rows: a record
        of its own, written at a reader's start and by ``cdc forget`` (cdc.forget), so
        neither overwrites the other's."""
        data = self.load_record(f"{database}/{slot}#left".encode())
        return [(s, t) for s, t in orjson.loads(data)] if data else []

    def save_left(self, database: str, slot: str, tables: list[tuple[str, str]]) -> None:
        value = orjson.dumps([list(t) for t in sorted(tables)])
        self.save_record(f"{database}/{slot}#left".encode(), value, wait=True)

    def load_verify(self, database: str, slot: str) -> VerifyPass | None:
        """The record of ``cdc verify``'s last pass (:mod:`pgcdc.core.verify_record`), a
        record of its own that only ``cdc verify`` writes."""
        data = self.load_record(state_key(database, slot))
        return VerifyPass.from_json(data) if data else None

    def save_verify(self, database: str, slot: str, record: VerifyPass) -> None:
        self.save_record(state_key(database, slot), record.to_json(), wait=True)

    def load_committed(self, database: str, slot: str) -> Committed | None:
        """What a transactional reader of the slot committed last (:mod:`cdc.committed`),
        as ``read_committed`` sees it."""
        data = self.load_record(committed_key(database, slot))
        return Committed.from_json(data) if data else None

    def forget_committed(self, database: str, slot: str) -> None:
        """Forget it: a run that is not transactional, or a new slot, makes it stale."""
        self._write(committed_key(database, slot), None, wait=True)

    def ensure_topic(self) -> None:
        """Create the compacted state topic if it is missing; one made before records could
        grow past Kafka's 1 MB default is given the larger limit."""
        admin = admin_client(self._kafka)
        if self.topic in admin.list_topics(timeout=10).topics:
            self._raise_record_limit(admin)
            return
        create_topics(admin, [NewTopic(self.topic, 1, self._rf, config=STATE_TOPIC_CONFIG)])

    def _raise_record_limit(self, admin: AdminClient) -> None:
        resource = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
        try:
            configs = admin.describe_configs([resource])[resource].result(timeout=30)
            held = configs.get("max.message.bytes")
            if held is not None and int(held.value) >= STATE_RECORD_BYTES:
                return
            entry = ConfigEntry(
                "max.message.bytes",
                str(STATE_RECORD_BYTES),
                incremental_operation=AlterConfigOpType.SET,
            )
            resource = ConfigResource(
                ConfigResource.Type.TOPIC, self.topic, incremental_configs=[entry]
            )
            admin.incremental_alter_configs([resource])[resource].result(timeout=30)
            log.info(
                "state topic %s now takes records up to %d bytes", self.topic, STATE_RECORD_BYTES
            )
        except KafkaException as e:
            # A principal without AlterConfigs: records past the topic's limit fail when
            # written, with Kafka's reason; until then nothing is lost.
            log.warning(
                "state topic %s keeps its record limit (%s): set its max.message.bytes to %d",
                self.topic,
                e.args[0].str(),
                STATE_RECORD_BYTES,
            )

    def latest(self, timeout_s: float = 15.0) -> dict[bytes, bytes | None]:
        """Every key's latest value in the state topic (None: a tombstone)."""
        records: dict[bytes, bytes | None] = {}
        for msg in read_topic(self._kafka, self.topic, "cdc-state-reader", timeout_s):
            key = msg.key()
            if key is not None:
                records[key] = msg.value()
        self._records = records
        return dict(records)

    def load(self, database: str, slot: str, timeout_s: float = 15.0) -> ReaderState | None:
        """The latest state record for the slot, or None if there is none (or it was reset)."""
        latest = self.load_record(self.key(database, slot), timeout_s)
        if latest is None:  # never written, or reset by a tombstone
            return None
        return ReaderState.from_json(latest)

    def load_record(self, key: bytes, timeout_s: float = 15.0) -> bytes | None:
        """The latest value written under ``key`` (None: never written, or a tombstone)."""
        if self._records is not None:
            return self._records.get(key)
        latest: bytes | None = None
        for msg in read_topic(self._kafka, self.topic, "cdc-state-reader", timeout_s):
            if msg.key() == key:
                latest = msg.value()
        return latest

    def save_record(self, key: bytes, value: bytes, *, wait: bool = True) -> None:
        """Write ``value`` under ``key``; with ``wait`` block until Kafka acknowledged it."""
        self._write(key, value, wait=wait)

    def _get_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                client_conf(
                    self._kafka,
                    acks="all",
                    **{
                        "linger.ms": 0,
                        "compression.type": "lz4",
                        "message.max.bytes": STATE_RECORD_BYTES + 1024 * 1024,
                    },
                )
            )
        return self._producer

    def save(self, state: ReaderState, *, wait: bool = True) -> None:
        """Write the state; with ``wait`` block until Kafka acknowledged it."""
        self._write(self.key(state.database, state.slot), state.to_json(), wait=wait)

    def reset(self, database: str, slot: str, *, keep_slot: bool = False) -> None:
        """Forget the slot (a tombstone), so the next run starts from scratch. With
        ``keep_slot`` the slot stays this reader's: its record says that the snapshot is to
        be taken again, so the next run drops the slot and snapshots anew (a slot without a
        record is another's, and is never dropped)."""
        self._write(self.snapshots_key(database, slot), None, wait=False)
        self._write(f"{database}/{slot}#keys".encode(), None, wait=False)
        self._write(f"{database}/{slot}#left".encode(), None, wait=False)
        self._write(committed_key(database, slot), None, wait=False)
        again = ReaderState(slot, database, Phase.SNAPSHOT) if keep_slot else None
        self._write(self.key(database, slot), again.to_json() if again else None, wait=True)

    def _write(self, key: bytes, value: bytes | None, *, wait: bool) -> None:
        errors: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        producer = self._get_producer()
        producer.produce(self.topic, key=key, value=value, on_delivery=on_delivery)
        if self._records is not None:
            self._records[key] = value
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
