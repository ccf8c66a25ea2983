"""Publisher: writes change events to Kafka and tells the pipeline what is safely stored.

Acknowledgment works per transaction, in commit order. Each transaction gets a
:class:`TxnTracker` counting records in flight; delivery reports (run by ``poll()`` on the
pipeline's thread) decrement it. :meth:`Publisher.acked_lsn` advances past a transaction only
when it is closed (its Commit seen) and every one of its records is acknowledged, and only if
every earlier transaction is too. Counters, not lists: a 200k-row transaction costs one small
object here, and the producer queue bounds how much is in flight.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.cimpl import NewTopic

from cdc.kafka_clients import (
    admin_client,
    cluster_metadata,
    create_topics,
    rdkafka_log,
    read_topic,
)
from pgcdc.core.contract import Headers
from pgcdc.core.errors import PublishError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import KafkaSettings

log = logging.getLogger(__name__)


# Topic settings for every table topic: compacted, so a replay from offset 0 rebuilds state.
# Rows may be large (PostgreSQL values reach 1 GB; TOASTed text of megabytes is common), and
# Kafka's default limit is 1 MB: table topics and the producer allow 64 MiB records.
MAX_RECORD_BYTES = 64 * 1024 * 1024
TABLE_TOPIC_CONFIG = {"cleanup.policy": "compact", "max.message.bytes": str(MAX_RECORD_BYTES)}


def producer_config(settings: KafkaSettings) -> dict[str, Any]:
    """librdkafka settings: idempotent, acks=all, batched and compressed; user keys win."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": "cdc-reader",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 10,
        "batch.size": 1_000_000,
        "batch.num.messages": 10_000,
        "compression.type": "lz4",
        "message.max.bytes": MAX_RECORD_BYTES + 1024 * 1024,
        # Bounds memory: produce() blocks (we poll) once this many records are in flight.
        "queue.buffering.max.messages": 100_000,
        "queue.buffering.max.kbytes": 256 * 1024,
        "message.timeout.ms": 120_000,
        "logger": rdkafka_log,
    }
    conf.update(settings.producer)
    return conf


class TxnTracker:
    """Records of one transaction still waiting for Kafka's acknowledgment."""

    __slots__ = ("_publisher", "closed", "commit_lsn", "end_lsn", "pending")

    def __init__(self, publisher: Publisher, commit_lsn: Lsn) -> None:
        self._publisher = publisher
        self.commit_lsn = commit_lsn
        self.end_lsn: Lsn | None = None
        self.pending = 0
        self.closed = False

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self.pending -= 1
        if err is not None:
            self._publisher.record_failure(err, msg)
        # The latency histogram needs a sample, not every record: 1 in 64.
        elif self._publisher.latency_observer is not None and not self.pending & 63:
            ts_type, ts = msg.timestamp()
            if ts_type and ts > 0:
                self._publisher.latency_observer(time.time() - ts / 1000.0)


class AckQueue:
    """Open transactions in commit order; what is acknowledged is their complete prefix.

    Pure bookkeeping (no Kafka): a transaction counts once it is closed (its Commit seen)
    and none of its records is pending; the acknowledged LSN is the end LSN of the last
    transaction that is complete together with every one before it.
    """

    def __init__(self) -> None:
        self._txns: deque[TxnTracker] = deque()
        self.acked: Lsn | None = None

    def append(self, txn: TxnTracker) -> None:
        self._txns.append(txn)

    def advance(self) -> Lsn | None:
        """Drop complete transactions from the front; return the acknowledged LSN."""
        while self._txns and self._txns[0].closed and self._txns[0].pending == 0:
            txn = self._txns.popleft()
            if txn.end_lsn is not None:
                self.acked = txn.end_lsn
        return self.acked

    def __len__(self) -> int:
        return len(self._txns)


