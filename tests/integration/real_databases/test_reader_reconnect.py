"""A PostgreSQL restart under a streaming reader: it reconnects by itself and loses nothing,
over a plain connection and over TLS (where libpq words the loss differently: "SSL connection
has been closed unexpectedly").

The server is a throwaway of this test's own (the stack's PostgreSQL is shared with the rest
of the suite and is not restarted here). The reader runs as ``cdc run``, the way users run it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcdc.core.contract import table_topic
from tests.conftest import Endpoints, unique, wait_until
from tests.e2e.pipeline import Pipeline
from tests.integration.reader_support import read_topic
from tests.integration.real_databases.reader_process import (  # noqa: F401 (server_fixture)
    cdc_run,
    dsn_of,
    require_running,
    server_fixture,
    tail,
    topic_equals_table,
    wait_streaming,
)
from tests.integration.real_databases.throwaway import ThrowawayServer

pytestmark = pytest.mark.integration

ROWS = 200


def _ids(bootstrap: str, topic: str) -> set[int]:
    return {r.key_id for r in read_topic(bootstrap, topic) if r.value is not None}


def test_the_reader_reconnects_after_a_postgresql_restart_and_loses_nothing(
    endpoints: Endpoints, server: ThrowawayServer, tmp_path: Path
) -> None:
    server.create_database("app")
    dsn = dsn_of(server, "app")
    with server.connect("app") as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL)")
    name = unique("reconnect")
    p = Pipeline(endpoints, dsn, name, name, name, tmp_path / "checkpoints")
    topic = table_topic(name, "public", "items")
    log = tmp_path / "reader.log"
    with cdc_run(p, log, CDC_POSTGRES__RECONNECT_TIMEOUT_S="120") as reader:
        assert wait_streaming(server, name, reader, log) is server.tls
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
                or topic_equals_table(endpoints.kafka_bootstrap, topic, dsn)
            ),
            timeout=120,
            what="the topic equal to the table after the restart",
        )
        require_running(reader, log)
        text = tail(log, 100_000)
        # The path under test was taken: the stream was lost and a new run resumed it.
        assert "lost PostgreSQL" in text and "reconnecting in" in text, text[-3000:]
        # Streaming again, over TLS when asked for.
        assert wait_streaming(server, name, reader, log) is server.tls
