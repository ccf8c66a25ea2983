"""Ctrl-C on a sync job: what a terminal does (SIGINT to the whole process group: the
spark-submit JVM, the Python driver and its workers) stops the job like SIGTERM, with one
line, exit status 0 and no Python or Java traceback."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from tests.conftest import Endpoints, wait_until
from tests.e2e.pipeline import SPARK_SUBMIT, Pipeline, kill_group, run_reader_until_current
from tests.integration.operator.test_newcomer_mistakes import Reader

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.spark]

STOPS_WITHIN_S = 30.0
TRACEBACK_MARKS = ("Traceback", "Exception", "Error:", "\tat ", "    at ")


# The first batch's end (its counts); its start may log a "batch 0:" line of its own.
BATCH_0_DONE = "batch 0: applied="
# (rows in the table, what to wait for before Ctrl-C): an idle job between two batches, and
# one in the middle of its first batch (the snapshot's rows still being applied).
WHEN = {
    "idle": (50, BATCH_0_DONE),
    "mid-batch": (300_000, "started cache_sync"),
}


@pytest.mark.parametrize("when", list(WHEN))
def test_ctrl_c_stops_a_sync_job_with_one_line(
    when: str,
    endpoints: Endpoints,
    pg_database: str,
    topic_prefix: str,
    index_prefix: str,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    rows, ready = WHEN[when]
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute(f"INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, {rows}) g")
    p = Pipeline(endpoints, pg_database, topic_prefix, index_prefix, key_prefix, tmp_path / "ck")
    run_reader_until_current(p)
    job = Reader(
        [str(SPARK_SUBMIT), "spark_jobs/cache_sync.py"],
        p.env(PYTHONUNBUFFERED="1"),
        tty=True,
        new_session=True,
    )
    try:
        wait_until(lambda: ready in job.output.text, timeout=180, interval=0.2, what=ready)
        time.sleep(3)  # idle: a few empty triggers; mid-batch: the batch's tasks are running
        before = len(job.output.text)
        if when == "mid-batch":
            assert BATCH_0_DONE not in job.output.text, "the batch ended before the Ctrl-C"
        sent = time.monotonic()
        os.killpg(job.proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the group
        rc = job.proc.wait(STOPS_WITHIN_S)
        took = time.monotonic() - sent
        job._thread.join(5)
    finally:
        if job.proc.poll() is None:
            kill_group(job.proc)  # type: ignore[arg-type]
    after = [line for line in job.output.text[before:].splitlines() if line.strip()]
    print(f"Ctrl-C ({when}): exit {rc} after {took:.1f}s, {len(after)} line(s) after it:")
    print("\n".join(after[:40]))
    assert rc == 0, after[:40]
    assert len(after) == 1, after[:40]
    assert "received SIGINT; stopping cache_sync" in after[0]
    assert not [line for line in after if any(m in line for m in TRACEBACK_MARKS)]
