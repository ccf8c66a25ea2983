"""kill -9 of the reader mid-snapshot, at the snapshot/stream boundary and mid-transaction.

Every kill point is reached by polling something observable (topic end offsets, the slot's
state in ``pg_replication_slots``, the process itself), each with a deadline; the reader's
output goes to a file that the test only reads to explain a failure.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.conftest import Endpoints, unique
from tests.integration.reader_support import (
    ReaderEnv,
    Workload,
    assert_key_order,
    assert_no_change_missing,
    assert_topic_equals_table,
    end_offset,
    read_topic,
    slot_row,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 50_000  # rows in the table before the first run: the snapshot lasts a few seconds
BULK = 10_000  # rows per large transaction


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


class Runner:
    """Starts ``cdc run`` and kills it with SIGKILL once a polled condition holds."""

    def __init__(self, reader: ReaderEnv, log_path: Path) -> None:
        self.reader = reader
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = self.reader.start(
            log_path=self.log_path,
            CDC_POSTGRES__SNAPSHOT_CHUNK_ROWS="1000",
            CDC_POSTGRES__SNAPSHOT_WORKERS="2",
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def kill_when(self, what: str, condition: object, timeout: float = 90.0) -> None:
        """Poll ``condition()`` every 10 ms; SIGKILL the reader as soon as it is true."""
        assert self.proc is not None and callable(condition)
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, (
                f"the reader exited ({self.proc.returncode}) before {what}:\n{self.output()}"
            )
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.output()}"
            time.sleep(0.01)
        assert self.proc.poll() is None, f"the reader exited before the kill ({what})"
        self.proc.kill()
        self.proc.wait(30)


def _growing(bootstrap: str, topic: str, by: int) -> object:
    """A condition: the topic's end offset has grown by ``by`` since the condition was made."""
    base = end_offset(bootstrap, topic)
    return lambda: end_offset(bootstrap, topic) >= base + by


def _last_txn_partial(bootstrap: str, topic: str) -> bool:
    """Whether the topic's newest transaction is incomplete (the kill came in its middle).

    A bulk transaction is BULK inserts, or BULK deletes each followed by a tombstone.
    """
    records = read_topic(bootstrap, topic)
    streamed = [r for r in records if r.payload is None or r.payload["op"] != "r"]
    if not streamed:
        return False
    last = streamed[-1].commit_lsn
    counts = Counter(r.commit_lsn for r in streamed)
    return counts[last] not in (BULK, 2 * BULK)


def test_kill_9_at_many_points_loses_nothing(reader: ReaderEnv, tmp_path: Path) -> None:
    wl = Workload(reader.dsn, "public.items", writers=2, ops_per_txn=20, seed=11, pause_s=0.002)
    wl.setup(ROWS)
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bulk (id int PRIMARY KEY, v text)")
    items = f"{reader.prefix}.public.items"
    bulk = f"{reader.prefix}.public.bulk"
    wl.start()
    big_done = threading.Event()

    def big_transactions() -> None:
        # Large transactions on a table of their own (no lock waits with the writers), so
        # that a kill can land in the middle of one.
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            while not big_done.is_set():
                conn.execute(
                    "INSERT INTO bulk SELECT g, 'x' FROM generate_series(1, %s) g", (BULK,)
                )
                conn.execute("DELETE FROM bulk")
                big_done.wait(0.3)

    t = threading.Thread(target=big_transactions, daemon=True)
    t.start()
    runner = Runner(reader, tmp_path / "reader.log")
    snapshot_kills = 0
    mid_txn_kills = 0
    try:
        # 1, 2: mid-snapshot (the second run drops the half-used slot and starts over).
        for _ in range(2):
            runner.start()
            runner.kill_when("snapshot records", _growing(reader.bootstrap, items, 500))
            snapshot_kills += end_offset(reader.bootstrap, items) < ROWS
        # 3: at the boundary: the slot becomes active when streaming starts.
        runner.start()
        runner.kill_when(
            "streaming to start",
            lambda: (row := slot_row(reader.dsn, reader.slot)) is not None and row[0],
        )
        # 4-6: mid-stream, while large transactions flow.
        for _ in range(3):
            runner.start()
            runner.kill_when("bulk records", _growing(reader.bootstrap, bulk, BULK // 3))
            mid_txn_kills += _last_txn_partial(reader.bootstrap, bulk)
    finally:
        big_done.set()
        t.join(30)
        log = wl.stop()
        if runner.proc is not None and runner.proc.poll() is None:
            runner.proc.kill()
            runner.proc.wait(30)
    assert snapshot_kills >= 1, "no kill landed in the middle of a snapshot"
    assert mid_txn_kills >= 1, "no kill landed in the middle of a large transaction"
    reader.catch_up()
    records = read_topic(reader.bootstrap, items)
    assert_topic_equals_table(records, reader.dsn)
    assert_key_order(records)
    assert_no_change_missing(records, log)
    bulk_records = read_topic(reader.bootstrap, bulk)
    assert_topic_equals_table(bulk_records, reader.dsn, "bulk")