class Publisher:
    """Kafka side of the reader: topics, records, delivery tracking."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._producer = Producer(producer_config(settings))
        self._admin = admin_client(settings.bootstrap_servers)
        self._known_topics: set[str] = set()
        self._acks = AckQueue()
        self._failure: PublishError | None = None
        self.produced = 0  # records queued so far; paces the polls in send()
        # Called with a sample of delivery latencies (seconds) when metrics are on.
        self.latency_observer: Callable[[float], None] | None = None

    # --- startup ------------------------------------------------------------------------

    def probe(self, timeout_s: float = 5.0) -> None:
        """Fail fast with ConnectionFailed when no broker answers a metadata request."""
        md = cluster_metadata(self._admin, self.settings.bootstrap_servers, timeout_s)
        self._known_topics.update(md.topics)

    def ensure_topics(self, topics: Sequence[str], partitions: int | None = None) -> None:
        """Create missing topics as compacted, with ``partitions`` (default: configured)."""
        missing = [t for t in topics if t not in self._known_topics]
        if not missing:
            return
        self._known_topics.update(self._admin.list_topics(timeout=10).topics)
        missing = [t for t in missing if t not in self._known_topics]
        if not missing:
            return
        new = [
            NewTopic(
                t,
                partitions or self.settings.partitions,
                self.settings.replication_factor,
                config=dict(TABLE_TOPIC_CONFIG),
            )
            for t in missing
        ]
        create_topics(self._admin, new)
        self._known_topics.update(missing)

    def live_keys(self, topic: str, timeout_s: float = 300.0) -> set[bytes]:
        """Keys whose latest record in ``topic`` is not a tombstone (reads the whole topic)."""
        live: set[bytes] = set()
        records = read_topic(
            self.settings.bootstrap_servers,
            topic,
            "cdc-live-keys",
            timeout_s,
            **{"fetch.max.bytes": 16 * 1024 * 1024},
        )
        for msg in records:
            key = msg.key()
            if key is None:
                continue
            if msg.value() is None:
                live.discard(key)
            else:
                live.add(key)
        return live

    # --- records ------------------------------------------------------------------------

    def begin(self, commit_lsn: Lsn) -> TxnTracker:
        """Start tracking a transaction; transactions must begin in commit order."""
        txn = TxnTracker(self, commit_lsn)
        self._acks.append(txn)
        return txn

    def send(
        self,
        txn: TxnTracker,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
    ) -> None:
        """Queue one record; waits (serving delivery reports) while the queue is full."""
        self.raise_if_failed()
        txn.pending += 1
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=txn.on_delivery
                )
                break
            except BufferError:
                self._producer.poll(0.05)
                self.raise_if_failed()
            except KafkaException as e:
                txn.pending -= 1
                raise PublishError(f"cannot produce to {topic}: {e.args[0].str()}") from e
        self.produced += 1
        # Serve delivery callbacks now and then without blocking.
        if self.produced & 0x3FF == 0:
            self._producer.poll(0)

    def close_txn(self, txn: TxnTracker, end_lsn: Lsn) -> None:
        """The transaction's Commit was seen: it may be acknowledged up to ``end_lsn``."""
        txn.end_lsn = end_lsn
        txn.closed = True

    # --- acknowledgment -----------------------------------------------------------------

    def record_failure(self, err: KafkaError, msg: Message) -> None:
        if self._failure is None:
            self._failure = PublishError(
                f"Kafka did not accept a record for {msg.topic()}: {err.str()}"
            )

    def raise_if_failed(self) -> None:
        """A delivery failed: stop (nothing after the failure may be acknowledged)."""
        if self._failure is not None:
            raise self._failure

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports."""
        self._producer.poll(timeout_s)
        self.raise_if_failed()

    def acked_lsn(self) -> Lsn | None:
        """End LSN of the last transaction that is, with all before it, fully in Kafka."""
        # After a failed delivery nothing more may be acknowledged.
        return self._acks.advance() if self._failure is None else self._acks.acked

    def idle(self) -> bool:
        """True when no transaction is waiting for acknowledgment."""
        self.acked_lsn()
        return len(self._acks) == 0

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until everything queued is acknowledged (or fail)."""
        deadline = time.monotonic() + timeout_s
        while len(self._producer) > 0:
            if time.monotonic() > deadline:
                raise PublishError(
                    f"{len(self._producer)} records not acknowledged by Kafka after {timeout_s}s"
                )
            self._producer.flush(min(1.0, max(0.01, deadline - time.monotonic())))
            self.raise_if_failed()
        self._producer.poll(0)
        self.raise_if_failed()

    def produce_plain(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """A record outside any transaction (heartbeats); failures are only logged."""

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                log.warning("heartbeat not delivered: %s", err.str(), extra={"topic": topic})

        try:
            self._producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        except BufferError:
            log.debug("producer queue full; heartbeat skipped")
