"""Deletes leave tombstones, and a compacted topic still rebuilds the table from offset 0."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.conftest import Endpoints, unique, wait_until
from tests.integration.reader_support import (
    ReaderEnv,
    Record,
    assert_topic_equals_table,
    force_compaction,
    read_topic,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


def test_compaction_keeps_latest_per_live_key(reader: ReaderEnv, tmp_path: Path) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    reader.catch_up()  # the slot exists: what follows is streamed, deletes included
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 'a' FROM generate_series(1, 100) g")
        conn.execute("UPDATE items SET v = 'b' WHERE id <= 50")
        conn.execute("DELETE FROM items WHERE id > 80")
    reader.catch_up()
    topic = f"{reader.prefix}.public.items"
    before = read_topic(reader.bootstrap, topic)
    assert len(before) == 100 + 50 + 2 * 20
    for i, r in enumerate(before):
        if r.payload is not None and r.payload["op"] == "d":
            nxt = before[i + 1]
            assert nxt.key == r.key and nxt.value is None, "a delete without its tombstone"
    assert sum(1 for r in before if r.value is None) == 20

    force_compaction(reader.bootstrap, [topic])
    # The active segment is never cleaned, and tombstones go only in a cleaning pass after
    # delete.retention.ms: each poll writes one more update (more than segment.ms after the
    # last), which rolls the segment and gives the cleaner new dirty data.
    proc = reader.start(log_path=tmp_path / "reader.log")
    writes = 0

    def compacted() -> list[Record] | None:
        nonlocal writes
        assert proc.poll() is None, (tmp_path / "reader.log").read_text()[-3000:]
        writes += 1
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET v = %s WHERE id = 1", (f"c{writes}",))
        recs = read_topic(reader.bootstrap, topic)
        keys = [r.key_id for r in recs if r.key is not None]
        # At most one record per live key, apart from key 1's newest updates in the active
        # segment (not yet delivered or not yet cleaned), and nothing for deleted keys.
        dead = sorted({k for k in keys if k > 80})
        repeated = [k for k in set(keys) if keys.count(k) > 1 and k != 1]
        return recs if not dead and not repeated and len(recs) <= 80 + 3 else None

    try:
        wait_until(compacted, timeout=120, interval=0.5, what="the cleaner to compact the topic")
        # Compare with the table once the reader has every update to key 1 in Kafka.
        proc.terminate()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    recs = read_topic(reader.bootstrap, topic)
    assert len(recs) <= 80 + 3
    assert_topic_equals_table(recs, reader.dsn)  # a consumer from offset 0 rebuilds the table
