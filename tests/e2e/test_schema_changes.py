"""A table's columns change under both followers (issue 38): columns added, dropped and
renamed, and a type change in the cache, end equal to the table in Redis and OpenSearch,
rows not changed since the DDL included. A type change the search index cannot take makes
``cdc status`` unhealthy with one line naming the table, until the index is built again as
docs/schema-changes.md says. The reader's side (a Relation message with another shape
snapshots the table again) is tests/integration/incremental/test_schema_changes.py."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opensearchpy import OpenSearch
from opensearchpy.exceptions import TransportError

from demo.compare import diff, leader_state
from pgcdc.core.contract import SYNC_JOB
from sinks import search_versions as versions
from sinks.search_index import index_name
from tests.conftest import ROOT, Endpoints, wait_until
from tests.e2e.pipeline import (
    CDC,
    SHARED_LOG,
    Pipeline,
    cache_state,
    kill_group,
    run_jobs_in_session,
    run_reader_until_current,
    run_shared_available_now,
    search_state,
    start_job,
)
from tests.integration.real_databases.support import fresh_pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

TABLE = "public.items"
SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, qty int, name text);
INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 200) g;
"""


def _status(p: Pipeline) -> dict[str, Any]:
    out = subprocess.run(
        [*CDC, "status", "--json"],
        env=p.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return dict(json.loads(out.stdout))


def test_added_dropped_and_renamed_columns_reach_both_followers(
    spark: Any, endpoints: Endpoints, tmp_path: Path
) -> None:
    with fresh_pipeline(endpoints, tmp_path, "ddl") as p:  # its slot and database dropped after
        _steps(spark, endpoints, p)


def _steps(spark: Any, endpoints: Endpoints, p: Pipeline) -> None:
    with psycopg.connect(p.dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    run_reader_until_current(p)
    run_jobs_in_session(spark, p)
    assert len(cache_state(p, TABLE)) == len(search_state(p, TABLE)) == 200

    with psycopg.connect(p.dsn, autocommit=True) as conn:
        for sql in (
            "ALTER TABLE items ADD COLUMN tags text[]",
            "UPDATE items SET tags = ARRAY['t' || id] WHERE id % 7 = 0",
            "ALTER TABLE items DROP COLUMN name",
            "INSERT INTO items (id, qty) VALUES (1000, 1000)",
            "ALTER TABLE items RENAME COLUMN qty TO amount",
            "UPDATE items SET amount = amount + 1 WHERE id <= 3",
        ):
            conn.execute(sql)
    run_reader_until_current(p)
    run_jobs_in_session(spark, p)
    leader = leader_state(p.dsn, TABLE)
    assert set(leader["1"]) == {"id", "amount", "tags"}
    assert not diff(leader, cache_state(p, TABLE)), diff(leader, cache_state(p, TABLE))
    assert not diff(leader, search_state(p, TABLE)), diff(leader, search_state(p, TABLE))

    # A type change whose values only PostgreSQL knows (USING): the cache holds them all.
    with psycopg.connect(p.dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE items ALTER COLUMN amount TYPE text USING 'many-' || amount")
    run_reader_until_current(p)
    run_jobs_in_session(spark, p)
    leader = leader_state(p.dsn, TABLE)
    assert leader["5"]["amount"] == "many-5"
    assert not diff(leader, cache_state(p, TABLE)), diff(leader, cache_state(p, TABLE))

    # The search index maps amount as a number: it refuses 'many-5', and says so.
    problems = _status(p)["problems"]
    index = index_name(p.index_prefix, TABLE)
    refused = [x for x in problems if f"index {index} no longer follows table public.items" in x]
    # (amount came with the rename: the index mapped it dynamically, as a long)
    assert refused and "amount is long in the index, text now" in refused[0], problems

    # Built again as docs/schema-changes.md says: the index deleted, the table snapshotted.
    request = urllib.request.Request(f"{endpoints.search_url}/{index}", method="DELETE")
    urllib.request.urlopen(request, timeout=30).close()
    out = subprocess.run(
        [*CDC, "snapshot", TABLE],
        env=p.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    run_reader_until_current(p)
    run_jobs_in_session(spark, p)
    assert not diff(leader, search_state(p, TABLE)), diff(leader, search_state(p, TABLE))
    assert not any("no longer follows" in x for x in _status(p)["problems"])


def test_a_type_change_builds_the_next_index_version_while_searches_stay_complete(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    """search.evolve_indices: after ALTER … TYPE the search index cannot take, the shared job
    builds the next version beside the one searches read, is killed mid-build, resumes, and
    switches; a searcher counting through the index name never sees fewer rows, and no
    change is dead-lettered."""
    rows = 2_000
    with fresh_pipeline(endpoints, tmp_path, "ddlv") as first:
        p = dataclasses.replace(first, settings_env=(("CDC_SEARCH__EVOLVE_INDICES", "true"),))
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

        counts: list[int] = []
        errors: list[TransportError] = []
        stop = threading.Event()

        def searcher() -> None:
            client = OpenSearch(endpoints.search_url)
            try:
                while not stop.is_set():
                    try:
                        counts.append(int(client.count(index=name)["count"]))
                    except TransportError as e:
                        errors.append(e)
            finally:
                client.close()

        probe = threading.Thread(target=searcher)
        probe.start()
        try:
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
        finally:
            stop.set()
            probe.join()
        assert versions.serving(client, name) == versions.Serving(name, f"{name}-v2", 2)
        client.close()
        leader = leader_state(p.dsn, TABLE)
        assert leader["5"]["qty"] == "many-5"
        assert not diff(leader, search_state(p, TABLE)), diff(leader, search_state(p, TABLE))
        assert not diff(leader, cache_state(p, TABLE)), diff(leader, cache_state(p, TABLE))
        # Every answer counted a complete index; only the switch away from the concrete
        # version 1 may fail a search in flight, with a retryable 503.
        assert counts and min(counts) >= rows, sorted(set(counts))[:5]
        assert all(e.status_code == 503 for e in errors), errors
        logs = (tmp_path / SHARED_LOG).read_text() + (tmp_path / "killed" / SHARED_LOG).read_text()
        assert "now reads version 2" in logs  # the driver's switch (workers log the build)
        assert not re.search(r"search_sync applied=\d+ skipped=\d+ failed=[1-9]", logs)
