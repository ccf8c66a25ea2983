"""A PostgreSQL restart under a streaming reader: it reconnects by itself and loses nothing,
over a plain connection and over TLS (where libpq words the loss differently: "SSL connection
has been closed unexpectedly").

The server is a throwaway of this test's own (the stack's PostgreSQL is shared with the rest
of the suite and is not restarted here). The reader runs as ``cdc run``, the way users run it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcdc.core.contract import table_topic
from tests.conftest import Endpoints, unique, wait_until
from tests.e2e.pipeline import Pipeline
from tests.integration.reader_support import assert_topic_equals_table, read_topic
from tests.integration.real_databases.reader_process import (
    cdc_run,
    require_running,
    tail,
    wait_streaming,
)
from tests.integration.real_databases.throwaway import ThrowawayServer, throwaway_server

pytestmark = pytest.mark.integration

ROWS = 200


@pytest.fixture(params=[False, True], ids=["plain", "tls"])
def server(request: pytest.FixtureRequest) -> Iterator[ThrowawayServer]:
    with throwaway_server(tls=request.param) as s:
        yield s


def _ids(bootstrap: str, topic: str) -> set[int]:
    return {r.key_id for r in read_topic(bootstrap, topic) if r.value is not None}


def _topic_equals_table(bootstrap: str, topic: str, dsn: str) -> bool:
    assert_topic_equals_table(read_topic(bootstrap, topic), dsn)
    return True


def test_the_reader_reconnects_after_a_postgresql_restart_and_loses_nothing(
    endpoints: Endpoints, server: ThrowawayServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    tls = "tls" in request.node.callspec.id
    dsn = server.create_database("app") + ("?sslmode=require" if tls else "?sslmode=disable")
    with server.connect("app") as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL)")
    name = unique("reconnect")
    p = Pipeline(endpoints, dsn, name, name, name, tmp_path / "checkpoints")
    topic = table_topic(name, "public", "items")
    log = tmp_path / "reader.log"
    with cdc_run(p, log, CDC_POSTGRES__RECONNECT_TIMEOUT_S="120") as reader:
        assert wait_streaming(server, name) is tls
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
            lambda: (
                require_running(reader, log)
                or _topic_equals_table(endpoints.kafka_bootstrap, topic, dsn)
            ),
            timeout=120,
            what="the topic equal to the table after the restart",
        )
        require_running(reader, log)
        text = tail(log, 100_000)
        # The path under test was taken: the stream was lost and a new run resumed it.
        assert "lost PostgreSQL" in text and "reconnecting in" in text, text[-3000:]
        # Streaming again, over TLS when asked for.
        assert wait_streaming(server, name) is tls
