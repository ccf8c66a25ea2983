"""A PostgreSQL restart under a streaming reader: it reconnects by itself and loses nothing.

The server is a throwaway of this test's own (the stack's PostgreSQL is shared with the rest
of the suite and is not restarted here). The reader runs as ``cdc run``, the way users run it.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from pgcdc.core.contract import table_topic
from tests.conftest import Endpoints, unique, wait_until
from tests.e2e.pipeline import CDC, ROOT, Pipeline
from tests.integration.reader_support import read_topic
from tests.integration.real_databases.throwaway import ThrowawayServer, throwaway_server

pytestmark = pytest.mark.integration

ROWS = 200


@pytest.fixture
def server() -> Iterator[ThrowawayServer]:
    with throwaway_server() as s:
        yield s


def _ids(bootstrap: str, topic: str) -> set[int]:
    return {r.key_id for r in read_topic(bootstrap, topic) if r.value is not None}


def test_the_reader_reconnects_after_a_postgresql_restart_and_loses_nothing(
    endpoints: Endpoints, server: ThrowawayServer, tmp_path: Path
) -> None:
    dsn = server.create_database("app")
    with server.connect("app") as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL)")
    name = unique("reconnect")
    p = Pipeline(endpoints, dsn, name, name, name, tmp_path / "checkpoints")
    topic = table_topic(name, "public", "items")
    log = tmp_path / "reader.log"
    with log.open("ab") as out:
        reader = subprocess.Popen(
            [*CDC, "run"],
            env=p.env(PYTHONUNBUFFERED="1", CDC_POSTGRES__RECONNECT_TIMEOUT_S="120"),
            cwd=ROOT,
            stdout=out,
            stderr=out,
        )
    try:
        # The reader has reached the stream once it has created the slot and its topic.
        wait_until(
            lambda: (
                server.connect("app")
                .execute(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (name,)
                )
                .fetchone()
            ),
            timeout=90,
            what="the reader to stream",
        )
        with server.connect("app") as conn:
            for i in range(ROWS // 2):
                conn.execute("INSERT INTO items VALUES (%s, 'before the restart')", (i,))
        wait_until(
            lambda: len(_ids(endpoints.kafka_bootstrap, topic)) == ROWS // 2,
            timeout=90,
            what="the first half in Kafka",
        )

        server.restart()
        with server.connect("app") as conn:
            for i in range(ROWS // 2, ROWS):
                conn.execute("INSERT INTO items VALUES (%s, 'after the restart')", (i,))
            conn.execute("UPDATE items SET v = 'updated after the restart' WHERE id < 10")

        wait_until(
            lambda: len(_ids(endpoints.kafka_bootstrap, topic)) == ROWS,
            timeout=120,
            what="every row in Kafka after the restart",
        )
        records = read_topic(endpoints.kafka_bootstrap, topic)
        updated = {
            r.key_id for r in records if r.payload and r.payload["after"]["v"].startswith("upd")
        }
        assert updated == set(range(10))
        text = log.read_text(errors="replace")
        assert reader.poll() is None, f"the reader exited after the restart:\n{text[-3000:]}"
        # The path under test was taken: the stream was lost and a new run resumed it.
        assert "lost PostgreSQL" in text and "reconnecting in" in text, text[-3000:]
    finally:
        reader.send_signal(signal.SIGTERM)
        try:
            rc = reader.wait(timeout=60)
        except subprocess.TimeoutExpired:
            reader.kill()
            rc = reader.wait()
        admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
        topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(name)]
        if topics:
            for fut in admin.delete_topics(topics, operation_timeout=30).values():
                fut.result()
    assert rc == 0, log.read_text(errors="replace")[-3000:]
