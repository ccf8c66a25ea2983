"""Where the reader's producer puts keyed records, computed without producing
(cdc.partitioner through Publisher.partition_for), checked against librdkafka on a real
topic of several partitions: what a re-snapshot relies on to put an old-bytes tombstone in
its row's partition."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka import Producer

from cdc.publisher import Publisher, producer_config
from pgcdc.core.settings import KafkaSettings
from tests.conftest import Endpoints

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("partitioner", [None, "murmur2_random"])
def test_partition_for_is_where_the_producer_puts_the_key(
    endpoints: Endpoints, topic_prefix: str, partitioner: str | None
) -> None:
    settings = KafkaSettings(
        bootstrap_servers=endpoints.kafka_bootstrap,
        topic_prefix=topic_prefix,
        partitions=6,
        producer={"partitioner": partitioner} if partitioner else {},
    )
    topic = f"{topic_prefix}.public.items"
    publisher = Publisher(settings)
    publisher.ensure_topics([topic])
    keys = [
        orjson.dumps({"schema": {"type": "struct"}, "payload": {"id": i}}) for i in range(300)
    ] + [orjson.dumps({"id": i}) for i in range(300)]
    placed: dict[bytes, int] = {}
    producer = Producer(producer_config(settings))
    for k in keys:
        producer.produce(
            topic,
            key=k,
            value=b"{}",
            on_delivery=lambda e, m: placed.__setitem__(m.key(), m.partition()),
        )
    assert producer.flush(30) == 0
    assert len(set(placed.values())) == 6  # the keys really spread
    assert {k: publisher.partition_for(topic, k) for k in keys} == placed
