"""The followers on a real database (issue 10, acceptance cases 4, 7, 8 and 9).

One database holds the tables of cases 4, 7 and 8; the reader snapshots it, the changes of
each case are streamed, and both sync jobs run once, with a small
``--max-offsets-per-trigger`` so that the bulk transaction spans several micro-batches.
Each case then compares every row of PostgreSQL with Redis and OpenSearch.

- 4: a 200k-record transaction deletes and re-inserts the same keys: the re-insert wins.
- 7: a hostile catalog (dots, quotes, spaces, upper case, unicode; the pairs that collided
  before): every table has its own topic, index and keys, and the followers equal it.
- 8: every type the type map knows, with edge values: no job stops, each value is exact or
  dead-lettered with a reason (counted).
- keyless tables: their records are skipped with a log line, never dead-lettered.

Case 4 on a server whose LSN is beyond 2**47 (near 2**63) is slow, with its own pipeline.
Case 9 (kill -9 of the reader at 22 random points, a broker and a PostgreSQL restart
mid-stream) is test_kills_and_restarts.py, on servers of its own.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from opensearchpy import OpenSearch
from psycopg import sql

from pgcdc.core.contract import table_index
from sinks.base import key_id
from sinks.cache import CacheSink
from sinks.search import SearchSink
from tests.conftest import Endpoints
from tests.e2e.pipeline import SHARED_LOG, run_shared_available_now
from tests.integration.real_databases import catalog, throwaway
from tests.integration.real_databases.exact import (
    DeadLetter,
    cache_exact,
    dead_letters,
    differences,
    leader_exact,
    search_exact,
)
from tests.integration.real_databases.support import (
    JOBS,
    Pipeline,
    Table,
    assert_followers_equal,
    fresh_pipeline,
    run_reader_until_current,
)
from tests.integration.real_databases.throwaway import server_near_2_63  # noqa: F401 - fixture

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.spark]

MAX_OFFSETS_PER_TRIGGER = "30000"


class Run:
    """The module's pipeline after the reader and both jobs ran, and what the jobs logged."""

    def __init__(self, p: Pipeline, logs: Path) -> None:
        self.p = p
        self.logs = logs

    def log(self, job: str) -> str:
        """The lines of follower ``job`` in the shared job's log (and its common lines)."""
        text = (self.logs / SHARED_LOG).read_text(errors="replace")
        others = [j for j in JOBS if j != job]
        return "\n".join(ln for ln in text.splitlines() if not any(f" {o} " in ln for o in others))


