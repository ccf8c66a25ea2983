"""Each source owns its slot and its topics (cdc.ownership), on real servers.

- A slot another tool created survives a reader pointed at it: same confirmed flush and
  restart LSN, and the reader exits non-zero naming it.
- Two databases under one topic prefix: the second is refused before it writes anything,
  and the first's topic still holds every key.
- A running pipeline's prefix changed: no slot is dropped; ``--adopt-slot`` moves the slot
  to the new prefix (snapshotted incrementally) and the old prefix then refuses it by name.
"""

from __future__ import annotations

import re
import secrets
import subprocess

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc.slots import other_readers, reader_name
from pgcdc.core.contract import table_topic
from tests.conftest import ROOT, Endpoints, unique
from tests.e2e.pipeline import CDC
from tests.integration.reader_support import read_topic

pytestmark = pytest.mark.integration

ROWS = 200


def _env(endpoints: Endpoints, dsn: str, slot: str, prefix: str, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(
        CDC_POSTGRES__DSN=dsn,
        CDC_POSTGRES__SLOT_NAME=slot,
        CDC_POSTGRES__PUBLICATION_NAME=slot,
        CDC_KAFKA__BOOTSTRAP_SERVERS=endpoints.kafka_bootstrap,
        CDC_KAFKA__TOPIC_PREFIX=prefix,
        **extra,
    )
    return env


def _cdc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CDC, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def _live_ids(endpoints: Endpoints, topic: str) -> set[int]:
    latest: dict[int, bool] = {}
    for r in read_topic(endpoints.kafka_bootstrap, topic):
        latest[r.key_id] = r.value is not None
    return {k for k, live in latest.items() if live}


def _slot(dsn: str, slot: str) -> tuple[str, str] | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text, restart_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    return (row[0], row[1]) if row else None


def _table(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL)")
        conn.execute("INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, %s) g", (rows,))


def test_another_tools_slot_survives_and_the_reader_names_it(
    endpoints: Endpoints, pg_database: str, topic_prefix: str
) -> None:
    _table(pg_database, 10)
    slot = unique("other_tool")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute("INSERT INTO t VALUES (1000, 'after the slot')")
    before = _slot(pg_database, slot)
    out = _cdc(_env(endpoints, pg_database, slot, topic_prefix), "run", "--until", "current")
    assert out.returncode != 0, out.stderr
    error = out.stderr.strip().splitlines()[-1]
    assert slot in error and "another tool" in error and "--adopt-slot" in error, out.stderr
    assert "dropped replication slot" not in out.stderr
    assert _slot(pg_database, slot) == before  # confirmed flush and restart LSN unchanged


def test_a_second_pg_database_under_the_same_prefix_is_refused_before_it_writes(
    endpoints: Endpoints, pg_database: str, second_pg_database: str, topic_prefix: str
) -> None:
    _table(pg_database, ROWS)
    _table(second_pg_database, 10)
    first = _cdc(
        _env(endpoints, pg_database, unique("a"), topic_prefix), "run", "--until", "current"
    )
    assert first.returncode == 0, first.stderr
    topic = table_topic(topic_prefix, "public", "t")
    assert len(_live_ids(endpoints, topic)) == ROWS

    slot_b = unique("b")
    env_b = _env(endpoints, second_pg_database, slot_b, topic_prefix)
    check = _cdc(env_b, "config", "check")
    assert check.returncode != 0 and "belongs to another source" in check.stdout + check.stderr
    second = _cdc(env_b, "run", "--until", "current")
    assert second.returncode == 2, second.stderr
    error = second.stderr.strip().splitlines()[-1]
    first_db = pg_database.rsplit("/", 1)[-1]
    second_db = second_pg_database.rsplit("/", 1)[-1]
    for part in (f"database {first_db}", f"database {second_db}", "CDC_KAFKA__TOPIC_PREFIX"):
        assert part in error, second.stderr
    assert _live_ids(endpoints, topic) == set(range(1, ROWS + 1))  # nothing tombstoned
    assert _slot(second_pg_database, slot_b) is None  # refused before creating anything

    # The explicit override (the same database moved to a new server) takes the prefix over.
    claimed = _cdc({**env_b, "CDC_KAFKA__CLAIM_PREFIX": "true"}, "run", "--until", "current")
    assert claimed.returncode == 0, claimed.stderr
    assert f"topic prefix {topic_prefix} moves from database {first_db}" in claimed.stderr
    assert _live_ids(endpoints, topic) == set(range(1, 11))

    # The way past, as the docs give it: the second source under a prefix of its own.
    own = f"{topic_prefix}_{second_db}"
    try:
        env_own = _env(endpoints, second_pg_database, unique("b"), own)
        ok = _cdc(env_own, "run", "--until", "current")
        assert ok.returncode == 0, ok.stderr
        assert _live_ids(endpoints, table_topic(own, "public", "t")) == set(range(1, 11))
    finally:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
        mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(own)]
        for fut in admin.delete_topics(mine, operation_timeout=30).values() if mine else []:
            fut.result()


