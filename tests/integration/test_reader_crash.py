"""Crashes (kill -9) mid-snapshot and mid-stream, a 200k-row transaction, and compaction."""

from __future__ import annotations

import signal
import threading
import time

import psutil
import psycopg
import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from tests.conftest import Endpoints, unique, wait_until
from tests.integration.reader_support import (
    ReaderEnv,
    Workload,
    assert_key_order,
    assert_no_change_missing,
    assert_topic_equals_table,
    read_topic,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


def _kill_when(reader: ReaderEnv, ready: str | None, delay: float) -> str:
    """Start ``cdc run``, wait for a log line (or not), sleep ``delay``, then SIGKILL it."""
    proc = reader.start(
        CDC_POSTGRES__SNAPSHOT_CHUNK_ROWS="1000", CDC_POSTGRES__SNAPSHOT_WORKERS="2"
    )
    assert proc.stdout is not None
    seen: list[str] = []
    if ready is not None:
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            seen.append(line)
            if ready in line:
                break
            assert time.monotonic() < deadline, "".join(seen)[-2000:]
    time.sleep(delay)  # a kill point, not a wait for a condition
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    return "".join(seen)


def test_kill_9_at_many_points_loses_nothing(reader: ReaderEnv) -> None:
    wl = Workload(reader.dsn, "public.items", writers=2, ops_per_txn=20, seed=11, pause_s=0.002)
    wl.setup(20_000)
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bulk (id int PRIMARY KEY, v text)")
    wl.start()
    big_done = threading.Event()

    def big_transactions() -> None:
        # Large transactions so that some kills land in the middle of one.
        # They touch their own table, so they never deadlock with the writers.
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            while not big_done.is_set():
                conn.execute("INSERT INTO bulk SELECT g, 'x' FROM generate_series(1, 5000) g")
                conn.execute("DELETE FROM bulk")
                big_done.wait(1.0)

    t = threading.Thread(target=big_transactions, daemon=True)
    t.start()
    try:
        _kill_when(reader, "created topic", 0.3)  # 1: mid-snapshot
        _kill_when(reader, "created topic", 0.1)  # 2: mid-snapshot again (restarted cleanly)
        _kill_when(reader, "snapshot complete", 0.0)  # 3: right at the boundary
        for delay in (2.5, 3.5, 2.0):  # 4-6: mid-stream, during large transactions
            _kill_when(reader, None, delay)
    finally:
        big_done.set()
        t.join(30)
        log = wl.stop()
    reader.catch_up()
    records = read_topic(reader.bootstrap, f"{reader.prefix}.public.items")
    assert_topic_equals_table(records, reader.dsn)
    assert_key_order(records)
    assert_no_change_missing(records, log)


def test_large_transaction_streams_in_bounded_memory(reader: ReaderEnv) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, marker text, v text)")
    reader.catch_up()  # the slot exists; the big transaction is pure streaming
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO items SELECT g, 'm' || g, repeat('x', 200) FROM generate_series(1, 200000) g"
        )
    proc = reader.start("--until", "current")
    ps = psutil.Process(proc.pid)
    peak = 0
    samples: list[int] = []
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss
        except psutil.NoSuchProcess:
            break
        peak = max(peak, rss)
        samples.append(rss)
        time.sleep(0.05)  # sampling interval
    out = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, out[-3000:]
    records = read_topic(reader.bootstrap, f"{reader.prefix}.public.items")
    assert sum(1 for r in records if r.payload and r.payload["op"] == "c") == 200_000
    print(f"peak RSS of the reader streaming a 200k-row transaction: {peak / 2**20:.0f} MiB")
    # 200k events of ~1 KiB each would be ~200 MiB if buffered; the reader stays far below.
    assert peak < 160 * 2**20, f"peak RSS {peak / 2**20:.0f} MiB"


def test_compaction_keeps_latest_per_live_key(reader: ReaderEnv) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO items SELECT g, 'a' FROM generate_series(1, 100) g")
        conn.execute("UPDATE items SET v = 'b' WHERE id <= 50")
        conn.execute("DELETE FROM items WHERE id > 80")
    reader.catch_up()
    topic = f"{reader.prefix}.public.items"
    admin = AdminClient({"bootstrap.servers": reader.bootstrap})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in {
                "segment.ms": "100",
                "min.cleanable.dirty.ratio": "0.01",
                "delete.retention.ms": "100",
                "min.compaction.lag.ms": "0",
            }.items()
        ],
    )
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)
    before = read_topic(reader.bootstrap, topic)
    deletes = [r for r in before if r.payload and r.payload["op"] == "d"]
    assert deletes and all(
        before[before.index(d) + 1].value is None and before[before.index(d) + 1].key == d.key
        for d in deletes
    )

    def compacted() -> bool:
        # One more record rolls the active segment, which is never cleaned.
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET v = v WHERE id = 1")
        reader.catch_up()
        recs = read_topic(reader.bootstrap, topic)
        keys = [r.key_id for r in recs if r.key is not None]
        live = {r.key_id for r in recs if r.value is not None}
        return len(keys) - keys.count(1) + 1 <= 80 and not any(k > 80 for k in live)

    wait_until(compacted, timeout=240, interval=5, what="the topic to be compacted")
    assert_topic_equals_table(read_topic(reader.bootstrap, topic), reader.dsn)