@pytest.fixture(scope="module")
def run(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("followers_real")
    with fresh_pipeline(endpoints, tmp, "rdbf") as p:
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            catalog.create_all(conn)
            catalog.snapshot_rows(conn)
        run_reader_until_current(p)  # snapshot
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            catalog.stream_changes(conn)
        run_reader_until_current(p)  # the changes, streamed
        run_shared_available_now(
            p, tmp, "--max-offsets-per-trigger", MAX_OFFSETS_PER_TRIGGER, timeout=1200
        )
        yield Run(p, tmp)


# -- case 4 --------------------------------------------------------------------------------


def _held_and_document(p: Pipeline, follower_id: str, key: str) -> tuple[Any, dict[str, Any]]:
    """The version Redis holds for ``key`` and its OpenSearch document."""
    cache = CacheSink(p.endpoints.redis_url, p.key_prefix)
    search = SearchSink(p.endpoints.search_url, p.index_prefix)
    try:
        held = cache.read_version(follower_id, key)
        doc = search.client.get(index=search.index_for(follower_id), id=key)
    finally:
        cache.close()
        search.close()
    assert held is not None, key
    return held, dict(doc)


def test_case4_a_bulk_delete_and_reinsert_of_the_same_keys_ends_with_the_reinsert(
    run: Run,
) -> None:
    """Orders past 65,535 shared one OpenSearch version: the re-inserts got 409 and rows
    went missing. Now the re-insert of every key wins in both followers."""
    assert_followers_equal(run.p, [catalog.BULK])
    with psycopg.connect(run.p.dsn) as conn:
        counts = conn.execute(
            sql.SQL("SELECT count(*), min(gen), max(gen) FROM {}").format(catalog.BULK.ident)
        ).fetchone()
    assert counts == (catalog.BULK_ROWS, 2, 2)
    # The last re-insert's order is past the 65,535 that once shared one version, in both.
    last = str(catalog.BULK_ROWS)
    held, doc = _held_and_document(run.p, catalog.BULK.follower_id(run.p.name), last)
    assert held.order > catalog.ORDER_ONCE_SHARED and doc["_source"]["gen"] == 2, held
    # The transaction really spanned several micro-batches of each job.
    for job in JOBS:
        batches = run.log(job).count(f" {job} applied=")
        assert batches >= 4, f"{job} applied the bulk transaction in {batches} batches"


# -- case 7 --------------------------------------------------------------------------------


def test_case7_every_hostile_table_has_its_own_topic_index_and_keys(run: Run) -> None:
    p = run.p
    tables = catalog.HOSTILE
    topics = {t.topic(p.name) for t in tables}
    indices = {table_index(p.index_prefix, t.follower_id(p.name)) for t in tables}
    ids = {t.follower_id(p.name) for t in tables}
    assert len(topics) == len(indices) == len(ids) == len(tables)
    admin = AdminClient({"bootstrap.servers": p.endpoints.kafka_bootstrap})
    existing = set(admin.list_topics(timeout=10).topics)
    assert topics <= existing, f"missing topics: {sorted(topics - existing)}"
    client = OpenSearch(p.endpoints.search_url)
    try:
        for index in indices:
            assert client.indices.exists(index=index), index
    finally:
        client.close()


def test_case7_the_followers_equal_the_hostile_catalog(run: Run) -> None:
    assert_followers_equal(run.p, catalog.HOSTILE)


# -- case 8 --------------------------------------------------------------------------------


def _doc_id(key: str) -> str:
    """A dead letter's key as a document id (refused changes carry the id, records that
    could not be decoded their Kafka key)."""
    try:
        payload = orjson.loads(key)
    except orjson.JSONDecodeError:
        return key
    return key_id(payload) if isinstance(payload, dict) else key


def _dead(letters: list[DeadLetter], job: str, table: Table, p: Pipeline) -> dict[str, str]:
    tid = table.follower_id(p.name)
    return {_doc_id(d.key): d.reason for d in letters if d.job == job and d.table == tid and d.key}


def test_case8_every_type_is_exact_or_dead_lettered_with_a_reason(run: Run) -> None:
    """Before: a date past 9999 or BC, or a timestamp out of Python's range, raised in the
    job and stopped it for good; decimals of more than 28 digits were rounded."""
    p = run.p
    table = catalog.TYPES
    leader = leader_exact(p, table)
    assert len(leader) == 2 * len(catalog.type_literals())
    letters = dead_letters(p)
    report: dict[str, Counter[str]] = {}
    lossy: dict[str, Counter[str]] = {}
    problems = []
    for job, read in (("cache_sync", cache_exact), ("search_sync", search_exact)):
        dead = _dead(letters, job, table, p)
        assert all(dead.values()), "a dead letter without a reason"
        report[job] = Counter(catalog.row_label(k) for k in dead)
        lossy[job] = Counter()
        for k, how in differences(leader, read(p, table)).items():
            label = catalog.row_label(k)
            if k in dead:
                assert how == "missing", f"{job}: dead-lettered row {k} ({label}) is held: {how}"
            elif catalog.reader_lossy(label, how):
                lossy[job][label] += 1
            else:
                problems.append(f"{job}: row {k} ({label}): {how}")
    print("dead-lettered per job and column:", {j: dict(c) for j, c in report.items()})
    print("lossy in the reader's encoding:", {j: dict(c) for j, c in lossy.items()})
    assert not problems, "\n".join(problems[:40])
    assert report == catalog.EXPECTED_DEAD_LETTERS
    assert lossy == catalog.EXPECTED_READER_LOSSY


# -- keyless tables ------------------------------------------------------------------------


def test_keyless_tables_are_skipped_with_a_log_line_never_dead_lettered(run: Run) -> None:
    p = run.p
    tid = catalog.KEYLESS.follower_id(p.name)
    assert not [d for d in dead_letters(p) if d.table == tid or tid in (d.reason or "")]
    for job in JOBS:
        lines = [ln for ln in run.log(job).splitlines() if "keyless tables" in ln]
        assert lines and tid in lines[0], f"{job} said nothing of {tid}"


# -- case 4 on servers far along their WAL -------------------------------------------------


@pytest.mark.slow
def test_case4_on_a_server_whose_lsn_is_beyond_2_to_the_47_and_near_2_to_the_63(
    endpoints: Endpoints, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The packed OpenSearch version overflowed past LSN 2**47: every change was
    dead-lettered. Both followers now hold the re-inserts, at versions past 2**47, on a
    server 1 GiB of WAL below 2**63 (OpenSearch's largest version): one server covers both
    positions, and a 67k-record transaction (33.5k deletes, 33.5k re-inserts) runs there."""
    rows = catalog.BULK_ROWS
    server: throwaway.ThrowawayServer = request.getfixturevalue("server_near_2_63")
    on_server = dataclasses.replace(endpoints, postgres_dsn=server.dsn("postgres"))
    bulk = catalog.BULK
    with fresh_pipeline(on_server, tmp_path, "rdbl") as p:
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            catalog.create_bulk(conn, rows)
        run_reader_until_current(p)
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            catalog.delete_and_reinsert_bulk(conn, rows)
            lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
        assert lsn is not None and int(lsn[0]) > 2**47
        run_reader_until_current(p)
        run_shared_available_now(p, tmp_path, "--max-offsets-per-trigger", str(rows), timeout=1200)
        assert_followers_equal(p, [bulk])
        # The last re-insert: a version past 2**47, an order past the 65,535 once shared.
        held, doc = _held_and_document(p, bulk.follower_id(p.name), str(rows))
        assert held.commit_lsn > 2**47 and held.order > catalog.ORDER_ONCE_SHARED, held
        assert doc["_version"] == held.commit_lsn and doc["_source"]["gen"] == 2
