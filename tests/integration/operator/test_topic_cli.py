"""``cdc topic tail`` and ``cdc topic send`` on the real broker: the newest records across
partitions in time order, a missing or empty topic said in words, a record written and read
back (what the docs use instead of kcat), and ``python -m demo.peek`` on the same reading."""

from __future__ import annotations

import json
import os
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner

from cdc.cli import app
from tests.conftest import Endpoints

pytestmark = [pytest.mark.integration]


@pytest.fixture
def env(endpoints: Endpoints, topic_prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in list(os.environ):
        if name.upper().startswith("CDC_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", endpoints.kafka_bootstrap)
    monkeypatch.setenv("CDC_KAFKA__TOPIC_PREFIX", topic_prefix)
    monkeypatch.setenv("CDC_KAFKA__DEAD_LETTER_TOPIC", f"{topic_prefix}.dlq")
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    topic = f"{topic_prefix}.public.items"
    for fut in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        fut.result()
    return {"topic": topic, "prefix": topic_prefix}


def _cdc(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_tail_says_missing_and_empty(env: dict[str, str]) -> None:
    # With no record to show, the line that says why is the output.
    rc, out, err = _cdc("topic", "tail", "--dead-letters")
    assert rc == 0 and err == ""
    assert f"topic {env['prefix']}.dlq does not exist (it is created with the first dead" in out
    rc, out, err = _cdc("topic", "tail", env["topic"])
    assert rc == 0 and out == f"topic {env['topic']} is empty\n"
    rc, out, err = _cdc("topic", "send", f"{env['prefix']}.nowhere", "--value", "{}")
    assert rc == 1 and f"topic {env['prefix']}.nowhere does not exist" in err


def test_send_then_tail_the_newest_in_order(env: dict[str, str]) -> None:
    for i in range(5):
        rc, out, _ = _cdc("topic", "send", env["topic"], "--key", f"k{i}", stdin=f'{{"n": {i}}}')
        assert rc == 0 and out.startswith(f"written to {env['topic']} partition ")
    rc, out, err = _cdc("topic", "tail", env["topic"], "--last", "3")
    assert rc == 0, err
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("{")] == ['{"n": 2}', '{"n": 3}', '{"n": 4}']
    heads = [line for line in lines if line.startswith("partition ")]
    assert [h.split(" key ")[1] for h in heads] == ["k2", "k3", "k4"]
    assert f"topic {env['topic']}: the newest 3 of 5 records" in err


def test_demo_peek_shows_the_newest_of_the_whole_topic(
    env: dict[str, str], endpoints: Endpoints, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three records in each of three partitions: "the last 3 events" are the newest three
    # of the topic, not the last three of each partition.
    from confluent_kafka import Producer

    from demo import peek

    producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap})
    # Times of now: the broker deletes records older than the topic's retention (7 days),
    # which a fixed time in the past soon was (CI saw a partition's records, then all three,
    # gone before the read: the stack checks retention every 10 s).
    now_ms = int(time.time() * 1000)
    failed: list[str] = []
    for i in range(9):
        value = json.dumps({"payload": {"op": "c", "before": None, "after": {"n": i}}})
        key = json.dumps({"payload": {"id": i}})
        producer.produce(
            env["topic"],
            key=key,
            value=value,
            partition=i % 3,
            timestamp=now_ms - 9 + i,
            on_delivery=lambda err, _msg: failed.append(err.str()) if err else None,
        )
    assert producer.flush(10) == 0 and failed == []
    assert peek.main([env["topic"], "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" key ")[1] for line in lines] == [
        f'{{"id": {i}}}: {{"op": "c", "before": null, "after": {{"n": {i}}}}}' for i in (6, 7, 8)
    ]
