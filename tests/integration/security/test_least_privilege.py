"""A least-privilege role runs the whole pipeline: ``REPLICATION``, ``CONNECT``, ``USAGE`` on
the schema and ``SELECT`` on the captured tables, nothing else (no superuser, owns nothing),
with a publication its owner created beforehand (``publication_autocreate_mode=disabled``).

What the role may not do ends the start with one line saying what to run instead; a
publication already equal to ``postgres.tables`` is left alone under ``filtered``.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT, Endpoints
from tests.e2e.pipeline import Pipeline, cache_state, diff, leader_state, run_shared_available_now
from tests.e2e.pipeline import search_state as search_state_of

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

TABLES = ("public.items", "public.orders")


@dataclass(frozen=True)
class LeastPrivilege:
    pipeline: Pipeline  # its DSN is the least-privilege role's
    role: str
    publication: str
    owner_dsn: str  # the database as the superuser that owns the tables

    def cdc(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cdc", *args],
            env=self.pipeline.env(
                **{
                    "CDC_POSTGRES__PUBLICATION_NAME": self.publication,
                    "CDC_POSTGRES__TABLES": ",".join(TABLES),
                    "CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE": "disabled",
                }
                | env
            ),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def sql(self, statement: str) -> None:
        with psycopg.connect(self.owner_dsn, autocommit=True) as conn:
            conn.execute(statement)

    def publication_tables(self) -> set[str]:
        with psycopg.connect(self.owner_dsn) as conn:
            rows = conn.execute(
                "SELECT schemaname || '.' || tablename FROM pg_publication_tables "
                "WHERE pubname = %s",
                (self.publication,),
            ).fetchall()
        return {r[0] for r in rows}


@pytest.fixture(scope="module")
def lp(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LeastPrivilege]:
    name = f"lp_{uuid.uuid4().hex[:10]}"
    password = "lp-" + secrets.token_urlsafe(12)
    owner_dsn = endpoints.postgres_dsn_for(name)
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(f"CREATE ROLE {name} LOGIN REPLICATION PASSWORD '{password}'")
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, notes text)")
        # Out of line, uncompressed: an UPDATE that leaves notes alone sends "unchanged TOAST".
        conn.execute("ALTER TABLE items ALTER notes SET STORAGE EXTERNAL")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, item_id int, qty int)")
        conn.execute("CREATE TABLE secrets (id int PRIMARY KEY, s text)")  # not captured
        conn.execute(
            "INSERT INTO items SELECT i, 'item ' || i, repeat(md5(i::text), 400) "
            "FROM generate_series(1, 30) i"
        )
        conn.execute("INSERT INTO orders SELECT i, i % 30 + 1, i FROM generate_series(1, 20) i")
        # Exactly what docs/own-postgres.md tells a DBA to grant, and the publication made
        # beforehand by the tables' owner.
        conn.execute(f'GRANT CONNECT ON DATABASE "{name}" TO {name}')
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {name}")
        conn.execute(f"GRANT SELECT ON public.items, public.orders TO {name}")
        conn.execute(f"CREATE PUBLICATION {name}_pub FOR TABLE public.items, public.orders")
    base, _, _ = endpoints.postgres_dsn.rpartition("/")
    role_dsn = base.replace("cdc:cdc@", f"{name}:{password}@") + f"/{name}"
    checkpoints = tmp_path_factory.mktemp("lp") / "checkpoints"
    p = Pipeline(endpoints, role_dsn, name, name, name, checkpoints)
    try:
        yield LeastPrivilege(p, name, f"{name}_pub", owner_dsn)
    finally:
        _forget(endpoints, name)
        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE database = %s AND active",
                (name,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s AND NOT active",
                (name,),
            )
            conn.execute(f"DROP ROLE IF EXISTS {name}")


def _forget(endpoints: Endpoints, name: str) -> None:
    """Delete the run's topics, Redis keys and indices (every name starts with ``name``)."""
    import redis
    from confluent_kafka.admin import AdminClient
    from opensearchpy import OpenSearch

    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    topics = [t for t in admin.list_topics(timeout=10).topics if name in t]
    if topics:
        for fut in admin.delete_topics(topics, operation_timeout=30).values():
            fut.result()
    r = redis.Redis.from_url(endpoints.redis_url)
    keys = list(r.scan_iter(match=f"{name}*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()
    client = OpenSearch(endpoints.search_url)
    client.indices.delete(index=f"{name}*", ignore_unavailable=True, expand_wildcards="all")
    client.close()


def test_the_role_has_only_what_the_docs_grant(lp: LeastPrivilege) -> None:
    with psycopg.connect(lp.pipeline.dsn) as conn:
        row = conn.execute(
            "SELECT rolsuper, rolreplication, rolcreatedb, rolcreaterole "
            "FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == (False, True, False, False)
        owns = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relowner = "
            "(SELECT oid FROM pg_roles WHERE rolname = current_user)"
        ).fetchone()
        assert owns == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM secrets")


def test_the_whole_pipeline_runs_as_the_least_privilege_role(
    lp: LeastPrivilege, tmp_path: Path
) -> None:
    first = lp.cdc("run", "--until", "current")
    assert first.returncode == 0, first.stderr[-3000:]
    lp.sql("INSERT INTO items VALUES (31, 'new', 'short')")
    # An UPDATE that leaves the TOASTed notes alone: the reader reads them back by key.
    lp.sql("UPDATE items SET name = 'renamed' WHERE id = 2")
    lp.sql("DELETE FROM orders WHERE id = 3")
    lp.sql("UPDATE orders SET qty = 99 WHERE id = 4")
    lp.sql("INSERT INTO secrets VALUES (1, 'never captured')")
    second = lp.cdc("run", "--until", "current")
    assert second.returncode == 0, second.stderr[-3000:]
    status = lp.cdc("status")
    assert status.returncode == 0, status.stderr
    # The publication is the DBA's, exactly as made.
    assert lp.publication_tables() == set(TABLES)
    run_shared_available_now(lp.pipeline, tmp_path)
    for table in TABLES:
        leader = leader_state(lp.pipeline.dsn, table)
        assert leader, table
        assert diff(leader, cache_state(lp.pipeline, table)) == "", table
        assert diff(leader, search_state_of(lp.pipeline, table)) == "", table
    assert cache_state(lp.pipeline, "public.secrets") == {}


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The run's one error line (INFO log lines before it are the run's progress)."""
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.rstrip().endswith(errors[0]), done.stderr
    assert done.returncode == 2, done.stderr
    return errors[0]


def test_what_the_role_may_not_do_is_one_line_with_the_way_past_it(lp: LeastPrivilege) -> None:
    slot = {"CDC_POSTGRES__SLOT_NAME": f"{lp.role}_x"}
    # Creating FOR ALL TABLES needs a superuser.
    line = _one_line(
        lp.cdc(
            "run",
            "--until",
            "current",
            CDC_POSTGRES__PUBLICATION_NAME=f"{lp.role}_all",
            CDC_POSTGRES__TABLES="",
            CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE="all_tables",
            **slot,
        )
    )
    assert "may not create publication" in line and "FOR ALL TABLES" in line, line
    assert "publication_autocreate_mode=disabled" in line, line
    # disabled, and the publication is missing: the statement its owner should run.
    line = _one_line(
        lp.cdc("run", "--until", "current", CDC_POSTGRES__PUBLICATION_NAME=f"{lp.role}_no", **slot)
    )
    assert f"publication {lp.role}_no does not exist" in line, line
    assert (
        f'CREATE PUBLICATION "{lp.role}_no" FOR TABLE "public"."items", "public"."orders"' in line
    )
    # filtered with another list: altering needs the owner.
    line = _one_line(
        lp.cdc(
            "run",
            "--until",
            "current",
            CDC_POSTGRES__TABLES="public.items",
            CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE="filtered",
            **slot,
        )
    )
    assert "may not alter publication" in line and "must be owner" in line, line
    # disabled with another list: which tables differ, and nothing altered.
    line = _one_line(
        lp.cdc("run", "--until", "current", CDC_POSTGRES__TABLES="public.items", **slot)
    )
    assert "not listed: public.orders" in line, line
    assert lp.publication_tables() == set(TABLES)


def test_filtered_leaves_an_equal_publication_alone(lp: LeastPrivilege) -> None:
    """The same list as the publication: no ALTER, so the role needs no ownership."""
    done = lp.cdc(
        "run",
        "--until",
        "current",
        CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE="filtered",
        CDC_POSTGRES__SLOT_NAME=f"{lp.role}_f",
        CDC_KAFKA__TOPIC_PREFIX=f"{lp.role}_f",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert lp.publication_tables() == set(TABLES)
