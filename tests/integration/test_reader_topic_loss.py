"""A table topic that lost what it held (deleted, or deleted and created again) ends equal to
the table again (cdc.topic_ids): under a running reader, and while the reader was stopped,
when ``cdc status`` says so until the reader has snapshotted the table into it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from pgcdc.core.contract import table_topic
from tests.conftest import Endpoints, unique, wait_until
from tests.integration.reader_support import (
    ReaderEnv,
    assert_topic_equals_table,
    read_topic,
    reduce_latest,
    table_rows,
)

pytestmark = pytest.mark.integration

ROWS = 2_000


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL)")
        conn.execute(
            "INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, %s) g", (ROWS,)
        )
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result()
    wait_until(
        lambda: topic not in admin.list_topics(timeout=10).topics,
        timeout=60,
        what=f"{topic} to be deleted",
    )


def _equal(reader: ReaderEnv, topic: str) -> bool:
    latest = {k: v for k, v in reduce_latest(read_topic(reader.bootstrap, topic)).items() if v}
    return latest == table_rows(reader.dsn)


def _write(dsn: str, first: int, count: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(first, first + count):
            conn.execute("INSERT INTO items VALUES (%s, 'later')", (i,))
        conn.execute("UPDATE items SET v = 'changed' WHERE id <= 10")


def test_a_topic_deleted_under_the_running_reader_ends_equal_to_the_table(
    reader: ReaderEnv, tmp_path: Path
) -> None:
    topic = table_topic(reader.prefix, "public", "items")
    log = tmp_path / "reader.log"
    proc = reader.start(log_path=log, CDC_POSTGRES__RECONNECT_TIMEOUT_S="120")
    try:
        wait_until(lambda: _equal(reader, topic), timeout=120, what="the snapshot in Kafka")
        _delete_topic(reader.bootstrap, topic)
        _write(reader.dsn, ROWS + 1, 50)  # changes for the deleted topic
        wait_until(
            lambda: (
                topic
                in AdminClient({"bootstrap.servers": reader.bootstrap})
                .list_topics(timeout=10)
                .topics
                and _equal(reader, topic)
            ),
            timeout=180,
            what="the new topic to hold the whole table",
        )
        text = log.read_text(errors="replace")
        assert proc.poll() is None, text[-3000:]
        # The path under test: the run that lost its topic gave way to one that found it lost.
        assert "was deleted under the reader" in text, text[-3000:]
        assert "snapshotting public.items again" in text, text[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text(errors="replace")[-3000:]
    assert_topic_equals_table(read_topic(reader.bootstrap, topic), reader.dsn)


def test_a_topic_lost_while_the_reader_was_stopped_is_unhealthy_until_snapshotted_again(
    reader: ReaderEnv,
) -> None:
    topic = table_topic(reader.prefix, "public", "items")
    reader.catch_up()
    assert reader.run("status").returncode == 0
    _delete_topic(reader.bootstrap, topic)
    _write(reader.dsn, ROWS + 1, 20)
    # Created again empty by someone else: another id, same name.
    admin = AdminClient({"bootstrap.servers": reader.bootstrap})
    new = NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})
    admin.create_topics([new])[topic].result()
    status = reader.run("status", "--json")
    assert status.returncode == 3, status.stdout + status.stderr
    problems = json.loads(status.stdout)["problems"]
    assert any(f"topic {topic} was deleted and created again" in p for p in problems), problems

    done = reader.catch_up()
    assert "snapshotting public.items again" in done.stderr
    assert_topic_equals_table(read_topic(reader.bootstrap, topic), reader.dsn)
    healthy = reader.run("status", "--json")
    assert healthy.returncode == 0, healthy.stdout
