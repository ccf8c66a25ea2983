"""Failover (PostgreSQL 17+): the reader resumes on the promoted standby from its failover slot.

A primary and a streaming standby (pg_basebackup from the same root, a physical slot,
synchronous commit so that every acknowledged commit is on the standby;
``synchronized_standby_slots`` on the primary; ``sync_replication_slots`` and
``hot_standby_feedback`` on the standby). The reader reaches them through one multi-host DSN
with ``target_session_attrs=read-write`` and snapshots, then streams while writers change the
table continuously (inserts, updates, deletes, key changes). Once the standby holds a
synchronized copy of the slot, the primary is shut down immediately (as a crash would) and the
standby promoted; the writers and the reader find it through the same DSN.

Checked: every change a writer saw committed reached Kafka (none lost), the snapshot ran
once (no ``r`` record after the failover, the resumed run streamed), the topic equals the new
primary's table, and Redis and OpenSearch, built by both jobs from the topic, equal it too.
On 18 the table has a stored generated column, which the followers hold as well.

Runs on the session's major when it has failover slots (17+), else on the newest.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from benchmarks.workload.keys import LiveKeys
from benchmarks.workload.marked import MarkedMix, Workload
from pgcdc.stack.pgserver import PgServer
from tests.conftest import ROOT, Endpoints, unique, wait_until
from tests.e2e.pipeline import CDC, Pipeline, run_jobs_in_session
from tests.integration.reader_support import (
    Record,
    assert_key_order,
    assert_no_change_missing,
    end_offset,
    read_topic,
    reduce_latest,
)
from tests.integration.real_databases.support import (
    Table,
    assert_followers_equal,
    cleanup,
)
from tests.pg_majors import feature_major, server, standby_of

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

ROWS = 2_000  # snapshot rows
WRITERS = 2
AFTER_PROMOTION = 300  # changes the writers commit on the promoted standby


def failover_major() -> int:
    return feature_major(17, "failover slots")


class Writers:
    """Writers that outlive a failover: each commits marked changes through the multi-host
    DSN, reconnects when the server goes away, and logs only what it saw committed (a
    transaction cut by the failover may or may not have committed: its keys are read back)."""

    def __init__(self, dsn: str, load: Workload) -> None:
        self.dsn = dsn
        self.load = load
        self.stop = threading.Event()
        self.reconnects = 0
        self.errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(WRITERS)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _run(self, writer: int) -> None:
        mix = MarkedMix(self.load, writer, WRITERS)
        rnd = random.Random(writer)
        conn: psycopg.Connection[Any] | None = None
        try:
            while not self.stop.is_set():
                try:
                    if conn is None:
                        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
                        mix.pending.clear()
                        mix.live = LiveKeys()
                        mix.prepare(conn)  # this writer's keys as the server has them
                    with conn.transaction():
                        mix.write(conn, rnd)
                    mix.committed(time.time())
                except psycopg.OperationalError:
                    self.reconnects += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    self.stop.wait(0.2)
                self.stop.wait(0.005)
        except BaseException as e:
            self.errors.append(e)
        finally:
            if conn is not None:
                conn.close()

    def halt(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(60)
        assert not self.errors, self.errors


@pytest.fixture
def pair() -> Iterator[tuple[PgServer, PgServer]]:
    """A primary and its streaming standby, set up for failover slots."""
    major = failover_major()
    with server(major, name="primary") as primary:
        sync = {"sync_replication_slots": "on", "hot_standby_feedback": "on"}
        with standby_of(primary, slot="standby1", settings=sync) as standby:
            for statement in (
                "ALTER SYSTEM SET synchronized_standby_slots = 'standby1'",
                "ALTER SYSTEM SET synchronous_standby_names = '*'",
                "SELECT pg_reload_conf()",
            ):
                primary.query(statement)
            wait_until(
                lambda: primary.query("SELECT sync_state FROM pg_stat_replication") == "sync",
                timeout=60,
                what="the standby to replicate synchronously",
            )
            yield primary, standby


def _slot(srv: PgServer, slot: str) -> tuple[str, ...] | None:
    """(synced, temporary, confirmed_flush_lsn) of ``slot`` on ``srv``."""
    out = srv.query(
        "SELECT synced, temporary, confirmed_flush_lsn FROM pg_replication_slots "
        f"WHERE slot_name = '{slot}'",
        db="cdc",
    )
    return tuple(out.split("|")) if out else None


def _snapshot_records(records: list[Record]) -> int:
    return sum(1 for r in records if r.payload is not None and r.payload["op"] == "r")


def test_failover_to_the_promoted_standby_loses_nothing(
    spark: Any, endpoints: Endpoints, pair: tuple[PgServer, PgServer], tmp_path: Path
) -> None:
    primary, standby = pair
    major = primary.runtime.major
    dsn = (
        f"postgresql://cdc:cdc@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/cdc"
        "?target_session_attrs=read-write&connect_timeout=3"
    )
    load = Workload(primary.dsn("cdc"), "public.items", writers=WRITERS, ops_per_txn=3)
    load.setup(ROWS)
    if major >= 18:
        primary.query(
            "ALTER TABLE items ADD COLUMN n2 bigint GENERATED ALWAYS AS (n * 2) STORED", db="cdc"
        )
    name = unique("fo")
    p = Pipeline(
        endpoints=endpoints,
        dsn=dsn,
        name=name,
        index_prefix=name.lower(),
        key_prefix=name,
        checkpoint_dir=tmp_path / "checkpoints",
        settings_env=(("CDC_POSTGRES__TABLES", "public.items"),),
    )
    topic = f"{name}.public.items"
    log_path = tmp_path / "reader.log"
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    writers = Writers(dsn, load)
    reader: subprocess.Popen[bytes] | None = None
    try:
        with open(log_path, "ab") as out:
            reader = subprocess.Popen(
                [*CDC, "run"],
                env=p.env(CDC_POSTGRES__STATUS_INTERVAL_S="0.5", PYTHONUNBUFFERED="1"),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(
            lambda: end_offset(endpoints.kafka_bootstrap, topic) >= ROWS,
            timeout=120,
            what="the snapshot in Kafka",
        )
        phases["snapshot"] = time.monotonic() - t0
        writers.start()
        wait_until(lambda: len(load.log) >= 300, timeout=120, what="changes before the failover")

        # The standby's copy of the slot must be ready (persistent) before the failover:
        # it is once the primary's slot moved past the standby's oldest transaction. The
        # primary logs its running transactions every 15 s; asking for it now is quicker.
        def synced() -> bool:
            primary.query("SELECT pg_log_standby_snapshot()")
            row = _slot(standby, name)
            return row is not None and row[:2] == ("t", "f")

        wait_until(synced, timeout=120, what="a synchronized copy of the slot on the standby")
        phases["synchronized"] = time.monotonic() - t0
        before = end_offset(endpoints.kafka_bootstrap, topic)
        committed_before = len(load.log)
        primary_slot = _slot(primary, name)
        standby_slot = _slot(standby, name)

        primary.stop(immediate=True)
        standby.promote()
        wait_until(
            lambda: len(load.log) >= committed_before + AFTER_PROMOTION,
            timeout=180,
            what="changes committed on the promoted standby",
        )
        writers.halt()
        assert writers.reconnects >= 1, "no writer noticed the failover"
        end_lsn = standby.query("SELECT pg_current_wal_lsn()", db="cdc")

        def caught_up() -> bool:
            assert reader is not None and reader.poll() is None, log_path.read_text()[-3000:]
            row = _slot(standby, name)
            return (
                row is not None
                and standby.query(f"SELECT '{row[2]}'::pg_lsn >= '{end_lsn}'::pg_lsn", db="cdc")
                == "t"
            )

        phases["promoted, written"] = time.monotonic() - t0
        wait_until(caught_up, timeout=180, what="the reader to stream the promoted standby's WAL")
        phases["caught up"] = time.monotonic() - t0
        reader.send_signal(signal.SIGINT)
        assert reader.wait(60) == 0, log_path.read_text()[-3000:]
        promoted_slot = _slot(standby, name)
        output = log_path.read_text(errors="replace")

        records = read_topic(endpoints.kafka_bootstrap, topic)
        after = len(records)
        print(
            f"\nPostgreSQL {major} failover: slot {name} confirmed_flush_lsn on the primary "
            f"{primary_slot[2] if primary_slot else None}, its synchronized copy on the standby "
            f"{standby_slot[2] if standby_slot else None} at the failover, "
            f"{promoted_slot[2] if promoted_slot else None} on the promoted standby at the end; "
            f"records {before} before the failover, {after} after; "
            f"{committed_before} changes committed before, {len(load.log) - committed_before} "
            f"after; {writers.reconnects} writer reconnects"
        )
        # The reader lost the primary, reconnected and streamed on: no second snapshot.
        assert "lost PostgreSQL" in output, output[-3000:]
        assert _snapshot_records(records) == ROWS, "the snapshot ran again"
        assert promoted_slot is not None and promoted_slot[1] == "f"
        # No change lost: each committed change is in Kafka, per key in order, and the
        # latest event of each key equals the promoted standby's row.
        log = list(load.log)
        assert_no_change_missing(records, log)
        assert sum(1 for c in log[committed_before:] if c.marker) > 0
        assert_key_order(records)
        with psycopg.connect(standby.dsn("cdc")) as conn:
            cur = conn.execute("SELECT to_jsonb(t) FROM items t")
            rows = {r[0]["id"]: r[0] for r in cur.fetchall()}
        state = {k: v for k, v in reduce_latest(records).items() if v is not None}
        assert state == rows, (
            f"{len(state.keys() ^ rows.keys())} keys differ, "
            f"{sum(1 for k in rows if k in state and state[k] != rows[k])} rows differ"
        )
        if major >= 18:
            assert all(v["n2"] == v["n"] * 2 for v in state.values())

        run_jobs_in_session(spark, p)
        assert_followers_equal(replace(p, dsn=standby.dsn("cdc")), [Table("public", "items")])
        phases["followers equal"] = time.monotonic() - t0
        print("phases (s since the reader started):", {k: round(v, 1) for k, v in phases.items()})
    finally:
        writers.stop.set()
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait(30)
        cleanup(p)
