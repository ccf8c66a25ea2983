"""A Kafka outage under a live load is told, bounded in memory, and loses nothing.

The reader reaches Kafka only through a proxy the test cuts (:mod:`proxied_kafka`: a broker
of the test's own whose advertised address is the proxy). About 300 writes/s go into the
table for the whole outage. The outage lasts ``CDC_TEST_KAFKA_OUTAGE_S`` seconds (default
60). The acceptance run is 360 s with the reader's own producer settings (records time out
after message.timeout.ms = 120 s). The default run proves the same paths in a minute: a
message timeout of 45 s, which the outage exceeds, and a producer queue of 5,000 records,
which the load fills, so the reader must stop reading from PostgreSQL (backpressure).
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from pathlib import Path

import psycopg
import pytest

from cdc.publisher import Publisher
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import KafkaSettings
from tests.conftest import unique, wait_until
from tests.integration.proxied_kafka import proxied_kafka
from tests.integration.reader_support import (
    ReaderEnv,
    assert_topic_equals_table,
    end_offset,
    read_topic,
    slot_row,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTAGE_S = float(os.environ.get("CDC_TEST_KAFKA_OUTAGE_S", "60"))
SHORT = OUTAGE_S <= 120
# The short run: records time out during the outage, and the queue fills (backpressure).
QUEUE_RECORDS = 5_000 if SHORT else 100_000
PRODUCER = '{"message.timeout.ms": "45000", "queue.buffering.max.messages": "5000"}'
# What a full producer queue adds to the reader's memory at most: QUEUE_KBYTES of records
# and librdkafka's own cost of each (about 0.5 KiB; measured in the last test below).
QUEUE_GROWTH_MIB = 220
# The reader's resident memory stays under this during the outage: its baseline (about
# 110 MiB streaming this table) plus what the producer queue may hold (5,000 records of the
# short run: about 10 MiB; the reader's own limits: QUEUE_GROWTH_MIB).
BASELINE_MIB = 120
RSS_BOUND_MIB = BASELINE_MIB + (40 if SHORT else QUEUE_GROWTH_MIB)
WRITES_PER_TXN = 30
TXNS_PER_S = 10  # 300 writes/s
KEYS = 5_000


def _rss(pid: int | str = "self") -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    if match is None:  # a process that exited and is not reaped yet has no resident set
        raise ProcessLookupError(f"process {pid} has exited")
    return int(match.group(1)) * 1024


class Writer(threading.Thread):
    """Upserts and deletes of random keys, WRITES_PER_TXN per transaction, paced."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="writer", daemon=True)
        self.dsn = dsn
        self.done = threading.Event()
        self.writes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        try:
            with psycopg.connect(self.dsn) as conn:
                due = time.monotonic()
                while not self.done.is_set():
                    with conn.transaction():
                        for _ in range(WRITES_PER_TXN):
                            key = rng.randrange(KEYS)
                            if rng.random() < 0.1:
                                conn.execute("DELETE FROM items WHERE id = %s", (key,))
                            else:
                                conn.execute(
                                    "INSERT INTO items VALUES (%s, %s, %s) ON CONFLICT (id) "
                                    "DO UPDATE SET marker = excluded.marker, v = excluded.v",
                                    (key, f"m{self.writes}", "x" * 200),
                                )
                            self.writes += 1
                    due += 1 / TXNS_PER_S  # pacing of the load, not a wait for a condition
                    self.done.wait(max(0.0, due - time.monotonic()))
        except BaseException as e:
            self.error = e


