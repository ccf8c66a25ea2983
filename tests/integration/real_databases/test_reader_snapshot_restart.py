"""A PostgreSQL restart during the initial snapshot: the reader starts the snapshot over by
itself (postgres.snapshot_retries) and the topic ends equal to the table.

The table is large and the chunks small, so the restart lands while the snapshot still copies
(the log's retry line proves it did). The server is a throwaway of this test's own; the reader
runs as ``cdc run``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcdc.core.contract import table_topic
from tests.conftest import Endpoints, unique, wait_until
from tests.e2e.pipeline import Pipeline
from tests.integration.reader_support import end_offset
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

ROWS = 200_000
CHUNK_ROWS = 2_000  # a hundred chunks: the first is in Kafka long before the last is read


def test_a_restart_during_the_initial_snapshot_starts_it_over_and_loses_nothing(
    endpoints: Endpoints, server: ThrowawayServer, tmp_path: Path
) -> None:
    server.create_database("app")
    dsn = dsn_of(server, "app")
    with server.connect("app") as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL)")
        conn.execute(
            "INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, %s) g", (ROWS,)
        )
        conn.execute("ANALYZE items")
    name = unique("snaprestart")
    p = Pipeline(endpoints, dsn, name, name, name, tmp_path / "checkpoints")
    topic = table_topic(name, "public", "items")
    log = tmp_path / "reader.log"
    bootstrap = endpoints.kafka_bootstrap
    with cdc_run(
        p,
        log,
        CDC_POSTGRES__RECONNECT_TIMEOUT_S="120",
        CDC_POSTGRES__SNAPSHOT_CHUNK_ROWS=str(CHUNK_ROWS),
        CDC_POSTGRES__SNAPSHOT_WORKERS="1",
    ) as reader:
        wait_until(
            lambda: require_running(reader, log) or 0 < end_offset(bootstrap, topic) < ROWS,
            timeout=120,
            interval=0.05,
            what="the snapshot's first records in Kafka",
        )
        server.restart()
        with server.connect("app") as conn:
            conn.execute("UPDATE items SET v = 'updated after the restart' WHERE id <= 10")

        assert wait_streaming(server, name, reader, log, timeout=300) is server.tls
        wait_until(
            lambda: require_running(reader, log) or topic_equals_table(bootstrap, topic, dsn),
            timeout=120,
            interval=2,
            what="the topic equal to the table after the snapshot started over",
        )
        text = tail(log, 1_000_000)
        # The path under test was taken: the snapshot lost PostgreSQL and started over.
        assert "the initial snapshot lost PostgreSQL" in text, text[-3000:]
        assert "(snapshot attempt 2 of 4)" in text, text[-3000:]
        assert text.count("snapshot complete") == 1, text[-3000:]
