"""The dead-letter topic: records a follower cannot apply, published with the reason.

Two kinds of record go there: a change the sink refused for good (:class:`RefusedChange`),
and a Kafka record that is no applicable change at all (:class:`UnreadableRecord`: not a
Debezium event, no key, a TRUNCATE).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

import orjson
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from pgcdc.core.errors import PublishError
from pgcdc.core.kafka_config import client_config
from pgcdc.core.settings import Settings
from sinks.base import plain


class RefusedChange(TypedDict):
    """A change the sink refused for good, and the Kafka record it came from."""

    topic: str
    partition: int
    offset: int
    table: str
    key: str
    reason: str | None
    commit_lsn: int
    doc: Mapping[str, Any] | None


class UnreadableRecord(TypedDict):
    """A Kafka record that holds no change a follower can apply."""

    topic: str
    partition: int
    offset: int
    table: str | None  # the table id its topic names
    key: str | None
    value: str | None
    reason: str


DeadLetter = RefusedChange | UnreadableRecord

# A letter carries the record's contents up to this size; a larger one carries its Kafka
# position and size only (the record is still in its topic), so no record is too large to
# be dead-lettered under the broker's default 1 MB limit.
MAX_LETTER_BYTES = 512 * 1024

# (bootstrap servers, topic) known to exist, per process.
_READY: set[tuple[str, str]] = set()


def ensure_topic(settings: Settings) -> None:
    """Create the dead-letter topic if it is missing (brokers may not auto-create topics)."""
    k = settings.kafka
    if (k.bootstrap_servers, k.dead_letter_topic) in _READY:
        return
    admin = AdminClient({**client_config(k)})
    if k.dead_letter_topic not in admin.list_topics(timeout=30).topics:
        new = NewTopic(
            k.dead_letter_topic, num_partitions=1, replication_factor=k.replication_factor
        )
        try:
            admin.create_topics([new])[k.dead_letter_topic].result(timeout=30)
        except KafkaException as e:
            # Another job may have created it a moment ago.
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise PublishError(
                    f"cannot create the dead-letter topic {k.dead_letter_topic}: {e.args[0].str()}"
                ) from e
    _READY.add((k.bootstrap_servers, k.dead_letter_topic))


def letter(rec: DeadLetter, job: str) -> bytes:
    """The letter's JSON: the record with the job and the time; without its contents (and
    with ``truncated`` and ``bytes``) when that would exceed :data:`MAX_LETTER_BYTES`."""
    stamp = {"job": job, "ts_ms": int(time.time() * 1000)}
    try:
        body = orjson.dumps({**rec, **stamp}, default=plain, option=orjson.OPT_NON_STR_KEYS)
        size: int | None = len(body)
    except (TypeError, orjson.JSONEncodeError):  # contents no JSON can carry
        body, size = b"", None
    if size is not None and size <= MAX_LETTER_BYTES:
        return body
    slim: dict[str, Any] = {k: v for k, v in rec.items() if k not in ("doc", "value", "key")}
    key = rec.get("key")
    slim["key"] = key if key is None or len(key) <= 4096 else key[:4096]
    return orjson.dumps({**slim, **stamp, "truncated": True, "bytes": size})


def _key(rec: DeadLetter) -> bytes | None:
    key = rec.get("key")
    if key is None:
        return None
    raw = key.encode() if isinstance(key, str) else bytes(key)
    return raw[:4096]


def publish(settings: Settings, job: str, records: Iterable[DeadLetter]) -> int:
    """Publish refused records with the reason; returns how many Kafka acknowledged.

    Raises PublishError unless every one was acknowledged: the batch then fails and is
    retried, so a poison message is never dropped silently.
    """
    ensure_topic(settings)
    topic = settings.kafka.dead_letter_topic
    producer = Producer(client_config(settings.kafka) | {"acks": "all", "enable.idempotence": True})
    errors: list[str] = []
    sent = 0

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(str(err))

    for rec in records:
        producer.produce(topic, key=_key(rec), value=letter(rec, job), on_delivery=delivered)
        sent += 1
    left = producer.flush(60)
    if left or errors:
        raise PublishError(
            f"dead-letter topic {topic}: {left} not delivered, {len(errors)} refused ({errors[:1]})"
        )
    return sent