def test_a_new_prefix_drops_no_slot_and_adopting_moves_it(
    endpoints: Endpoints, pg_database: str, topic_prefix: str
) -> None:
    _table(pg_database, ROWS)
    slot = unique("s")
    old = _env(endpoints, pg_database, slot, topic_prefix)
    assert _cdc(old, "run", "--until", "current").returncode == 0
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (%s, 'streamed')", (ROWS + 1,))
    position = _slot(pg_database, slot)

    new_prefix = f"{topic_prefix}_new"
    new = _env(endpoints, pg_database, slot, new_prefix)
    refused = _cdc(new, "run", "--until", "current")
    assert refused.returncode != 0
    error = refused.stderr.strip().splitlines()[-1]
    assert f"under topic prefix {topic_prefix}" in error and "--adopt-slot" in error, error
    assert _slot(pg_database, slot) == position  # neither dropped nor advanced

    adopted = _cdc(new, "run", "--until", "current", "--adopt-slot")
    assert adopted.returncode == 0, adopted.stderr
    assert f"moved from topic prefix {topic_prefix} to {new_prefix}" in adopted.stderr
    assert _live_ids(endpoints, table_topic(new_prefix, "public", "t")) == set(range(1, ROWS + 2))
    back = _cdc(old, "run", "--until", "current")
    assert back.returncode != 0 and f"under topic prefix {new_prefix}" in back.stderr


def test_a_fenced_reader_finds_only_its_own_slots_readers_as_an_unprivileged_role(
    pg_database: str, second_pg_database: str
) -> None:
    """What tells a fence by another reader from a transaction Kafka aborted on its timeout
    (cdc.pipeline._fenced_by): a reader of the same slot connected to the same database,
    whatever its role. A slot of that name in another database is another slot, with another
    transactional id, and its reader fences nobody."""
    slot = unique("fence")
    role, password = unique("fence_role"), secrets.token_urlsafe(12)
    with psycopg.connect(pg_database, autocommit=True) as su:
        su.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
    try:
        name = reader_name(slot)
        with (
            psycopg.connect(pg_database, application_name=name) as same,
            psycopg.connect(second_pg_database, application_name=name),
            psycopg.connect(
                make_conninfo(pg_database, user=role, password=password), application_name=name
            ) as mine,
        ):
            found = other_readers(mine, slot)
            pid = same.info.backend_pid
            # Another role's session: its pid and name, not when it started.
            assert found == [f"process {pid}"], found
            # A superuser's view of it: when it started too.
            (seen,) = other_readers(same, slot)
            assert re.fullmatch(rf"process {mine.info.backend_pid} \(since 2\d{{3}}-.+\)", seen)
    finally:
        with psycopg.connect(pg_database, autocommit=True) as su:
            su.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
