"""A job's topic pattern takes a topic's whole name, in Spark's Kafka source too, whose
``subscribePattern`` takes every topic the pattern is found in (spark_jobs.source.subscription):
another prefix that ends with the job's, or that begins with it, is not read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pgcdc.core.contract import CACHE_JOB
from spark_jobs.options import parse_args
from spark_jobs.source import subscription
from tests.conftest import Endpoints

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def topics(endpoints: Endpoints, topic_prefix: str) -> Iterator[dict[str, bool]]:
    """Topics of one record each, by whether the job of the prefix ``<topic_prefix>_cdc``
    reads them."""
    ours = f"{topic_prefix}_cdc"
    wanted = {
        f"{ours}.public.items": True,
        f"__cdc-heartbeat.{ours}": True,
        f"{topic_prefix}_my{ours}.public.items": False,  # a prefix that ends with ours
        f"{ours}.public.items.v2": False,  # one that a table topic of ours begins
        f"__cdc-heartbeat.{ours}_staging": False,  # another server's heartbeats
    }
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in wanted]).values():
        fut.result(30)
    producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap})
    for t in wanted:
        producer.produce(t, b"v", b"k")
    assert producer.flush(30) == 0
    try:
        yield wanted
    finally:
        for fut in admin.delete_topics(list(wanted), operation_timeout=30).values():
            fut.result()


def test_the_pattern_takes_whole_names_in_sparks_kafka_source(
    spark: Any,
    endpoints: Endpoints,
    topic_prefix: str,
    topics: dict[str, bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CDC_KAFKA__TOPIC_PREFIX", f"{topic_prefix}_cdc")
    _, opts = parse_args(CACHE_JOB, [])
    wanted = subscription(opts)
    assert wanted.pattern is not None
    read = {
        row.topic
        for row in spark.read.format("kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribePattern", wanted.pattern)
        .load()
        .select("topic")
        .collect()
    }
    assert read & set(topics) == {t for t, ours in topics.items() if ours}
    # The direct read's Python planner takes the same topics.
    assert {t for t in topics if wanted.wants(t)} == read & set(topics)
