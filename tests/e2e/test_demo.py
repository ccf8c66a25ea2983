"""`make demo` end to end (plain-line mode), and the demo's checkpoint reader on a real file.

The demo uses fixed names (database ``demo``, topics ``demo.*``, …) and removes a previous
run's leftovers first, so this test must not run while someone watches `make demo`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from demo import resources
from demo.monitor import committed_offsets, follower_offsets
from demo.resources import DemoNames
from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB
from spark_jobs import behind
from tests.conftest import ROOT, Endpoints

# An offsets file as Spark 4 wrote it in a demo checkpoint (metadata line shortened).
OFFSETS_FILE = """v1
{"batchWatermarkMs":0,"batchTimestampMs":1795309384342,"conf":{"spark.sql.shuffle.partitions":"2"}}
{"demo.public.products":{"0":2336},"__cdc-heartbeat.demo":{"0":41},"demo.public.customers":{"0":2701}}
"""


@pytest.mark.unit
def test_committed_offsets_reads_the_last_committed_batch(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    assert committed_offsets(tmp_path) is None  # nothing committed yet
    (tmp_path / "offsets" / "7").write_text(OFFSETS_FILE)
    (tmp_path / "offsets" / "8").write_text(OFFSETS_FILE.replace("2336", "9999"))
    (tmp_path / "commits" / "7").write_text("v1\n{}\n")
    (tmp_path / "commits" / ".7.crc").write_text("")
    # Batch 8 is planned but not committed: its offsets do not count as applied.
    assert committed_offsets(tmp_path) == {
        "demo.public.products": 2336,
        "__cdc-heartbeat.demo": 41,
        "demo.public.customers": 2701,
    }


@pytest.mark.unit
def test_a_follower_left_behind_counts_from_where_it_stopped(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    (tmp_path / "offsets" / "7").write_text(OFFSETS_FILE)
    (tmp_path / "commits" / "7").write_text("v1\n{}\n")
    applied = {
        "demo.public.products": 2336,
        "__cdc-heartbeat.demo": 41,
        "demo.public.customers": 2701,
    }
    assert follower_offsets(tmp_path) == {CACHE_JOB: applied, SEARCH_JOB: applied}
    # The search follower fell behind at batch 5 (a partition new since then: -2, earliest).
    since = {"demo.public.products": {"0": 1000, "1": -2}, "demo.public.customers": {"0": 50}}
    behind.save(tmp_path, {SEARCH_JOB: behind.Behind(5, since)})
    assert follower_offsets(tmp_path) == {
        CACHE_JOB: applied,
        SEARCH_JOB: {"demo.public.products": 1000, "demo.public.customers": 50},
    }


@pytest.fixture
def demo_state(endpoints: Endpoints) -> Iterator[None]:
    """The demo's state removed afterwards. The demo keeps it for a user to look at (`cdc
    status`, the lines it prints), but the suite shares the stack, where its inactive slot
    held back every later test's WAL: 3.4 GB after a suite and three benchmark runs."""
    yield
    resources.clean(
        DemoNames(
            admin_dsn=endpoints.postgres_dsn,
            kafka_bootstrap=endpoints.kafka_bootstrap,
            redis_url=endpoints.redis_url,
            search_url=endpoints.search_url,
        )
    )


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.usefixtures("demo_state")
def test_demo_runs_and_followers_equal_the_database(endpoints: Endpoints) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(
        CI="true",
        CDC_POSTGRES__DSN=endpoints.postgres_dsn,
        CDC_KAFKA__BOOTSTRAP_SERVERS=endpoints.kafka_bootstrap,
        CDC_REDIS__URL=endpoints.redis_url,
        CDC_SEARCH__URL=endpoints.search_url,
    )
    out = subprocess.run(
        [sys.executable, "scripts/demo.py", "--workload-seconds", "20"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-5000:]
    # The verification table: every table with equal counts in all three stores.
    for table in ("categories", "products", "stock_levels", "customers"):
        row = re.search(rf"public\.{table}\s*│\s*([\d,]+)\s*│\s*([\d,]+)\s*│\s*([\d,]+)", text)
        assert row, f"no verification row for {table}:\n{text[-3000:]}"
        counts = {int(c.replace(",", "")) for c in row.groups()}
        assert len(counts) == 1 and counts.pop() > 0, row.group(0)
    # The joined product documents (demo/documents.py) equal PostgreSQL's own join, and the
    # screen found a category's products among them by its name.
    row = re.search(r"products \(joined documents\)\s*│\s*([\d,]+)\s*│\s*–\s*│\s*([\d,]+)", text)
    assert row, f"no verification row for the joined documents:\n{text[-3000:]}"
    assert row.group(1) == row.group(2) and row.group(1) != "0", row.group(0)
    assert re.search(r"documents 'Lamps'=[1-9]", text), text[-3000:]
    assert "all followers equal PostgreSQL" in text
    # The live workload really ran, and the plain lines showed the followers' watermarks.
    assert re.search(r"workload done: [\d,]+ transactions", text), text[-3000:]
    assert re.search(r"cache_sync: behind=0 wm=[0-9A-F]+/[0-9A-F]+", text), text[-3000:]
    # The reader ran as the least-privilege role, not the stack's superuser (issue 34).
    settings = dict(
        line.split("=", 1) for line in (ROOT / ".stack/demo/demo.env").read_text().splitlines()
    )
    reader = conninfo_to_dict(settings["CDC_POSTGRES__DSN"].strip("'"))
    assert settings["CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE"] == "'disabled'"
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        row = conn.execute(
            "SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = %s", (reader["user"],)
        ).fetchone()
    assert reader["user"] == "cdc_reader" and row == (False, True), (reader["user"], row)