class RssSampler(threading.Thread):
    """The process's resident set, sampled every 0.2 s; its peak while ``window`` is set."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="rss", daemon=True)
        self.pid = pid
        self.window = threading.Event()
        self.done = threading.Event()
        self.peak = 0
        self.samples = 0

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                rss = _rss(self.pid)
            except OSError:
                return
            if self.window.is_set():
                self.peak = max(self.peak, rss)
                self.samples += 1


def test_kafka_outage_is_told_bounded_and_loses_nothing(pg_database: str, tmp_path: Path) -> None:
    dsn = pg_database
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, marker text, v text)")
    with proxied_kafka(tmp_path / "kafka") as kafka:
        prefix = unique("t")
        topic = f"{prefix}.public.items"
        reader = ReaderEnv(dsn, kafka.bootstrap, prefix, unique("slot"))
        more = {"CDC_POSTGRES__TABLES": "public.items"}
        if SHORT:
            more["CDC_KAFKA__PRODUCER"] = PRODUCER
        log_path = tmp_path / "reader.log"
        proc = reader.start(log_path=log_path, **more)
        writer = Writer(dsn)
        sampler = RssSampler(proc.pid)

        def log_text() -> str:
            return log_path.read_text(errors="replace")

        try:
            writer.start()
            sampler.start()

            # Streaming: an outage while starting stops the run at once, as one line, by
            # design (the state record that ends the snapshot is waited for). Only the streamer
            # confirms the slot past the point the slot was created at, and it starts once that
            # record is acknowledged. That point is the reader's (its log line): the slot as
            # first listed may be still being created, its confirmed position none or earlier,
            # and an active slot confirmed past it was once taken for a streaming one while
            # the snapshot ran (the cut then came as the record was written).
            def created_at() -> int | None:
                found = re.search(r"created replication slot .*?\blsn=(\S+)", log_text())
                return Lsn.parse(found.group(1)) - Lsn(0) if found else None

            consistent_point = wait_until(created_at, timeout=120, what="the reader's slot") or 0

            def streaming() -> bool:
                slot = slot_row(dsn, reader.slot)
                return slot is not None and slot[0] and (slot[1] or 0) > consistent_point

            wait_until(streaming, timeout=120, what="the reader to stream")
            # The slot also moves past WAL that holds none of the table's changes (other
            # databases' transactions, before the writer's first commit), so the topic's first
            # records are waited for too (it once was asserted at once, and held none yet).
            wait_until(
                lambda: end_offset(kafka.bootstrap, topic) > 0,
                timeout=60,
                what="the reader's first records of the table",
            )
            # The outage: the reader's connections drop and new ones are refused.
            sampler.window.set()
            cut_at = time.monotonic()
            kafka.proxy.cut()
            wait_until(
                lambda: "unreachable: nothing acknowledged" in log_text(),
                timeout=min(OUTAGE_S, 60),
                what="the outage warning",
                detail=lambda: (
                    f"proxy: {kafka.proxy.forwarded} connections forwarded, "
                    f"{kafka.proxy.refused} refused; writer: {writer.writes} writes, error "
                    f"{writer.error!r}; the reader's log (no DEBUG) ends:\n"
                    + "\n".join(x for x in log_text().splitlines() if " DEBUG " not in x)[-4000:]
                ),
            )
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut_at)))  # the outage itself
            assert proc.poll() is None, log_text()[-3000:]
            kafka.proxy.restore()
            wait_until(
                lambda: "answers again after an outage" in log_text(),
                timeout=120,
                what="the recovery line",
            )
            sampler.window.clear()
            writer.done.set()
            writer.join(30)
            assert writer.error is None, writer.error
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
            assert row is not None
            last_write = int(row[0])

            def caught_up() -> bool:
                slot = slot_row(dsn, reader.slot)
                return slot is not None and (slot[1] or 0) >= last_write

            wait_until(caught_up, timeout=300, interval=1, what="the reader to catch up")
            proc.terminate()
            proc.wait(120)
        finally:
            writer.done.set()
            sampler.done.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        text = log_text()
        records = read_topic(kafka.bootstrap, topic)

    mib = 2**20
    lines = [line for line in text.splitlines() if "Kafka at" in line]
    print(
        f"outage {OUTAGE_S:.0f}s, {writer.writes} writes, reader peak RSS during it "
        f"{sampler.peak / mib:.0f} MiB ({sampler.samples} samples), proxy refused "
        f"{kafka.proxy.refused} connections; outage lines:\n" + "\n".join(lines)
    )
    # Nothing lost: the topic reduced to the newest record per key equals the table.
    assert_topic_equals_table(records, dsn)
    # Told: the first warning (the brokers and librdkafka's reason), a line while it
    # lasted, the recovery line; the reader really was cut off.
    first = next(line for line in lines if "unreachable: nothing acknowledged" in line)
    assert kafka.bootstrap in first and "librdkafka gave no reason" not in first, first
    assert any("still unreachable after" in line for line in lines), text[-5000:]
    assert any("answers again after an outage" in line for line in lines), text[-5000:]
    assert kafka.proxy.refused > 0
    # Records outlived message.timeout.ms: the run ended retryably and a new one resumed.
    assert "within message.timeout.ms" in text and "lost Kafka:" in text, text[-5000:]
    # The replication session outlived the wait (wal_sender_timeout is 60 s).
    assert "lost PostgreSQL" not in text, text[-5000:]
    # Bounded: the queue filled (the reader stopped reading) and never held more.
    peaks = [int(n) for n in re.findall(r"at most (\d+) during the outage", text)]
    assert peaks and max(peaks) <= QUEUE_RECORDS + 100, peaks
    if SHORT:
        assert max(peaks) >= QUEUE_RECORDS * 0.9, peaks
    assert sampler.samples > OUTAGE_S  # sampled throughout
    assert sampler.peak < RSS_BOUND_MIB * mib, f"peak RSS {sampler.peak / mib:.0f} MiB"


def test_a_full_producer_queue_holds_a_bounded_amount() -> None:
    """The reader's producer settings, brokers unreachable: records of 1.5 KiB (a Debezium
    JSON value with schemas) are queued until the queue refuses more; what it then holds is
    the most an outage adds to the reader's memory (measured: about 180 MiB)."""
    publisher = Publisher(KafkaSettings(bootstrap_servers="127.0.0.1:1"))
    txn = publisher.begin(Lsn(1))
    value = b"x" * 1536
    before = _rss()
    queued = 0
    with pytest.raises(BufferError):
        for i in range(1_000_000):
            headers = [("cdc.commit_lsn", b"123456789"), ("cdc.order", str(i).encode())]
            key = b'{"schema":{"type":"struct"},"payload":{"id":%d}}' % i
            publisher._producer.produce(
                "t", value=value, key=key, headers=headers, on_delivery=txn.on_delivery
            )
            queued += 1
    grown = _rss() - before
    print(f"a full producer queue: {queued} records, {grown / 2**20:.0f} MiB")
    assert queued < 100_000  # the byte limit (QUEUE_KBYTES) came first
    assert grown < QUEUE_GROWTH_MIB * 2**20
