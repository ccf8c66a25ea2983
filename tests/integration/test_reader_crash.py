"""kill -9 of the reader mid-snapshot, at the snapshot/stream boundary and mid-transaction.

Every kill point is reached by polling something observable (topic end offsets, the slot's
state in ``pg_replication_slots``, the process itself), each with a deadline; the reader's
output goes to a file that the test only reads to explain a failure.
"""

from __future__ import annotations

import subprocess
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
        # The killed run's walsender may still hold the slot for a moment: a reader started
        # then refuses the slot as in use, and a poll of the slot would see the old process.
        deadline = time.monotonic() + 30
        while (row := slot_row(self.reader.dsn, self.reader.slot)) is not None and row[0]:
            assert time.monotonic() < deadline, "the killed reader's walsender never went away"
            time.sleep(0.05)
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


def _streaming(dsn: str, slot: str) -> bool:
    """Whether a walsender streams from the slot (``START_REPLICATION`` done).

    Not the slot's ``active`` alone: it is also true while ``CREATE_REPLICATION_SLOT``
    waits for open transactions, which is still the snapshot's side of the boundary.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r "
            "ON r.pid = s.active_pid WHERE s.slot_name = %s "
            "AND r.state IN ('catchup', 'streaming')",
            (slot,),
        ).fetchone()
    return row is not None


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

    def big_transaction(delete: bool) -> None:
        # One large transaction on a table of its own (no lock waits with the writers), so
        # that a kill can land in its middle. One per run, not a loop: the topic stays
        # small enough to read back whole.
        with psycopg.connect(reader.dsn, autocommit=True) as conn:
            if delete:
                conn.execute("DELETE FROM bulk")
            else:
                conn.execute(
                    "INSERT INTO bulk SELECT g, 'x' FROM generate_series(1, %s) g", (BULK,)
                )

    runner = Runner(reader, tmp_path / "reader.log")
    snapshot_kills = 0
    mid_txn_kills = 0
    try:
        # 1, 2: mid-snapshot (the second run drops the half-used slot and starts over).
        for _ in range(2):
            runner.start()
            runner.kill_when("snapshot records", _growing(reader.bootstrap, items, 500))
            snapshot_kills += end_offset(reader.bootstrap, items) < ROWS
        # 3: at the boundary, as soon as the reader streams from the slot.
        runner.start()
        runner.kill_when("streaming to start", lambda: _streaming(reader.dsn, reader.slot))
        # From here on the slot is streamed from: a writer's change committed now reaches
        # Kafka as a change event, not as a snapshot row, whatever the later kills hit.
        after_boundary = len(wl.log)
        # 4-6: mid-stream, in the middle of a large transaction (inserts, then deletes).
        for run in range(3):
            runner.start()
            grown = _growing(reader.bootstrap, bulk, BULK // 3)
            big_transaction(delete=run % 2 == 1)
            runner.kill_when("bulk records", grown)
            mid_txn_kills += _last_txn_partial(reader.bootstrap, bulk)
        deadline = time.monotonic() + 60
        while len(wl.log) <= after_boundary:
            assert time.monotonic() < deadline, "the writers committed nothing after the boundary"
            time.sleep(0.05)
    finally:
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
