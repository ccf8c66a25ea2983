"""Publisher: writes change events to Kafka and tells the pipeline what is safely stored.

Acknowledgment works per transaction, in commit order. Each transaction gets a
:class:`TxnTracker` counting records in flight; delivery reports (run by ``poll()`` on the
pipeline's thread) decrement it. :meth:`Publisher.acked_lsn` advances past a transaction only
when it is closed (its Commit seen) and every one of its records is acknowledged, and only if
every earlier transaction is too. Counters, not lists: a 200k-row transaction costs one small
object here, and the producer queue bounds how much is in flight.

A record Kafka refuses for good (:mod:`cdc.dead_letters`) either stops the reader (nothing
after it is acknowledged) or, with ``kafka.unproducible_records = dead_letter``, is replaced
by a letter on the dead-letter topic that counts for its transaction in its place: the
transaction is acknowledged once the letter is.

A Kafka outage (:mod:`cdc.kafka_outage`) is told by the publisher's waits, and bounded by
the producer's queue: once it is full, :meth:`Publisher.send` waits for room, so the reader
reads no more from the replication stream (``while_waiting`` keeps that session alive). A
record not acknowledged within ``message.timeout.ms`` ends the run as
:class:`~pgcdc.core.errors.KafkaUnavailable` (retryable): nothing after it is acknowledged,
the producer's queue is purged so no record of this run lands after the next run's, and the
next run resumes from the slot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final, NoReturn

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.cimpl import NewTopic

from cdc.committed import Committed
from cdc.dead_letters import RefusedRecord, fail_message, is_permanent, letter
from cdc.interrupt import StopRequested
from cdc.kafka_clients import (
    admin_client,
    client_conf,
    cluster_metadata,
    create_topics,
    last_transport_error,
    read_topic,
)
from cdc.kafka_outage import watch_for
from pgcdc.core.contract import HEADER_COMMIT_LSN, Headers, state_topic
from pgcdc.core.errors import (
    Fenced,
    KafkaUnavailable,
    PublishError,
    TopicGone,
    TransactionAborted,
)
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import KafkaSettings, UnproducibleRecords

log = logging.getLogger(__name__)


# Topic settings for every table topic: compacted, so a replay from offset 0 rebuilds state.
# Rows may be large (PostgreSQL values reach 1 GB; TOASTed text of megabytes is common), and
# Kafka's default limit is 1 MB: table topics and the producer allow 64 MiB records.
MAX_RECORD_BYTES = 64 * 1024 * 1024
TABLE_TOPIC_CONFIG = {"cleanup.policy": "compact", "max.message.bytes": str(MAX_RECORD_BYTES)}
# The producer queue's byte limit: two records of the largest size.
QUEUE_KBYTES = 2 * MAX_RECORD_BYTES // 1024
# How long Publisher.hurry waits at most for Kafka's answer (a round trip on a LAN).
HURRY_TIMEOUT_S = 0.005
# The dead-letter topic, when the reader creates it: letters are kept, not compacted.
DEAD_LETTER_TOPIC_CONFIG = {"cleanup.policy": "delete"}


def producer_config(settings: KafkaSettings) -> dict[str, Any]:
    """librdkafka settings: idempotent, acks=all, batched and compressed; the settings'
    connection, security and pass-through (``kafka.client``, then ``kafka.producer``) win."""
    conf: dict[str, Any] = {
        "client.id": "cdc-reader",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 10,
        "batch.size": 1_000_000,
        "batch.num.messages": 10_000,
        "compression.type": "lz4",
        "message.max.bytes": MAX_RECORD_BYTES + 1024 * 1024,
        # Bounds memory: produce() blocks (we poll) once this many records are in flight,
        # and while it waits the reader reads nothing more from PostgreSQL (a Kafka outage
        # costs at most this much). The byte limit holds a record of the largest size.
        "queue.buffering.max.messages": 100_000,
        "queue.buffering.max.kbytes": QUEUE_KBYTES,
        # A record still not acknowledged after this ends the run (retryable, nothing lost).
        "message.timeout.ms": 120_000,
    }
    return conf | client_conf(settings) | settings.producer


# Calls that :meth:`Publisher._abort` makes at most (besides its deadline): librdkafka may
# answer each at once (a conflicting call under way), so the count bounds them too.
_ABORT_CALLS: Final = 20


def _fenced(err: KafkaError) -> bool:
    """A newer producer with the same transactional id took over: this one stops for good."""
    return err.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )


def _fatal(err: KafkaError) -> bool:
    """The producer cannot go on: fenced, or in a fatal state (e.g. the transaction
    coordinator lost its transaction in a broker restart). Only a fence is for good: a new
    run's new producer carries on from the committed position otherwise."""
    return bool(err.fatal()) or err.code() == KafkaError._FATAL or _fenced(err)


