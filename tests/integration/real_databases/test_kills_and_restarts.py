"""Acceptance case 9 of the followers on a real database (issue 10): kill -9 of the reader at
22 random points of a mixed workload (truncates, key changes, bulk transactions), a Kafka
broker restart and a PostgreSQL restart while it streams; afterwards the reduced topics and
both followers equal the database.

The restarted servers are the test's own (a throwaway PostgreSQL of the major under test, a
throwaway KRaft broker), so it runs beside the rest of the suite instead of alone: the
stack's servers, which every other test shares, are never stopped.
"""

from __future__ import annotations

import dataclasses
import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Endpoints, wait_until
from tests.e2e.pipeline import run_shared_available_now, tail
from tests.integration.proxied_kafka import proxied_kafka
from tests.integration.reader_support import assert_topic_equals_table, end_offset, read_topic
from tests.integration.real_databases import crash
from tests.integration.real_databases.support import (
    Pipeline,
    assert_followers_equal,
    fresh_pipeline,
    run_reader_until_current,
)
from tests.integration.real_databases.throwaway import throwaway_server

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

KILLS = 22
# The throwaway server's password is too short to derive a signal key from.
SIGNAL_KEY = (("CDC_POSTGRES__SIGNAL_SECRET", "case-9-signal-key-of-its-own"),)


def _produced(p: Pipeline, topics: list[str]) -> int:
    return sum(end_offset(p.endpoints.kafka_bootstrap, t) for t in topics)


def _wait_produced(
    p: Pipeline,
    topics: list[str],
    beyond: int,
    reader: subprocess.Popen[bytes],
    log: Path,
    what: str,
) -> None:
    """Until the topics grew beyond ``beyond``; fails if the reader exits first."""
    wait_until(
        lambda: _produced(p, topics) > beyond or reader.poll() is not None,
        timeout=180,
        what=what,
    )
    assert reader.poll() is None, f"the reader exited ({what}):\n{tail(log)}"


def test_case9_kills_and_restarts_mid_stream_converge(endpoints: Endpoints, tmp_path: Path) -> None:
    """kill -9 of the reader at random points of a mixed workload, a Kafka broker restart and
    a PostgreSQL restart while it streams: the topics and both followers equal the table."""
    rng = random.Random(10)
    with throwaway_server() as pg, proxied_kafka(tmp_path / "kafka") as kafka:
        own = dataclasses.replace(
            endpoints, postgres_dsn=pg.dsn("postgres"), kafka_bootstrap=kafka.bootstrap
        )
        restart = {"kafka": kafka.restart, "postgres": lambda: _timed(pg.restart)}
        with fresh_pipeline(own, tmp_path, "rdbk") as fresh:
            p = dataclasses.replace(fresh, settings_env=SIGNAL_KEY)
            log = p.checkpoint_dir.with_name("reader.log")
            crash.create_tables(p.dsn)
            run_reader_until_current(p)  # the snapshot
            topics = [crash.ITEMS.topic(p.name), crash.SIDE.topic(p.name)]
            workload = crash.MixedWorkload(p.dsn, seed=10)
            workload.start()
            landed = 0
            restarts: dict[str, float] = {}
            try:
                for i in range(KILLS):
                    reader = crash.start_reader(p, log)
                    base = _produced(p, topics)
                    _wait_produced(p, topics, base, reader, log, f"kill {i}: the reader to produce")
                    if i in (7, 15):  # a service restart while the reader streams
                        service = "kafka" if i == 7 else "postgres"
                        restarts[service] = restart[service]()
                        mark = _produced(p, topics)
                        # The reader goes on, or exits and is started again (a supervisor's).
                        if reader.poll() is not None:
                            reader = crash.start_reader(p, log)
                        _wait_produced(
                            p, topics, mark, reader, log, f"produce after the {service} restart"
                        )
                    time.sleep(rng.uniform(0.05, 1.5))  # a random point to kill at, not a wait
                    # Mid-stream: it produced, it still runs, and WAL is still waiting for it.
                    produced = _produced(p, topics) > base
                    if reader.poll() is None and produced and crash.pending_wal(p.dsn, p.name) > 0:
                        landed += 1
                    crash.kill(reader)
            finally:
                workload.stop()
            assert landed >= 20, f"only {landed} of {KILLS} kills landed mid-stream:\n{tail(log)}"
            assert set(restarts) == {"kafka", "postgres"}
            assert workload.done["truncate"] + workload.done["truncate in a transaction"] > 0
            assert workload.done["key change"] > 0 and workload.done["bulk"] > 0
            crash.catch_up(p, log)
            for t in (crash.ITEMS, crash.SIDE):
                assert_topic_equals_table(
                    read_topic(p.endpoints.kafka_bootstrap, t.topic(p.name)), p.dsn, t.name
                )
            run_shared_available_now(p, tmp_path)
            assert_followers_equal(p, [crash.ITEMS, crash.SIDE], allow_empty=True)


def _timed(action: Callable[[], None]) -> float:
    t0 = time.monotonic()
    action()
    return time.monotonic() - t0
