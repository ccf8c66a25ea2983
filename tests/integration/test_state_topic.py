"""The reader's state topic on the real Kafka: records past Kafka's 1 MB default (a slot's
incremental snapshots, table shapes and a week of signals), also in a topic made before."""

from __future__ import annotations

import os

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from cdc.state import STATE_RECORD_BYTES, StateStore
from cdc.table_topics import topic_config
from pgcdc.core.settings import KafkaSettings
from tests.conftest import Endpoints, unique

pytestmark = pytest.mark.integration


def test_a_state_topic_made_before_takes_a_record_past_one_megabyte(endpoints: Endpoints) -> None:
    kafka = KafkaSettings(bootstrap_servers=endpoints.kafka_bootstrap)
    prefix = unique("st")
    store = StateStore(kafka, prefix)
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    # As a reader before this change made it: compacted, Kafka's default record limit.
    created = admin.create_topics(
        [NewTopic(store.topic, 1, 1, config={"cleanup.policy": "compact"})]
    )
    created[store.topic].result(30)
    try:
        assert int(topic_config(kafka, store.topic, "max.message.bytes") or 0) < 2**20 + 1024
        store.ensure_topic()
        limit = topic_config(kafka, store.topic, "max.message.bytes")
        assert limit is not None and int(limit) == STATE_RECORD_BYTES
        big = os.urandom(3 * 2**20).hex().encode()  # 6 MB, random: lz4 leaves it large
        store.save_record(b"k", big)
        assert StateStore(kafka, prefix).load_record(b"k") == big
    finally:
        admin.delete_topics([store.topic])[store.topic].result(30)
