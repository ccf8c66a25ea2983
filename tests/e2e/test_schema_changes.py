"""A table's columns change under both followers streaming (issue 38): a type change, a
column added, one dropped, one renamed, and the type changed back, end equal to the table in
Redis and OpenSearch, rows not changed since the DDL included; the search follower builds the
next version of the index beside the one searches read and switches to it (also when killed
mid-build). Without search.evolve_indices, ``cdc status`` names a table whose index refuses
its columns: tests/integration/test_search_versions.py. The reader's side (a Relation message
with another shape snapshots the table again) is
tests/integration/incremental/test_schema_changes.py."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opensearchpy import OpenSearch
from opensearchpy.exceptions import ConnectionError as ConnectionError_
from opensearchpy.exceptions import TransportError

from demo.compare import diff, leader_state
from pgcdc.core.contract import SYNC_JOB
from sinks import search_versions as versions
from sinks.search_index import index_name
from tests.conftest import Endpoints, wait_until
from tests.e2e.pipeline import (
    SHARED_LOG,
    Pipeline,
    cache_state,
    kill_group,
    run_reader_until_current,
    run_shared_available_now,
    search_state,
    start_job,
    start_reader,
)
from tests.integration.real_databases.support import fresh_pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

TABLE = "public.items"
SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, qty int, name text);
INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 200) g;
"""


class Searcher:
    """Counts the documents of ``name`` through the name searches use, over and over, on a
    thread of its own, until stopped: what a user's searches saw while the follower built."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.counts: list[int] = []
        self.errors: list[TransportError] = []
        self.unanswered: list[ConnectionError_] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Searcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        client = OpenSearch(self.url, timeout=60)
        try:
            while not self._stop.is_set():
                try:
                    self.counts.append(int(client.count(index=self.name)["count"]))
                except ConnectionError_ as e:  # no answer at all (a busy machine): not one
                    self.unanswered.append(e)
                except TransportError as e:
                    self.errors.append(e)
                self._stop.wait(0.02)  # a pace, not a wait on anything: the other core works
        finally:
            client.close()

    def assert_complete(self, rows: int) -> None:
        """Every answer counted at least ``rows``; only the switch away from a concrete
        version 1 may fail a search in flight, with a retryable 503."""
        seen = f"{len(self.counts)} answers, {len(self.unanswered)} unanswered"
        assert self.counts and min(self.counts) >= rows, (sorted(set(self.counts))[:5], seen)
        assert all(e.status_code == 503 for e in self.errors), (self.errors, seen)


# The acceptance's sequence (issue 38), each statement while the reader and the shared job
# stream: a type change, rows updated in it, a column added and filled, one dropped, a row
# inserted, a rename, and the type changed back.
SEQUENCE = (
    "ALTER TABLE items ALTER COLUMN qty TYPE text USING qty::text",
    "UPDATE items SET qty = 'many-' || id WHERE id <= 50",
    "ALTER TABLE items ADD COLUMN tags text[]",
    "UPDATE items SET tags = ARRAY['t' || id, 'x'] WHERE id % 7 = 0",
    "ALTER TABLE items DROP COLUMN name",
    "INSERT INTO items (id, qty) VALUES (1000, 'new')",
    "ALTER TABLE items RENAME COLUMN qty TO amount",
    "UPDATE items SET amount = amount || '!' WHERE id <= 3",
    "ALTER TABLE items ALTER COLUMN amount TYPE int "
    "USING CASE WHEN amount ~ '^[0-9]+$' THEN amount::int ELSE -id END",
    "UPDATE items SET amount = amount + 1 WHERE id > 890",
)


def test_the_ddl_sequence_reaches_both_followers_while_they_stream(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    """With the defaults, both followers streaming: afterwards every document and every Redis
    row equals the table (no dropped column, the new types, row 1000), nothing was
    dead-lettered, the index's name reads version 2 (built after the first type change), and
    every search during the build counted a complete index."""
    rows = 900  # row 1000 comes with the sequence
    with fresh_pipeline(endpoints, tmp_path, "ddl") as p:  # its slot and database dropped after
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute(SCHEMA.replace("200", str(rows)))
        name = index_name(p.index_prefix, TABLE)
        reader = start_reader(p, tmp_path / "reader.log")
        job = start_job(
            p,
            SYNC_JOB,
            "--followers",
            "cache,search",
            "--max-offsets-per-trigger",
            "400",
            "--trigger-interval",
            "200 milliseconds",
            log=tmp_path / SHARED_LOG,
        )
        try:
            _converged(p, name, version=1)
            with Searcher(endpoints.search_url, name) as searcher:
                with psycopg.connect(p.dsn, autocommit=True) as conn:
                    for sql in SEQUENCE:
                        conn.execute(sql)
                leader = _converged(p, name, version=2)
        finally:
            kill_group(job)
            kill_group(reader)
        assert set(leader["1"]) == {"id", "amount", "tags"}, leader["1"]
        assert leader["5"]["amount"] == -5 and leader["1000"]["amount"] == -999
        assert leader["7"]["tags"] == ["t7", "x"] and leader["895"]["amount"] == 896
        searcher.assert_complete(rows)
        log = (tmp_path / SHARED_LOG).read_text()
        assert "now reads version 2" in log  # the build happened, and switched
        refusals = [line for line in log.splitlines() if "refused" in line]
        assert not re.search(r"_sync applied=\d+ skipped=\d+ failed=[1-9]", log), refusals[:5]
        assert "no longer follows" not in log


def _converged(p: Pipeline, name: str, *, version: int) -> dict[str, dict[str, Any]]:
    """Wait until Redis and OpenSearch equal the table and ``name`` reads ``version``; the
    table's state."""
    client = OpenSearch(p.endpoints.search_url)
    leader: dict[str, dict[str, Any]] = {}

    def equal() -> bool:
        nonlocal leader
        serving = versions.serving(client, name)
        if serving is None or serving.version != version:
            return False
        leader = leader_state(p.dsn, TABLE)
        return not diff(leader, cache_state(p, TABLE)) and not diff(leader, search_state(p, TABLE))

    try:
        wait_until(equal, timeout=600, interval=1, what=f"both followers equal, version {version}")
    finally:
        client.close()
    return leader