# Delivery errors of a topic deleted under the producer.
_TOPIC_GONE = frozenset(
    {KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART}
)


class TxnTracker:
    """Records of one transaction still waiting for Kafka's acknowledgment."""

    __slots__ = ("_publisher", "closed", "commit_lsn", "committed", "end_lsn", "pending")

    def __init__(self, publisher: Publisher, commit_lsn: Lsn) -> None:
        self._publisher = publisher
        self.commit_lsn = commit_lsn
        self.end_lsn: Lsn | None = None
        self.pending = 0
        self.closed = False
        self.committed = False  # a transactional producer committed its Kafka transaction

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self.pending -= 1
        publisher = self._publisher
        if err is not None:
            publisher.record_failure(err, msg, self)
            return
        publisher.delivered += 1
        # The latency histogram needs a sample, not every record: 1 in 64.
        if publisher.latency_observer is not None and not self.pending & 63:
            ts_type, ts = msg.timestamp()
            if ts_type and ts > 0:
                publisher.latency_observer(time.time() - ts / 1000.0)


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

    def closed(self) -> list[TxnTracker]:
        """The transactions whose Commit was seen, in order."""
        return [t for t in self._txns if t.closed]

    def newest(self) -> Lsn | None:
        """Commit LSN of the last transaction begun and not yet acknowledged."""
        return self._txns[-1].commit_lsn if self._txns else None

    def __len__(self) -> int:
        return len(self._txns)


