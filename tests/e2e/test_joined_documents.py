"""Joined documents (spark_jobs/documents_sync.py) against the same join computed by
PostgreSQL: the demo catalog's products with their category and their stock levels.

Real PostgreSQL, reader, Kafka, Spark and OpenSearch. A seeded random workload over the
three tables (inserts, updates, deletes, a product moving category, a category deleted and
re-created, a stock level moving product, a product's and a category's key changing, a
category arriving after the products that reference it, a TRUNCATE of each lookup and list table) runs while the job runs; the job is
killed (SIGKILL) mid-stream and started again from its checkpoint; the index must then equal, document by document, the join
PostgreSQL computes; and so must a fresh index rebuilt from offset 0 with a fresh
checkpoint.
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from demo import documents
from demo.documents import differences
from pgcdc.core.contract import DOCUMENTS_JOB
from tests.conftest import ROOT, Endpoints, wait_until
from tests.e2e.pipeline import (
    Pipeline,
    kill_group,
    new_pipeline,
    run_jobs_available_now,
    run_reader_until_current,
    start_job,
    start_reader,
    tail,
)
from tests.integration.real_databases.support import cleanup
from tests.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

# The catalog without its foreign keys: a product may reference a category that does not
# exist yet (or any more), as the join must take.
NO_FOREIGN_KEYS = """
DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT conrelid::regclass AS t, conname FROM pg_constraint WHERE contype = 'f' LOOP
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.t, r.conname);
  END LOOP;
