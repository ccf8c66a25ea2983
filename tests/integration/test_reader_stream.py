"""The reader against real PostgreSQL and Kafka: snapshot/stream boundary, order, idle slots."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.conftest import Endpoints, unique, wait_until
from tests.integration.reader_support import (
    ReaderEnv,
    Workload,
    assert_key_order,
    assert_no_change_missing,
    assert_topic_equals_table,
    read_topic,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


@pytest.mark.slow
def test_snapshot_stream_boundary_with_concurrent_writers(reader: ReaderEnv) -> None:
    wl = Workload(reader.dsn, "public.items", writers=3, ops_per_txn=4, seed=7)
    wl.setup(100_000)
    wl.start()
    try:
        # The snapshot runs while the writers commit changes on both sides of its position.
        first = reader.catch_up(CDC_KAFKA__PARTITIONS="2")
        assert "snapshot complete" in first.stderr
    finally:
        log = wl.stop()
    reader.catch_up()  # everything the writers committed after the first run's target
    records = read_topic(reader.bootstrap, f"{reader.prefix}.public.items")
    snapshot_markers = [
        r.payload["source"]["snapshot"] for r in records if r.payload and r.payload["op"] == "r"
    ]
    # Records are spread over two partitions: one "first", one "last", the rest "true".
    assert snapshot_markers.count("first") == 1 and snapshot_markers.count("last") == 1
    assert set(snapshot_markers) == {"first", "true", "last"}
    assert len(log) > 100
    assert_topic_equals_table(records, reader.dsn)
    assert_key_order(records)
    assert_no_change_missing(records, log)
    # Every delete is followed by a tombstone for the same key.
    for i, r in enumerate(records):
        if r.payload is not None and r.payload["op"] == "d":
            nxt = next(x for x in records[i + 1 :] if x.partition == r.partition)
            assert nxt.key == r.key and nxt.value is None


def _confirmed(dsn: str, slot: str) -> int | None:
    """The slot's confirmed position; None while CREATE_REPLICATION_SLOT still waits for the
    transactions open before it (the slot is active then, with no position yet)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        assert row is not None
        return None if row[0] is None else int(row[0])


@pytest.mark.slow
def test_idle_and_uncaptured_writes_advance_the_slot(reader: ReaderEnv, tmp_path: Path) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE captured (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE ignored (id int PRIMARY KEY, v text)")
    log_path = tmp_path / "reader.log"
    proc = reader.start(
        log_path=log_path,
        CDC_POSTGRES__TABLES="public.captured",
        CDC_POSTGRES__STATUS_INTERVAL_S="1",
    )
    try:

        def streaming() -> bool:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            return _slot_active(reader) and _confirmed(reader.dsn, reader.slot) is not None

        wait_until(streaming, timeout=60, what="the reader to stream")
        start = _confirmed(reader.dsn, reader.slot)
        assert start is not None
        # Writes only to a table outside the publication.
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            for i in range(200):
                conn.execute("INSERT INTO ignored VALUES (%s, 'x')", (i,))
            row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
            assert row is not None
            after_writes = int(row[0])
        assert after_writes > start
        wait_until(
            lambda: (_confirmed(reader.dsn, reader.slot) or 0) >= after_writes,
            timeout=90,
            what="confirmed_flush_lsn to pass uncaptured writes",
        )
        # No writes at all: WAL still moves (e.g. a checkpoint / switch), and the slot follows.
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_switch_wal()")
            row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
            assert row is not None
            idle_target = int(row[0])
        wait_until(
            lambda: (_confirmed(reader.dsn, reader.slot) or 0) >= idle_target,
            timeout=90,
            what="confirmed_flush_lsn to advance while idle",
        )
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, log_path.read_text(errors="replace")[-3000:]


def _slot_active(reader: ReaderEnv) -> bool:
    with psycopg.connect(reader.dsn) as conn:
        row = conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (reader.slot,)
        ).fetchone()
        return bool(row and row[0])


def test_a_lone_change_is_sent_when_the_source_goes_idle_not_after_linger(
    reader: ReaderEnv, tmp_path: Path
) -> None:
    """With linger.ms at 100 s, a single insert still reaches Kafka in seconds: once
    the stream has nothing more, the reader hurries its records to Kafka (latency) instead
    of letting them wait for a batch to fill."""
    from tests.integration.reader_support import end_offset

    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    log_path = tmp_path / "reader.log"
    proc = reader.start(
        log_path=log_path,
        CDC_POSTGRES__TABLES="public.items",
        CDC_KAFKA__PRODUCER='{"linger.ms": "100000"}',
    )
    topic = f"{reader.prefix}.public.items"
    try:

        def streaming() -> bool:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            return _slot_active(reader)

        wait_until(streaming, timeout=60, what="the reader to stream")
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (1, 'one')")
        wait_until(
            lambda: end_offset(reader.bootstrap, topic) >= 1,
            timeout=30,
            what="the lone insert in Kafka well before linger.ms (100 s)",
        )
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, log_path.read_text(errors="replace")[-3000:]