class Publisher:
    """Kafka side of the reader: topics, records, delivery tracking."""

    def __init__(
        self,
        settings: KafkaSettings,
        stop: threading.Event | None = None,
        *,
        transactional_id: str | None = None,
    ) -> None:
        """``transactional_id``: a transactional producer (``kafka.exactly_once``), whose
        records are visible to ``read_committed`` consumers once :meth:`commit` returns."""
        self.settings = settings
        # Set by Ctrl-C or SIGTERM: a wait for room in the queue or for acknowledgments
        # gives way to it (StopRequested) instead of holding the stop.
        self.stop = stop
        conf = producer_config(settings)
        self.transactional_id = transactional_id
        if transactional_id is not None:
            ours: dict[str, Any] = {
                "transactional.id": transactional_id,
                "transaction.timeout.ms": 300_000,
            }
            conf = ours | conf
            # librdkafka refuses a record timeout longer than the transaction's.
            conf["message.timeout.ms"] = min(
                int(conf["message.timeout.ms"]), int(conf["transaction.timeout.ms"])
            )
        self._producer = Producer(conf)
        self._message_timeout_ms = int(conf["message.timeout.ms"])
        # A transactional producer: the Kafka transaction open now, since when, the last
        # position committed, and whether records may commit on their own (a snapshot's
        # rows) or only where the streamer says (between PostgreSQL transactions).
        self._begin_needed = transactional_id is not None
        self._txn_opened = 0.0
        self._commit_every_s = settings.transaction_ms / 1000
        self._split_after_s = int(conf.get("transaction.timeout.ms", 60_000)) / 2000
        self.committed: Committed | None = None
        self.commits = 0  # Kafka transactions committed by this run
        self.auto_commit = True
        self._committed_key = b""
        self._admin = admin_client(settings)
        self._known_topics: set[str] = set()
        self._acks = AckQueue()
        self._failure: PublishError | None = None
        self._dead_letter = settings.unproducible_records is UnproducibleRecords.DEAD_LETTER
        # Refused records waiting for their letter (written outside librdkafka's callbacks).
        self._refused: list[tuple[RefusedRecord, TxnTracker]] = []
        self._dead_letter_topic_ready = False
        self.dead_letters = 0  # letters written so far
        self.produced = 0  # records queued so far; paces the polls in send()
        self.delivered = 0  # records Kafka acknowledged so far
        self.outage = watch_for(settings.bootstrap_servers)
        # Called while a wait on Kafka lasts (the streamer keeps its replication session
        # alive), and when an outage line says where the reader stands (the slot's WAL).
        self.while_waiting: Callable[[], None] | None = None
        self.describe_slot: Callable[[], str] | None = None
        # Called with a sample of delivery latencies (seconds) when metrics are on.
        self.latency_observer: Callable[[float], None] | None = None

    # --- startup ------------------------------------------------------------------------

    def probe(self, timeout_s: float = 5.0) -> None:
        """Fail fast with KafkaUnavailable when no broker answers a metadata request (an
        outage told before, see :mod:`cdc.kafka_outage`, ends with an answer)."""
        try:
            md = cluster_metadata(self._admin, self.settings.bootstrap_servers, timeout_s)
        except KafkaUnavailable as e:
            self.outage.lasting(self._reason() or str(e))
            raise
        self.outage.answered()
        self._known_topics.update(md.topics)

    def ensure_topics(
        self,
        topics: Sequence[str],
        partitions: int | None = None,
        config: dict[str, str] | None = None,
    ) -> None:
        """Create missing topics with ``partitions`` (default: configured) and ``config``
        (default: compacted table topics)."""
        missing = [t for t in topics if t not in self._known_topics]
        if not missing:
            return
        self._known_topics.update(self._admin.list_topics(timeout=10).topics)
        missing = [t for t in missing if t not in self._known_topics]
        if not missing:
            return
        topic_config = dict(TABLE_TOPIC_CONFIG if config is None else config)
        if self.settings.min_insync_replicas is not None:
            topic_config["min.insync.replicas"] = str(self.settings.min_insync_replicas)
        new = [
            NewTopic(
                t,
                partitions or self.settings.partitions,
                self.settings.replication_factor,
                config=topic_config,
            )
            for t in missing
        ]
        create_topics(self._admin, new)
        self._known_topics.update(missing)

    def live_keys(self, topic: str, timeout_s: float = 300.0) -> set[bytes]:
        """Keys whose latest record in ``topic`` is not a tombstone (reads the whole topic)."""
        live: set[bytes] = set()
        records = read_topic(
            self.settings,
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
        partition: int | None = None,
    ) -> None:
        """Queue one record; waits (serving delivery reports) while the queue is full.
        ``partition``: where to put it (default: the producer's partitioner decides)."""
        if self._failure is not None or self._refused:
            self.raise_if_failed()
        if self._begin_needed:
            self._begin()
        txn.pending += 1
        try:
            if partition is not None:  # rare: the caller chose the partition
                self._produce(topic, key, value, headers, txn.on_delivery, partition)
            else:
                # Hot path: one produce() call; a full queue falls back to the polling loop.
                try:
                    self._producer.produce(
                        topic, value=value, key=key, headers=headers, on_delivery=txn.on_delivery
                    )
                except BufferError:
                    self._produce(topic, key, value, headers, txn.on_delivery)
        except KafkaException as e:
            self._not_produced(e, txn, topic, key, value, headers)
        self.produced += 1
        # Serve delivery callbacks now and then without blocking.
        if self.produced & 0x3FF == 0:
            self._producer.poll(0)
            self.raise_if_failed()
            self._commit_if_free()

    def send_many(
        self,
        txn: TxnTracker,
        topic: str,
        records: Sequence[tuple[bytes | None, bytes | None, Headers]],
    ) -> None:
        """Queue records (key, value, headers) of one topic in order: :meth:`send` for each,
        with the per-call work done once (a snapshot sends its rows this way)."""
        if self._failure is not None or self._refused:
            self.raise_if_failed()
        produce = self._producer.produce
        on_delivery = txn.on_delivery
        for key, value, headers in records:
            if self._begin_needed:
                self._begin()
            txn.pending += 1
            try:
                try:
                    produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                except BufferError:
                    self._produce(topic, key, value, headers, on_delivery)
            except KafkaException as e:
                self._not_produced(e, txn, topic, key, value, headers)
            self.produced += 1
            if self.produced & 0x3FF == 0:
                self._producer.poll(0)
                self.raise_if_failed()
                self._commit_if_free()

    def _not_produced(
        self,
        e: KafkaException,
        txn: TxnTracker,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
    ) -> None:
        """produce() refused a record (already counted pending in ``txn``): a permanent
        refusal is dead-lettered when the settings say so; anything else raises."""
        err = e.args[0]
        if self.transactional_id is not None and (_fatal(err) or err.code() == KafkaError._STATE):
            txn.pending -= 1
            self._transaction_failed(err, f"cannot produce to {topic}")
        if err.code() in _TOPIC_GONE:
            txn.pending -= 1
            raise TopicGone(f"topic {topic} was deleted under the reader ({err.str()})") from e
        if not is_permanent(err.code()):
            txn.pending -= 1
            raise PublishError(f"cannot produce to {topic}: {err.str()}") from e
        # Refused before it left (larger than the producer takes): the same as a refusal
        # by the broker; its pending count passes to the letter, if one is written.
        refused = RefusedRecord.of(topic, key, value, headers, err.str())
        if not self._dead_letter:
            txn.pending -= 1
            self._failure = PublishError(self._fail_message(refused))
            raise self._failure from e
        self._write_letter(refused, txn)

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        on_delivery: Callable[[KafkaError | None, Message], None],
        partition: int | None = None,
    ) -> None:
        """Queue one record, serving delivery reports while the queue is full."""
        if self._begin_needed:
            self._begin()
        while True:
            try:
                if partition is None:
                    self._producer.produce(
                        topic, value=value, key=key, headers=headers, on_delivery=on_delivery
                    )
                else:
                    self._producer.produce(
                        topic,
                        value=value,
                        key=key,
                        headers=headers,
                        on_delivery=on_delivery,
                        partition=partition,
                    )
                return
            except BufferError:
                # The queue is full: read nothing more until Kafka takes some.
                self._raise_if_stopped("room in the producer queue")
                self._producer.poll(0.05)
                if self._failure is not None:
                    self._raise_failure()
                self._waiting()

    def close_txn(self, txn: TxnTracker, end_lsn: Lsn) -> None:
        """The transaction's Commit was seen: it may be acknowledged up to ``end_lsn``."""
        txn.end_lsn = end_lsn
        txn.closed = True

    # --- acknowledgment -----------------------------------------------------------------

    def record_failure(self, err: KafkaError, msg: Message, txn: TxnTracker) -> None:
        """A delivery failed (run inside librdkafka's callback: no producing here).

        A permanent refusal of a change record is dead-lettered when the settings say so:
        ``txn`` then waits for the letter in the record's place. Anything else stops the
        reader, and nothing after it is acknowledged.
        """
        if self._failure is not None:
            return
        if self.transactional_id is not None and _fenced(err):
            self._failure = self._fenced_failure(err)
            return
        if self.transactional_id is not None and _fatal(err):
            self._failure = self._aborted(f"a record for {msg.topic()} failed", err)
            return
        topic = msg.topic() or "?"
        # A delivery report carries no headers: the transaction knows the commit LSN.
        headers = msg.headers() or [(HEADER_COMMIT_LSN, str(txn.commit_lsn.value).encode())]
        refused = RefusedRecord.of(topic, msg.key(), msg.value(), headers, err.str())
        letterable = topic != self.settings.dead_letter_topic and is_permanent(err.code())
        if letterable and self.transactional_id is not None:
            # The broker's refusal made the Kafka transaction abortable: no letter can
            # take the record's place in it.
            self._failure = PublishError(
                f"{self._fail_message(refused)} (with kafka.exactly_once a record the broker "
                "refuses stops the reader: its Kafka transaction can only be aborted)"
            )
        elif letterable and self._dead_letter:
            txn.pending += 1
            self._refused.append((refused, txn))
        elif letterable:
            self._failure = PublishError(self._fail_message(refused))
        elif err.code() in _TOPIC_GONE:
            self._failure = TopicGone(
                f"topic {topic} was deleted under the reader ({err.str()}): nothing after "
                "its last acknowledged transaction is confirmed; a new run resumes from the "
                "slot and snapshots the table again into the new topic"
            )
        elif err.code() == KafkaError._MSG_TIMED_OUT:
            timeout_ms = self._message_timeout_ms
            self._failure = KafkaUnavailable(
                f"Kafka did not accept a record for {topic} within message.timeout.ms "
                f"({timeout_ms} ms; {err.str()}: {self._reason() or 'no reason given'}): "
                "nothing after the last acknowledged transaction is confirmed to PostgreSQL; "
                "a new run resumes from the slot once Kafka answers (within "
                "postgres.reconnect_timeout_s), or start the reader again when it does"
            )
        else:
            self._failure = PublishError(f"Kafka did not accept a record for {topic}: {err.str()}")

    def _fail_message(self, refused: RefusedRecord) -> str:
        s = self.settings
        return fail_message(refused, s.topic_prefix, s.dead_letter_topic)

    def _write_letter(self, refused: RefusedRecord, txn: TxnTracker) -> None:
        """Produce the letter for ``refused``; it counts for ``txn`` (already pending)."""
        topic = self.settings.dead_letter_topic
        if not self._dead_letter_topic_ready:
            self.ensure_topics([topic], partitions=1, config=DEAD_LETTER_TOPIC_CONFIG)
            self._dead_letter_topic_ready = True
        log.warning(
            "record refused by Kafka written to the dead-letter topic: %s",
            refused.reason,
            extra={"topic": refused.topic, "dead_letter_topic": topic},
        )
        headers: Headers = [(k, v) for k, v in refused.headers]
        prefix = self.settings.topic_prefix
        try:
            self._produce(topic, refused.key, letter(refused, prefix), headers, txn.on_delivery)
        except KafkaException as e:
            if not is_permanent(e.args[0].code()) or refused.value is None:
                raise PublishError(
                    f"cannot write a dead letter to {topic}: {e.args[0].str()}"
                ) from e
            # Too large with the value in it: the letter says the value's size only.
            bare = letter(replace(refused, value=None, value_size=refused.size), prefix)
            self._produce(topic, refused.key, bare, headers, txn.on_delivery)
        self.dead_letters += 1

    def raise_if_failed(self) -> None:
        """Write the letters of records refused since the last call; then, if a delivery
        failed, stop (nothing after the failure may be acknowledged)."""
        while self._refused and self._failure is None:
            refused, txn = self._refused.pop(0)
            self._write_letter(refused, txn)
        if self._failure is not None:
            self._raise_failure()

    def _raise_failure(self) -> NoReturn:
        assert self._failure is not None
        if self.transactional_id is not None:
            # Nothing of the open transaction may become visible: abort it (which also
            # empties the queue); the next run resumes from the committed position.
            self._abort()
        elif self._failure.retryable:
            # The next run produces all of it again: nothing of this one may land after.
            self._producer.purge()
        raise self._failure

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports."""
        self._producer.poll(timeout_s)
        self.raise_if_failed()
        self.outage.tick(len(self._producer), self.delivered, self._reason, self._where)

    def _waiting(self) -> None:
        """A wait on Kafka goes on: keep the caller's session alive, watch for an outage."""
        if self.while_waiting is not None:
            self.while_waiting()
        self.outage.tick(len(self._producer), self.delivered, self._reason, self._where)

    def _reason(self) -> str | None:
        return last_transport_error(self.settings.bootstrap_servers)

    def _where(self) -> str:
        """Where the reader stands, for an outage line."""
        acked, newest = self._acks.acked, self._acks.newest()
        text = (
            f"{len(self._acks)} transactions not acknowledged (confirmed to PostgreSQL up "
            f"to {acked or 'the start position'}, read up to commit {newest or '-'})"
        )
        if self.describe_slot is not None:
            text += f"; {self.describe_slot()}"
        return text

    def hurry(self, timeout_s: float = HURRY_TIMEOUT_S) -> bool:
        """Send what is queued now instead of after ``linger.ms``, and wait up to
        ``timeout_s`` for Kafka's answer (serving delivery reports). For a reader with
        nothing else to do: while the source is idle, lingering only adds latency.
        True while records are still waiting (e.g. for a new topic's metadata), so the
        caller hurries again on its next idle turn."""
        # librdkafka ignores linger.ms while a flush() is in progress.
        left = self._producer.flush(timeout_s)
        self.raise_if_failed()
        return left > 0

    def acked_lsn(self) -> Lsn | None:
        """End LSN of the last transaction that is, with all before it, fully in Kafka
        (a transactional producer's: committed)."""
        if self.transactional_id is not None:
            # Records delivered in a transaction not yet committed are not held.
            return self.committed.end_lsn if self.committed is not None else None
        # After a failed delivery nothing more may be acknowledged.
        return self._acks.advance() if self._failure is None else self._acks.acked

    def holds(self, txn: TxnTracker) -> bool:
        """Kafka holds every record of ``txn`` (a transactional producer's: committed)."""
        done = txn.closed and txn.pending == 0
        return done and (txn.committed or self.transactional_id is None)

    def idle(self) -> bool:
        """True when no transaction is waiting for acknowledgment."""
        if self.transactional_id is not None:
            return not self.txn_open and len(self._acks) == 0
        self.acked_lsn()
        return len(self._acks) == 0

    # --- Kafka transactions (kafka.exactly_once) ----------------------------------------

    @property
    def txn_open(self) -> bool:
        """A Kafka transaction is open (records in it are not yet visible)."""
        return self.transactional_id is not None and not self._begin_needed

    def start_transactions(self, database: str, slot: str, timeout_s: float = 60.0) -> None:
        """Take the transactional id over: an older producer with it is fenced and its open
        transaction aborted, so what ``read_committed`` reads next is final."""
        assert self.transactional_id is not None
        self._committed_key = f"{database}/{slot}#committed".encode()
        try:
            self._producer.init_transactions(timeout_s)
        except KafkaException as e:
            err = e.args[0]
            if _fenced(err):
                raise self._fenced_failure(err) from e
            raise KafkaUnavailable(
                f"Kafka did not start transactions for transactional.id "
                f"{self.transactional_id} within {timeout_s:.0f}s ({err.str()}): "
                "kafka.exactly_once needs brokers that run the transaction coordinator "
                "(transaction.state.log.replication.factor ≤ the number of brokers)"
            ) from e

    def _begin(self) -> None:
        try:
            self._producer.begin_transaction()
        except KafkaException as e:
            self._transaction_failed(e.args[0], "cannot begin a Kafka transaction")
        self._begin_needed = False
        self._txn_opened = time.monotonic()

    def commit_due(self) -> bool:
        """The open transaction is older than ``kafka.transaction_ms``."""
        return self.txn_open and time.monotonic() - self._txn_opened >= self._commit_every_s

    def split_due(self) -> bool:
        """The open transaction is half as old as ``transaction.timeout.ms`` allows: a
        PostgreSQL transaction still streaming must be split or the broker aborts it."""
        return self.txn_open and time.monotonic() - self._txn_opened >= self._split_after_s

    def _commit_if_free(self) -> None:
        # A snapshot's rows (auto_commit): commit on the time bound, wherever they stand.
        if self.auto_commit and self.commit_due():
            self.commit()

    def commit(self, position: Committed | None = None, timeout_s: float = 60.0) -> None:
        """Commit the open Kafka transaction, with ``position`` written into the state topic
        inside it; once this returns its records are visible and ``acked_lsn`` is the
        position's. Nothing open and no position: nothing to do."""
        if self.transactional_id is None:
            return
        if position is not None:
            if self._begin_needed:
                self._begin()
            try:
                self._producer.produce(
                    state_topic(self.settings.topic_prefix),
                    key=self._committed_key,
                    value=position.to_json(),
                )
            except KafkaException as e:
                self._transaction_failed(e.args[0], "cannot write the committed position")
        if not self.txn_open:
            return
        self.raise_if_failed()
        # Every record of these is in the transaction: committed with it.
        closing = self._acks.closed()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                break
            except KafkaException as e:
                err = e.args[0]
                if not _fatal(err) and err.retriable() and time.monotonic() < deadline:
                    self._waiting()
                    continue
                self._transaction_failed(err, "Kafka did not commit a transaction")
        self._begin_needed = True
        self.commits += 1
        for txn in closing:
            txn.committed = True
        self._producer.poll(0)  # the delivery reports of its records
        self.raise_if_failed()
        self._acks.advance()
        if position is not None:
            self.committed = position

    def _transaction_failed(self, err: KafkaError, what: str) -> NoReturn:
        """The open Kafka transaction cannot go on: fenced (:class:`Fenced`, for good), or
        in an abortable state, aborted (:class:`TransactionAborted`, a new run resumes from
        the committed position)."""
        if _fenced(err):
            self._failure = self._fenced_failure(err)
        elif self._failure is None:
            self._failure = self._aborted(what, err)
        self._raise_failure()

    def _aborted(self, what: str, err: KafkaError) -> TransactionAborted:
        return TransactionAborted(
            f"{what} ({err.str()}): the Kafka transaction is aborted, and the next run "
            "resumes from the committed position "
            f"({self.committed.describe() if self.committed else 'the slot'})"
        )

    def _abort(self, timeout_s: float = 30.0) -> None:
        """Abort the open Kafka transaction. A producer found fenced meanwhile raises
        :class:`Fenced`: another reader took over, and this one must not start again.

        librdkafka takes no abort while a commit that timed out is still in progress
        (``_CONFLICT``, or ``_STATE`` once the commit has begun): that commit is resumed,
        the only way on, so its end tells whether this producer was fenced. Ending the run
        with a retryable error instead would let its next run take the transactional id back
        from the reader that fenced it. A resumed commit that succeeds leaves its records,
        and its position, to Kafka; the next run reads the position there."""
        if not self.txn_open:
            return
        self._begin_needed = True
        deadline = time.monotonic() + timeout_s
        resume_commit = False
        for _ in range(_ABORT_CALLS):
            left = max(1.0, deadline - time.monotonic())
            try:
                if resume_commit:
                    self._producer.commit_transaction(left)
                    log.info("a commit that had timed out completed while the run was ending")
                else:
                    self._producer.abort_transaction(left)
                return
            except KafkaException as e:
                err = e.args[0]
                if _fenced(err):
                    raise self._fenced_failure(err) from e
                if _fatal(err) or time.monotonic() >= deadline:
                    break
                if err.code() in (KafkaError._CONFLICT, KafkaError._STATE):
                    # The other call is under way (a conflicting call), or the transaction
                    # is in its state ("not valid in state BeginCommit"): that one goes on.
                    resume_commit = not resume_commit
                elif err.txn_requires_abort():
                    resume_commit = False
                elif not err.retriable():
                    break
                else:
                    time.sleep(0.1)  # a timed-out call took its time; another may not
        # The next run's init_transactions aborts it in any case.
        log.warning("could not abort the Kafka transaction: %s", err.str())

    def _fenced_failure(self, err: KafkaError) -> PublishError:
        return Fenced(
            f"this reader is fenced ({err.str()}): another reader started with "
            f"transactional.id {self.transactional_id} (the same slot). It confirms nothing "
            "more; the other reader carries on (or start this one again once it is the only "
            "one)",
            kafka=err.str(),
        )

    def flush(self, timeout_s: float = 60.0, *, stop: threading.Event | None = None) -> None:
        """Wait until everything queued is acknowledged (or fail); with ``stop``, give way to
        it (StopRequested). A wait over 2 s says what it waits for."""
        started = time.monotonic()
        deadline = started + timeout_s
        said = False
        while True:
            self._producer.poll(0)
            self.raise_if_failed()  # also writes letters a poll asked for
            if len(self._producer) == 0 and not self._refused:
                return
            now = time.monotonic()
            if now > deadline:
                raise PublishError(
                    f"{len(self._producer)} records not acknowledged by Kafka after {timeout_s}s"
                )
            if stop is not None:
                self._raise_if_stopped("acknowledgments", stop)
            if not said and now - started > 2.0:
                said = True
                again = "; Ctrl-C again exits at once" if self.stop and self.stop.is_set() else ""
                log.info(
                    "waiting up to %.0fs for Kafka to acknowledge %d records (nothing "
                    "unacknowledged is confirmed to PostgreSQL)%s",
                    deadline - now,
                    len(self._producer),
                    again,
                )
            self._producer.flush(min(0.2, max(0.01, deadline - now)))
            self._waiting()

    def _raise_if_stopped(self, waiting_for: str, stop: threading.Event | None = None) -> None:
        event = stop or self.stop
        if event is not None and event.is_set():
            raise StopRequested(
                f"stopped while waiting for Kafka's {waiting_for} ({len(self._producer)} "
                "records queued; nothing unacknowledged is confirmed to PostgreSQL)"
            )

    def settle(self, timeout_s: float = 60.0, *, stop: threading.Event | None = None) -> None:
        """:meth:`flush`, then commit the open Kafka transaction (a transactional producer's
        records are visible only then)."""
        self.flush(timeout_s, stop=stop)
        self.commit(timeout_s=timeout_s)

    def produce_plain(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """A record outside any PostgreSQL transaction (heartbeats; a transactional
        producer's goes into the open Kafka transaction); failures are only logged."""

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                log.warning("heartbeat not delivered: %s", err.str(), extra={"topic": topic})
            else:
                self.delivered += 1  # an idle reader's outage ends with its heartbeat

        if self._begin_needed:
            self._begin()
        try:
            self._producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        except BufferError:
            log.debug("producer queue full; heartbeat skipped")
        except KafkaException as e:
            if self.transactional_id is not None:
                self._transaction_failed(e.args[0], f"cannot produce to {topic}")
            log.warning("heartbeat not produced: %s", e.args[0].str(), extra={"topic": topic})
