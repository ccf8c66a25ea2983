"""The direct read against a real broker: a task's range, the marks the driver plans from."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pgcdc.core.kafka_config import client_config
from pgcdc.core.settings import KafkaSettings
from spark_jobs.kafka_direct import DirectReader, Range, Subscription, read_range
from tests.conftest import Endpoints, wait_until
from tests.integration.proxied_kafka import proxied_kafka

pytestmark = pytest.mark.integration


def _topic(endpoints: Endpoints, name: str, records: int) -> None:
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    p = Producer({"bootstrap.servers": endpoints.kafka_bootstrap})
    for i in range(records):
        p.produce(name, f"v{i}".encode(), f"k{i}".encode(), partition=i % 2, headers=[("h", b"1")])
    assert p.flush(30) == 0


def test_a_range_is_read_exactly_and_its_end_may_be_the_high_mark(
    endpoints: Endpoints, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.public.items"
    _topic(endpoints, topic, 40)  # 20 a partition, offsets 0..19
    conf = {"bootstrap.servers": endpoints.kafka_bootstrap}
    middle = list(read_range(conf, Range(topic, 0, 3, 8)))
    assert [r.offset for r in middle] == [3, 4, 5, 6, 7]
    assert [r.value for r in middle] == [f"v{2 * o}".encode() for o in range(3, 8)]
    assert middle[0].headers == [("h", b"1")]
    assert [r.offset for r in read_range(conf, Range(topic, 1, 15, 20))] == list(range(15, 20))


def test_one_consumer_reads_range_after_range_and_a_failed_one_is_closed(
    endpoints: Endpoints, topic_prefix: str
) -> None:
    """A process keeps its consumer for the next range: nothing of a range left part way
    (its prefetched records) reaches the next one, of another partition or topic (a topic
    new to it is looked up before it is assigned: it knows the topics it has read); a
    consumer whose read failed is not kept."""
    from spark_jobs import kafka_direct

    a, b = f"{topic_prefix}.public.a", f"{topic_prefix}.public.b"
    _topic(endpoints, a, 40)
    _topic(endpoints, b, 40)
    conf = {"bootstrap.servers": endpoints.kafka_bootstrap, "client.id": topic_prefix}
    key = tuple(sorted(conf.items()))
    first = read_range(conf, Range(a, 0, 0, 20))
    assert next(first).offset == 0  # its partition fetched ahead, then left
    first.close()
    [kept] = kafka_direct._IDLE[key]
    assert kept.topics == {a}
    got = [(r.topic, r.partition, r.offset) for r in read_range(conf, Range(b, 1, 5, 9))]
    assert got == [(b, 1, o) for o in range(5, 9)]
    assert kafka_direct._IDLE[key] == [kept]  # the same consumer, read again
    assert kept.topics == {a, b}
    again = list(read_range(conf, Range(a, 0, 18, 20)))
    assert [(r.topic, r.offset, r.value) for r in again] == [(a, 18, b"v36"), (a, 19, b"v38")]
    assert kafka_direct._IDLE[key] == [kept]
    # Two ranges read at once take two consumers; both are kept with keep=2, one with 1.
    one, two = (
        read_range(conf, Range(a, 0, 0, 2), keep=2),
        read_range(conf, Range(b, 0, 0, 2), keep=2),
    )
    assert next(one).offset == 0 and next(two).offset == 0
    assert key not in kafka_direct._IDLE  # both taken: the kept one and a new one
    assert len(list(one)) == len(list(two)) == 1
    assert len(kafka_direct._IDLE[key]) == 2 and kept in kafka_direct._IDLE[key]
    assert len(list(read_range(conf, Range(a, 1, 0, 3)))) == 3
    assert len(kafka_direct._IDLE[key]) == 1  # keep=1: the one read with is not kept again
    # Another configuration's consumer takes their place: one configuration is kept.
    other = {**conf, "client.id": f"{topic_prefix}-2"}
    assert len(list(read_range(other, Range(a, 1, 0, 3)))) == 3
    assert list(kafka_direct._IDLE) == [tuple(sorted(other.items()))]
    assert len(list(read_range(conf, Range(a, 1, 0, 3)))) == 3
    assert list(kafka_direct._IDLE) == [key]
    # A topic that does not exist: the read fails (an error from the client, or nothing
    # at all until the stall gives up), and its consumer is closed, not kept.
    with pytest.raises((KafkaException, TimeoutError)):
        list(read_range(conf, Range(f"{topic_prefix}.public.none", 0, 0, 5), stall_s=2))
    assert key not in kafka_direct._IDLE


def test_records_gone_before_the_range_start_at_the_log_start(
    endpoints: Endpoints, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"{topic_prefix}.public.items"
    _topic(endpoints, topic, 20)
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    for fut in admin.delete_records([TopicPartition(topic, 0, 6)]).values():
        fut.result(30)
    conf = {"bootstrap.servers": endpoints.kafka_bootstrap}
    assert [r.offset for r in read_range(conf, Range(topic, 0, 2, 9))] == [6, 7, 8]
    # The first batch from "earliest" reads from offset 0 (ApplyBatch._logged_ranges).
    assert [r.offset for r in read_range(conf, Range(topic, 0, 0, 9))] == [6, 7, 8]
    reader = DirectReader(
        client_config(KafkaSettings(bootstrap_servers=endpoints.kafka_bootstrap)),
        Subscription((), rf"{topic_prefix}\..*"),
        "earliest",
        None,
    )
    marks = reader.marks()
    assert marks == {topic: {"0": (6, 10), "1": (0, 10)}}
    # The driver's next end: partition 0 starts over at its log start, and says so.
    assert reader.latestOffset({topic: {"0": 2, "1": 4}}, reader.getDefaultReadLimit()) == {
        topic: {"0": 6, "1": 10}
    }
    assert f"{topic}[0]: offsets 2..5 are gone (log start 6)" in caplog.text
    assert reader.initialOffset() == {topic: {"0": 6, "1": 0}}


def test_the_marks_are_asked_again_across_a_broker_restart_within_a_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker restart made the planning's requests fail ("No leaders found") and the job
    stop (make soak found it): they are asked again, said once, until the broker answers;
    past spark.kafka_unavailable_s the planning fails with one line."""
    caplog.set_level(logging.INFO, logger="spark_jobs.kafka_direct")
    with proxied_kafka(tmp_path / "kafka") as kafka:
        topic = "direct.public.items"
        _topic(Endpoints("", kafka.bootstrap, "", "", "proxied"), topic, 10)
        reader = DirectReader(
            client_config(KafkaSettings(bootstrap_servers=kafka.bootstrap)),
            Subscription((), r"direct\..*"),
            "earliest",
            None,
            unavailable_s=120,
        )
        reader.ask_s = 2.0
        before = reader.marks()
        assert before == {topic: {"0": (0, 5), "1": (0, 5)}}
        kafka.broker.stop()
        got: dict[str, object] = {}
        asking = threading.Thread(target=lambda: got.update(marks=reader.marks()))
        asking.start()
        wait_until(lambda: "asking again for up to 120 s" in caplog.text, timeout=60)
        kafka.broker.start()
        kafka.broker.wait_ready()
        asking.join(120)
        assert got == {"marks": before}
        assert "answers the direct read's requests for its offsets again" in caplog.text
        assert caplog.text.count("does not answer the direct read's requests") == 1

        kafka.proxy.cut()
        reader.unavailable_s = 3.0
        with pytest.raises(RuntimeError, match=r"did not answer the direct read's requests"):
            reader.marks()
