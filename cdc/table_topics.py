"""Table topics by kind: compacted for keyed tables, ``cleanup.policy=delete`` for the others.

A compacted topic refuses a record without a key, so a keyless table (see :mod:`cdc.keys`)
gets a topic that deletes by age instead, as Debezium's do (Kafka's default retention,
7 days, unless the topic says otherwise), and so do Debezium's ``t`` events of keyed tables
(:func:`pgcdc.core.contract.truncate_topic`). A keyless table whose topic already exists
compacted (it had a key once) would make Kafka refuse its every record: that stops the
reader at once with one line saying what to do, instead of on the first change.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin._config import ConfigResource

from cdc.kafka_clients import admin_client, as_settings
from cdc.keys import KEY_COLUMNS_SETTING
from cdc.publisher import MAX_RECORD_BYTES, Publisher
from pgcdc.core.errors import ConfigError, PublishError
from pgcdc.core.settings import KafkaSettings

KEYLESS_TOPIC_CONFIG = {"cleanup.policy": "delete", "max.message.bytes": str(MAX_RECORD_BYTES)}


class TableTopics:
    """Creates table topics of the right kind, once per topic and process."""

    def __init__(self, publisher: Publisher, kafka: KafkaSettings) -> None:
        self._publisher = publisher
        self._kafka = kafka
        self._checked: set[str] = set()

    def ensure(self, topic: str, *, keyless: bool, table: str) -> None:
        """Create ``topic`` if missing; a keyless table's topic must not be compacted."""
        if not keyless:
            self._publisher.ensure_topics([topic])
            return
        if topic in self._checked:
            return
        # One partition: records without a key would be spread at random over several,
        # and a reader of the topic would lose the table's order.
        self._publisher.ensure_topics([topic], partitions=1, config=dict(KEYLESS_TOPIC_CONFIG))
        if "compact" in cleanup_policy(self._kafka, topic):
            raise ConfigError(
                f"table {table} has no key, but its topic {topic} is compacted "
                "(cleanup.policy=compact refuses records without a key): key it with "
                f"{KEY_COLUMNS_SETTING}, or set the topic's cleanup.policy to delete"
            )
        self._checked.add(topic)

    def ensure_plain(self, topic: str, partitions: int = 1) -> None:
        """Create a non-compacted side topic (the truncate topic) if missing."""
        if topic not in self._checked:
            self._publisher.ensure_topics(
                [topic], partitions=partitions, config=dict(KEYLESS_TOPIC_CONFIG)
            )
            self._checked.add(topic)


def cleanup_policy(kafka: KafkaSettings | str, topic: str, timeout_s: float = 30.0) -> str:
    """The topic's ``cleanup.policy`` (e.g. ``compact``, ``delete``, ``compact,delete``)."""
    return topic_config(kafka, topic, "cleanup.policy", timeout_s) or "delete"


def topic_config(
    kafka: KafkaSettings | str, topic: str, name: str, timeout_s: float = 30.0
) -> str | None:
    """The topic's value of configuration ``name`` (None: the topic has no such entry)."""
    admin = admin_client(as_settings(kafka))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            configs = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
            break
        except KafkaException as e:
            err = e.args[0]
            # A topic created a moment ago may not have reached the broker that answers.
            if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise PublishError(f"cannot read the configuration of {topic}: {err.str()}") from e
    entry = configs.get(name)
    return str(entry.value) if entry is not None else None
