"""A table's columns change under both followers (issue 38): columns added, dropped and
renamed, and a type change in the cache, end equal to the table in Redis and OpenSearch,
rows not changed since the DDL included. A type change the search index cannot take makes
``cdc status`` unhealthy with one line naming the table, until the index is built again as
docs/schema-changes.md says. The reader's side (a Relation message with another shape
snapshots the table again) is tests/integration/incremental/test_schema_changes.py."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from demo.compare import diff, leader_state
from sinks.search_index import index_name
from tests.conftest import ROOT, Endpoints
from tests.e2e.pipeline import (
    CDC,
    Pipeline,
    cache_state,
    run_jobs_in_session,
    run_reader_until_current,
    search_state,
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
