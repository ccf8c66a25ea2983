"""Heartbeats carry an acknowledged LSN (also when idle); --drop-slot-on-exit drops cleanly."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from tests.conftest import Endpoints, unique, wait_until
from tests.integration.reader_support import ReaderEnv, end_offset, read_topic, slot_row

pytestmark = pytest.mark.integration

ROWS = 20_000


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


def _wal_lsn(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
    assert row is not None
    return int(row[0])


def test_heartbeat_lsn_follows_acknowledged_events(reader: ReaderEnv, tmp_path: Path) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE other (id int)")  # not captured: WAL without events
    tables = {"CDC_POSTGRES__TABLES": "public.items"}
    reader.catch_up(**tables)
    proc = reader.start(
        log_path=tmp_path / "reader.log",
        CDC_POSTGRES__STATUS_INTERVAL_S="1",
        CDC_KAFKA__HEARTBEAT_INTERVAL_S="0.2",
        **tables,
    )
    items = f"{reader.prefix}.public.items"
    beats = Consumer(
        {"bootstrap.servers": reader.bootstrap, "group.id": "hb", "enable.auto.commit": False}
    )
    # (heartbeat LSN, end offset of the items topic right after the heartbeat was read)
    seen: list[tuple[int, int]] = []

    def read_beats() -> None:
        assert proc.poll() is None, (tmp_path / "reader.log").read_text()[-3000:]
        for m in beats.consume(1000, 0.2):
            if m.error() is None and m.value() is not None:
                lsn = orjson.loads(m.value())["lsn"]
                seen.append((lsn, end_offset(reader.bootstrap, items)))

    try:
        wait_until(
            lambda: end_offset(reader.bootstrap, f"{reader.prefix}.heartbeat") > 0,
            timeout=30,
            what="a first heartbeat",
        )
        beats.assign([TopicPartition(f"{reader.prefix}.heartbeat", 0, OFFSET_BEGINNING)])
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, %s) g", (ROWS,))

        def past_insert() -> bool:
            read_beats()
            return end_offset(reader.bootstrap, items) >= ROWS and len(seen) > 0

        wait_until(past_insert, timeout=60, interval=0.01, what="the insert to stream")
        # Idle: changes to a table that is not captured move the WAL, and the heartbeat's LSN
        # follows through keepalives, with no event in between.
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO other VALUES (1)")
        idle_target = _wal_lsn(reader.dsn)

        def idle_advanced() -> bool:
            read_beats()
            return seen[-1][0] >= idle_target

        wait_until(idle_advanced, timeout=60, interval=0.01, what="the idle heartbeat LSN")
    finally:
        beats.close()
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, (tmp_path / "reader.log").read_text()[-3000:]
    lsns = [lsn for lsn, _ in seen]
    assert lsns == sorted(lsns), "the heartbeat LSN went back"
    commit_lsn = read_topic(reader.bootstrap, items)[0].commit_lsn
    # A heartbeat past the transaction's commit is produced only once all its events are in
    # Kafka: whoever reads such a heartbeat finds them there.
    after = [(lsn, ends) for lsn, ends in seen if lsn > commit_lsn]
    assert after and all(ends == ROWS for _, ends in after), after[:3]
    row = slot_row(reader.dsn, reader.slot)
    assert row is not None and row[1] is not None and row[1] >= idle_target


def test_drop_slot_on_exit_waits_for_the_slot(reader: ReaderEnv) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 1000) g")
    for _ in range(3):  # the race showed only sometimes
        started = time.monotonic()
        done = reader.run("run", "--until", "current", "--drop-slot-on-exit", timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "in use" not in done.stderr
        assert slot_row(reader.dsn, reader.slot) is None
        assert time.monotonic() - started < 60