END $$;
"""

WAREHOUSES = ("north", "south", "east", "west")
CATEGORIES, PRODUCTS = 12, 120
# At these steps of the workload, a table is truncated (the second while the job is down).
TRUNCATES = {300: "stock_levels", 450: "categories"}


def _pipeline(
    endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory, **env: str
) -> Iterator[Pipeline]:
    schema = (ROOT / "demo" / "schema.sql").read_text() + NO_FOREIGN_KEYS
    p = new_pipeline(endpoints, "docs", schema, tmp_path_factory.mktemp("ckpt"))
    env.update(documents.documents_env())
    p = replace(p, settings_env=tuple(env.items()))
    try:
        yield p
    finally:
        cleanup(p)


@pytest.fixture
def pipeline(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    yield from _pipeline(endpoints, tmp_path_factory)


@pytest.fixture
def avro_pipeline(
    endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    """Avro in single-object encoding, the writer schemas in a folder."""
    schemas = tmp_path_factory.mktemp("avro-schemas")
    yield from _pipeline(
        endpoints,
        tmp_path_factory,
        CDC_SCHEMA__VALUE_FORMAT="avro",
        CDC_SCHEMA__AVRO_SCHEMA_DIR=str(schemas),
    )


class Workload:
    """Seeded random changes to the catalog, each statement its own transaction."""

    def __init__(self, dsn: str, seed: int) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.rng = random.Random(seed)
        self.step = 0
        self.key_changes: Counter[str] = Counter()  # keys moved to another value, by table

    def load(self) -> None:
        """The starting catalog: categories 1..10 (11 and 12 come later), products, stock."""
        run = self.conn.execute
        for c in range(1, CATEGORIES - 1):
            run(
                "INSERT INTO categories VALUES (%s, %s, %s)",
                (c, f"cat-{c}", None if c <= 3 else self.rng.randint(1, 3)),
            )
        for i in range(1, PRODUCTS + 1):
            self._product(i)
            for w in self.rng.sample(WAREHOUSES, self.rng.randint(0, 3)):
                run(
                    "INSERT INTO stock_levels (product_id, warehouse, quantity) VALUES (%s,%s,%s)",
                    (i, w, self.rng.randint(0, 50)),
                )

    def _product(self, i: int) -> None:
        self.conn.execute(
            "INSERT INTO products (id, sku, category_id, title, price, active) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (
                i,
                f"SKU-{i}",
                self.rng.randint(1, CATEGORIES),  # 11 and 12: not there yet
                f"product {i}",
                f"{self.rng.randint(100, 99999) / 100:.2f}",
                self.rng.random() < 0.8,
            ),
        )

    def changes(self, n: int) -> None:
        """``n`` random changes."""
        for _ in range(n):
            self.step += 1
            # A move onto a taken key: PostgreSQL refuses it, the join sees nothing.
            with contextlib.suppress(psycopg.errors.UniqueViolation):
                self._one()

    def _one(self) -> None:
        rng, run, s = self.rng, self.conn.execute, self.step
        if s in TRUNCATES:  # the reader writes a delete and a tombstone per key
            run(f"TRUNCATE {TRUNCATES[s]}")
            return
        pid, cid = rng.randint(1, PRODUCTS + 10), rng.randint(1, CATEGORIES)
        what = rng.random()
        if what < 0.15:
            run("UPDATE products SET title = %s, price = price + 1 WHERE id = %s", (f"t{s}", pid))
        elif what < 0.25:  # a product moves category (maybe to one not there yet)
            run("UPDATE products SET category_id = %s WHERE id = %s", (cid, pid))
        elif what < 0.32:
            run("DELETE FROM products WHERE id = %s", (pid,))
        elif what < 0.40:
            if not run("SELECT 1 FROM products WHERE id = %s", (pid,)).fetchone():
                self._product(pid)
        elif what < 0.50:  # a category renamed: every product in it changes
            run("UPDATE categories SET name = %s WHERE id = %s", (f"cat-{cid}-{s}", cid))
        elif what < 0.56:  # a category deleted and re-created, or created late
            if (
                run("DELETE FROM categories WHERE id = %s", (cid,)).rowcount == 0
                or rng.random() < 0.5
            ):
                run(
                    "INSERT INTO categories VALUES (%s, %s, NULL) ON CONFLICT (id) DO NOTHING",
                    (cid, f"new-{cid}-{s}"),
                )
        elif what < 0.72:
            run(
                "INSERT INTO stock_levels (product_id, warehouse, quantity) VALUES (%s, %s, %s) "
                "ON CONFLICT (product_id, warehouse) DO UPDATE SET quantity = excluded.quantity",
                (pid, rng.choice(WAREHOUSES), rng.randint(0, 50)),
            )
        elif what < 0.82:
            run(
                "DELETE FROM stock_levels WHERE product_id = %s AND warehouse = %s",
                (pid, rng.choice(WAREHOUSES)),
            )
        elif what < 0.86:  # a product's key changes (its stock levels keep the old id)
            to = rng.randint(1, PRODUCTS + 10)
            if run("UPDATE products SET id = %s WHERE id = %s", (to, pid)).rowcount:
                self.key_changes["products"] += 1
        elif what < 0.89:  # a category's key changes (its products keep the old id)
            to = rng.randint(1, CATEGORIES)
            if run("UPDATE categories SET id = %s WHERE id = %s", (to, cid)).rowcount:
                self.key_changes["categories"] += 1
        else:  # a stock level moves to another product (its key changes)
            run(
                "UPDATE stock_levels SET product_id = %s WHERE product_id = %s AND warehouse = %s",
                (rng.randint(1, PRODUCTS), pid, rng.choice(WAREHOUSES)),
            )

    def close(self) -> None:
        self.conn.close()


def postgres_join(p: Pipeline) -> dict[str, dict[str, Any]]:
    return documents.postgres_join(p.dsn)


def index_documents(p: Pipeline) -> dict[str, dict[str, Any]]:
    return documents.index_documents(p.endpoints.search_url, p.index_prefix)


def running(job: subprocess.Popen[bytes], log: Path) -> bool:
    """False while the job runs; the test fails at once (not at a wait's deadline) if it
    has stopped."""
    if job.poll() is not None:
        pytest.fail(f"the job exited {job.returncode}:\n{tail(log)}")
    return False


def converge(p: Pipeline, job: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Wait until the index equals PostgreSQL's join; at the deadline, fail with how they
    differ."""
    deadline = time.monotonic() + timeout
    while problems := differences(postgres_join(p), index_documents(p)):
        running(job, log)
        if time.monotonic() > deadline:
            pytest.fail(f"the index differs from PostgreSQL's join:\n{problems}\n{tail(log)}")
        time.sleep(1)  # polled: the next look, within the deadline above


def ready(port: int) -> bool:
    """Whether the job's /readyz answers 200 (it raises on another status)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
        return bool(resp.status == 200)


def committed_batches(p: Pipeline) -> int:
    commits = p.checkpoint_dir / DOCUMENTS_JOB / "commits"
    return len([f for f in commits.iterdir() if f.name.isdigit()]) if commits.is_dir() else 0


def test_joined_documents_equal_postgres_join_across_a_kill_and_a_rebuild(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    p, started = pipeline, time.monotonic()
    work = Workload(p.dsn, seed=20261130)
    work.load()
    log = tmp_path / "documents.log"
    reader = start_reader(p, tmp_path / "reader.log")
    args = (
        *("--max-offsets-per-trigger", "60", "--trigger-interval", "200 milliseconds"),
        *("--snapshot-every", "2"),  # the restart loads a snapshot and the deltas after it
    )
    job = start_job(p, DOCUMENTS_JOB, *args, log=log)
    try:
        work.changes(200)
        wait_until(
            lambda: running(job, log) or committed_batches(p) >= 3,
            timeout=180,
            interval=0.5,
            what="3 batches",
        )
        work.changes(200)
        done = committed_batches(p)
        wait_until(
            lambda: running(job, log) or committed_batches(p) > done,
            timeout=120,
            interval=0.2,
            what="one more batch",
        )
        kill_group(job)  # mid-stream: the backlog is several batches long
        behind = differences(postgres_join(p), index_documents(p))
        work.changes(150)  # while the job is down
        port = free_port()
        job = start_job(p, DOCUMENTS_JOB, *args, "--health-port", str(port), log=log)
        converge(p, job, log, timeout=180)
        wait_until(lambda: ready(port), timeout=30, what="/readyz to answer 200")
        text = log.read_text(errors="replace")
        loaded = re.search(
            r"documents' state loaded: snapshot (\d+), deltas up to batch (\d+)", text
        )
        assert loaded and int(loaded[1]) >= 1, tail(log)
        assert behind, "the kill came after the job had caught up: it proved nothing"
    finally:
        kill_group(job)
        kill_group(reader, signal.SIGTERM)
        work.close()
    want = postgres_join(p)
    assert len(want) > PRODUCTS // 2
    assert any(d["category"] is None for d in want.values())  # a lookup not (yet) there
    assert any(d["stock"] for d in want.values())
    assert work.key_changes["products"] and work.key_changes["categories"], work.key_changes
    print(f"\nlive run, kill and restart: {time.monotonic() - started:.1f}s")

    # A rebuild from offset 0: a fresh index, a fresh checkpoint, the same documents.
    rebuilt, at = p.with_follower("_rebuilt"), time.monotonic()
    run_jobs_available_now(rebuilt, (DOCUMENTS_JOB,), tmp_path, timeout=300)
    problems = differences(want, index_documents(rebuilt))
    assert not problems, problems
    print(f"rebuild from offset 0: {time.monotonic() - at:.1f}s")


def test_avro_change_events_give_the_same_documents(
    avro_pipeline: Pipeline, tmp_path: Path
) -> None:
    """The reader writing Avro: the job reads each record into Connect JSON first, and the
    index equals PostgreSQL's join as with JSON."""
    p, started = avro_pipeline, time.monotonic()
    work = Workload(p.dsn, seed=7)
    try:
        work.load()
        work.changes(150)
    finally:
        work.close()
    run_reader_until_current(p)
    run_jobs_available_now(p, (DOCUMENTS_JOB,), tmp_path, timeout=300)
    problems = differences(postgres_join(p), index_documents(p))
    assert not problems, problems
    print(f"\navro: {time.monotonic() - started:.1f}s")
