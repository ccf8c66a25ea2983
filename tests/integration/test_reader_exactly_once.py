"""``kafka.exactly_once``: each change committed to Kafka once, whatever stops the reader.

One run of kills against a broker of the test's own (behind a proxy, so it can be restarted
without touching the shared stack), with a marked workload writing all along and an
incremental snapshot of its table running in small chunks:

- ``kill -9`` at seeded random moments while the reader streams;
- kills injected at named points of its Kafka transactions (``tests/integration/eos_kill``):
  before a commit, after a commit and before the slot is confirmed, in the middle of an abort;
- rows, a TRUNCATE and rows again in another table, the reader killed after them;
- a 200,000-row transaction streamed longer than a Kafka transaction may stay open, so it is
  split, and the reader killed after a split;
- the reader stopped (``SIGSTOP``) until the broker aborts its open transaction on its
  timeout, which fences it as well: continued, with no other reader of the slot connected,
  it starts a new run;
- the broker restarted under the reader;
- a second reader started while the first is stopped (``SIGSTOP``): it fences the first,
  which, continued, stops with one line and confirms nothing more.

Then a ``read_committed`` consumer must find every change record's version (commit LSN,
order) exactly once per topic, every committed change, and each topic equal to its table.
The same kills with the setting off show the duplicates it prevents.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.conftest import Endpoints, unique
from tests.integration.proxied_kafka import proxied_kafka
from tests.integration.reader_support import (
    KILLER,
    ReaderEnv,
    Record,
    Workload,
    assert_key_order,
    assert_no_change_missing,
    assert_topic_equals_table,
    end_offset,
    read_topic,
    slot_row,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPLIT = "is split across Kafka transactions"
# The broker's line (kafka.coordinator.transaction), and the reader's, for a transaction
# aborted on its timeout.
ROLLBACK = "Completed rollback of ongoing transaction"
TIMED_OUT = "stayed open past transaction.timeout.ms"
ROWS = 2_000
BULK = 200_000
# A Kafka transaction may stay open 4 s: one still open after 2 s is split (or committed).
EOS = {
    "CDC_KAFKA__EXACTLY_ONCE": "true",
    "CDC_KAFKA__PRODUCER": '{"transaction.timeout.ms": "4000"}',
    # An incremental snapshot of items runs through the kills, a chunk at a time.
    "CDC_POSTGRES__INCREMENTAL_CHUNK_ROWS": "200",
}


def _wait(
    what: str,
    condition: Callable[[], bool],
    proc: subprocess.Popen[bytes] | None,
    log: Path | None,
    timeout: float = 90.0,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise AssertionError(f"the reader exited ({proc.returncode}) before {what}:\n{tail}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Readers:
    """Starts ``cdc run`` processes of one reader, each logging to a file of its own."""

    def __init__(self, reader: ReaderEnv, folder: Path) -> None:
        self.reader = reader
        self.folder = folder
        self.runs = 0

    def start(self, **more: str) -> tuple[subprocess.Popen[bytes], Path]:
        self.runs += 1
        log = self.folder / f"run{self.runs}.log"
        return self.reader.start(log_path=log, **more), log

    def start_when_free(self, **more: str) -> tuple[subprocess.Popen[bytes], Path]:
        # A killed run's walsender may hold the slot for a moment.
        _wait(
            "the slot to be released",
            lambda: (row := slot_row(self.reader.dsn, self.reader.slot)) is None or not row[0],
            None,
            None,
            30,
        )
        return self.start(**more)

    def streaming(self) -> bool:
        row = slot_row(self.reader.dsn, self.reader.slot)
        return row is not None and row[0]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)


def _streamed(records: list[Record]) -> list[Record]:
    """Change records and their tombstones (not snapshot rows)."""
    return [r for r in records if r.payload is None or r.payload["op"] != "r"]


def _duplicates(records: list[Record]) -> int:
    """Change records that another record of the topic repeats: the same version (commit
    LSN, order), key and kind (a TRUNCATE's deletes share one order, a key each)."""
    seen = Counter((r.commit_lsn, r.order, r.key, r.value is None) for r in _streamed(records))
    return sum(n - 1 for n in seen.values() if n > 1)


def _setup(dsn: str, seed: int) -> Workload:
    wl = Workload(dsn, "public.items", writers=2, ops_per_txn=20, seed=seed, pause_s=0.005)
    wl.setup(ROWS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bulk (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE trunc (id int PRIMARY KEY, v text)")
    return wl


def _random_kills(
    readers: Readers, bootstrap: str, topic: str, rng: random.Random, kills: int, **more: str
) -> None:
    for _ in range(kills):
        proc, log = readers.start_when_free(**more)
        base = end_offset(bootstrap, topic)
        grow = rng.randint(20, 400)
        _wait(
            f"{grow} new records",
            lambda b=base, g=grow: end_offset(bootstrap, topic) >= b + g,
            proc,
            log,
        )
        _kill(proc)


def test_each_change_reaches_kafka_once_through_kills_a_split_a_restart_and_fencing(
    endpoints: Endpoints, pg_database: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("PGCDC_EOS_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    print(f"seed {seed} (PGCDC_EOS_SEED)")
    with proxied_kafka(tmp_path / "kafka") as kafka:
        prefix = unique("eos")
        reader = ReaderEnv(
            pg_database,
            kafka.bootstrap,
            prefix,
            unique("slot"),
            extra=EOS | {"PYTHONPATH": str(KILLER)},
        )
        items = f"{prefix}.public.items"
        wl = _setup(pg_database, seed)
        reader.catch_up()  # the initial snapshot, whole: exactly-once is about the stream
        readers = Readers(reader, tmp_path)
        wl.start()
        try:
            asked = reader.run("snapshot", "public.items")
            assert asked.returncode == 0, asked.stderr[-3000:]
            _random_kills(readers, kafka.bootstrap, items, rng, kills=3)
            _truncate_then_kill(readers, kafka.bootstrap, f"{prefix}.public.trunc")

            for point in ("before_commit", "after_commit", "mid_abort"):
                proc, log = readers.start_when_free(PGCDC_KILL_AT=f"{point}:{rng.randint(3, 12)}")
                _wait(f"the kill {point}", lambda p=proc: p.poll() is not None, None, None)
                text = log.read_text(errors="replace")
                assert proc.returncode == -signal.SIGKILL, f"{point}: exit {proc.returncode}"
                assert f"injected kill: {point}" in text, text[-3000:]

            # A transaction longer than a Kafka transaction may stay open: split, and killed
            # after a split, twice (the second run splits it again while it skips what the
            # first committed: the position must not go back).
            big = threading.Thread(target=_insert_bulk, args=(pg_database,))
            for run in range(2):
                proc, log = readers.start_when_free()
                _wait("streaming", readers.streaming, proc, log)
                if run == 0:
                    big.start()
                _wait(
                    "a split of the large transaction",
                    lambda log=log: SPLIT in log.read_text(errors="replace"),
                    proc,
                    log,
                    180,
                )
                _kill(proc)
            big.join(120)

            # Paused past the transaction timeout: Kafka aborts and fences, and it goes on.
            proc, log = readers.start_when_free()
            _pause_past_timeout(readers, proc, log, kafka.log)

            # The broker restarts under a streaming reader.
            base = end_offset(kafka.bootstrap, items)
            _wait("records", lambda: end_offset(kafka.bootstrap, items) > base + 50, proc, log)
            kafka.restart()
            base = end_offset(kafka.bootstrap, items)
            _wait(
                "records after the restart",
                lambda: end_offset(kafka.bootstrap, items) > base + 50,
                proc,
                log,
                180,
            )
            _fence(readers, proc, log)
        finally:
            log_ = wl.stop()
        reader.catch_up()  # the incremental snapshot's last chunks too
        status = json.loads(reader.run("status", "--json").stdout)["state"]
        assert status["delivery"] == "exactly once", status
        assert status["committed"].startswith("up to "), status
        for table in ("items", "bulk", "trunc"):
            topic = f"{prefix}.public.{table}"
            records = read_topic(kafka.bootstrap, topic)
            assert_topic_equals_table(records, pg_database, table)
            assert_key_order(records)
            assert _duplicates(records) == 0, f"{topic}: changes written twice"
            if table == "items":
                assert_no_change_missing(records, log_)
                snapshot_rows = sum(1 for r in records if r.payload and r.payload["op"] == "r")
                assert snapshot_rows > ROWS, "the incremental snapshot wrote no chunk"
            elif table == "bulk":
                assert len(_streamed(records)) == BULK
            else:
                assert any(r.value is None for r in _streamed(records)), "no truncate's delete"


def _truncate_then_kill(readers: Readers, bootstrap: str, topic: str) -> None:
    """Rows, a TRUNCATE (a delete and a tombstone of each key, one order for all), rows
    again, streamed; the reader killed once all of it is in the topic."""
    proc, log = readers.start_when_free()
    _wait("streaming", readers.streaming, proc, log)
    base = end_offset(bootstrap, topic)
    with psycopg.connect(readers.reader.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO trunc SELECT g, 'a' FROM generate_series(1, 300) g")
        conn.execute("TRUNCATE trunc")
        conn.execute("INSERT INTO trunc SELECT g, 'b' FROM generate_series(200, 400) g")
    # 300 inserts, 300 deletes and 300 tombstones, 201 inserts (and commit markers).
    _wait("the truncate's records", lambda: end_offset(bootstrap, topic) >= base + 1101, proc, log)
    _kill(proc)


def _insert_bulk(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO bulk SELECT g, repeat('x', 200) FROM generate_series(1, %s) g", (BULK,)
        )


def _pause_past_timeout(
    readers: Readers, proc: subprocess.Popen[bytes], log: Path, broker_log: Path
) -> None:
    """Stop the streaming reader (SIGSTOP) until the broker aborts its open transaction on
    its timeout, which fences its producer too; continue it: with no other reader of the
    slot connected, a new run takes the transactional id back and streams on.

    A pause may miss: no transaction was open, or the broker's rollback counted was of a
    killed run's transaction (it times out on its own). Then the reader streams on, not
    fenced, and it is paused again."""
    for _ in range(3):
        _wait("streaming", readers.streaming, proc, log)
        before = broker_log.read_text(errors="replace").count(ROLLBACK)

        def rolled_back(before: int = before) -> bool:
            return broker_log.read_text(errors="replace").count(ROLLBACK) > before

        proc.send_signal(signal.SIGSTOP)
        try:
            # 4 s of transaction.timeout.ms, then the broker's check every second.
            _wait("the broker to abort the open transaction", rolled_back, None, None, 10)
        except AssertionError:
            continue
        finally:
            proc.send_signal(signal.SIGCONT)
        try:
            # Its next write or commit (every 2 s) meets the fence.
            _wait("a new run", lambda: TIMED_OUT in log.read_text(errors="replace"), proc, log, 30)
            break
        except AssertionError:
            if proc.poll() is not None:
                raise
    else:
        raise AssertionError("three pauses of the reader never had Kafka abort its transaction")
    items = f"{readers.reader.prefix}.public.items"
    base = end_offset(readers.reader.bootstrap, items)
    _wait(
        "records of the new run",
        lambda: end_offset(readers.reader.bootstrap, items) > base + 50,
        proc,
        log,
    )


def _fence(readers: Readers, first: subprocess.Popen[bytes], first_log: Path) -> None:
    """Stop ``first`` (SIGSTOP: a reader that hangs), start a second reader of the slot (an
    operator's move), which takes the transactional id over and waits for the slot; continue
    the first: its next write to Kafka finds it fenced, and it stops with one line, so the
    slot is released and the second streams on (it is stopped here)."""
    _wait("streaming", readers.streaming, first, first_log)
    first.send_signal(signal.SIGSTOP)
    second, second_log = readers.start()
    try:
        _wait(
            "the second reader to wait for the slot",
            lambda: "is in use" in second_log.read_text(errors="replace"),
            second,
            second_log,
        )
        first.send_signal(signal.SIGCONT)
        try:
            _wait("the first reader to stop", lambda: first.poll() is not None, None, None, 60)
        except AssertionError as e:
            tail = first_log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{e}; its log ends:\n{tail}") from None
        text = first_log.read_text(errors="replace")
        assert first.returncode == 1, text[-3000:]
        assert "this reader is fenced" in text, text[-3000:]
        assert "; connected: process " in text, text[-3000:]  # the second, named
        base = end_offset(readers.reader.bootstrap, f"{readers.reader.prefix}.public.items")
        _wait(
            "the second reader to stream on",
            lambda: (
                end_offset(readers.reader.bootstrap, f"{readers.reader.prefix}.public.items")
                > base + 50
            ),
            second,
            second_log,
        )
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                _kill(proc)


def test_without_it_the_same_kills_write_changes_twice(
    pg_database: str, endpoints: Endpoints, topic_prefix: str, tmp_path: Path
) -> None:
    """What the setting prevents: at-least-once, a kill replays what Kafka already holds."""
    reader = ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))
    wl = _setup(pg_database, 7)
    reader.catch_up()
    wl.start()
    try:
        _random_kills(
            Readers(reader, tmp_path),
            reader.bootstrap,
            f"{topic_prefix}.public.items",
            random.Random(7),
            kills=3,
        )
    finally:
        log = wl.stop()
    reader.catch_up()
    records = read_topic(reader.bootstrap, f"{topic_prefix}.public.items")
    assert_topic_equals_table(records, pg_database)
    assert_no_change_missing(records, log)
    assert _duplicates(records) > 0