def test_a_type_change_builds_the_next_index_version_while_searches_stay_complete(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    """After ALTER … TYPE the search index cannot take, the shared job
    builds the next version beside the one searches read, is killed mid-build, resumes, and
    switches; a searcher counting through the index name never sees fewer rows, and no
    change is dead-lettered."""
    rows = 2_000
    with fresh_pipeline(endpoints, tmp_path, "ddlv") as p:  # search.evolve_indices by default
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute(SCHEMA.replace("200", str(rows)))
        run_reader_until_current(p)
        (tmp_path / "before").mkdir()
        run_shared_available_now(p, tmp_path / "before")
        name = index_name(p.index_prefix, TABLE)
        assert versions.serving(OpenSearch(endpoints.search_url), name) == versions.Serving(
            name, name, 1
        )
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE items ALTER COLUMN qty TYPE text USING 'many-' || qty")
            conn.execute("UPDATE items SET name = 'u' || id WHERE id <= 50")
        run_reader_until_current(p)  # the reader snapshots the table again in the new shape

        with Searcher(endpoints.search_url, name) as searcher:
            # Streaming in small batches; killed once the next version exists (mid-build).
            (tmp_path / "killed").mkdir()
            job = start_job(
                p,
                SYNC_JOB,
                "--followers",
                "cache,search",
                "--max-offsets-per-trigger",
                "300",
                "--trigger-interval",
                "100 milliseconds",
                log=tmp_path / "killed" / SHARED_LOG,
            )
            client = OpenSearch(endpoints.search_url)
            wait_until(
                lambda: client.indices.exists(index=f"{name}-v2"),
                timeout=600,
                interval=0.2,
                what="the next index version",
            )
            kill_group(job)
            assert versions.serving(client, name) == versions.Serving(name, name, 1)
            # Restarted from its checkpoint: it finds the build by its index and goes on.
            run_shared_available_now(p, tmp_path)
        assert versions.serving(client, name) == versions.Serving(name, f"{name}-v2", 2)
        client.close()
        leader = leader_state(p.dsn, TABLE)
        assert leader["5"]["qty"] == "many-5"
        assert not diff(leader, search_state(p, TABLE)), diff(leader, search_state(p, TABLE))
        assert not diff(leader, cache_state(p, TABLE)), diff(leader, cache_state(p, TABLE))
        searcher.assert_complete(rows)
        logs = (tmp_path / SHARED_LOG).read_text() + (tmp_path / "killed" / SHARED_LOG).read_text()
        assert "now reads version 2" in logs  # the driver's switch (workers log the build)
        assert not re.search(r"search_sync applied=\d+ skipped=\d+ failed=[1-9]", logs)
