"""``cdc config check`` against real servers: a misconfigured PostgreSQL names every problem
and its fix; the shared stack, well configured, passes (and the check changes nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import Endpoints, unique
from tests.integration.reader_support import ROOT
from tests.integration.real_databases.throwaway import ThrowawayServer, throwaway_server

pytestmark = [pytest.mark.integration]

ROLE = "plain_reader"
ROLE_PASSWORD = "pl41n-Reader-pw-16+"  # 16+ characters: it derives the signal key
TABLES = "public.items,public.keyless,public.hidden"


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    return subprocess.run(
        [sys.executable, "-m", "cdc", "config", "check"],
        env=clean | env | {"PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def misconfigured() -> Iterator[ThrowawayServer]:
    """wal_level = replica; a login role without REPLICATION; a keyless table; a table the
    role may not read; no publication."""
    with throwaway_server(conf={"wal_level": "replica"}) as server:
        with server.connect() as conn:
            conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{ROLE_PASSWORD}'")
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
            conn.execute("CREATE TABLE keyless (a int, b text)")
            conn.execute("CREATE TABLE hidden (id int PRIMARY KEY)")
            conn.execute(f"GRANT SELECT ON items, keyless TO {ROLE}")
        yield server


def test_config_check_names_each_problem_and_its_fix(
    misconfigured: ThrowawayServer, endpoints: Endpoints
) -> None:
    dsn = f"postgresql://{ROLE}:{ROLE_PASSWORD}@127.0.0.1:{misconfigured.port}/postgres"
    done = _check(
        {
            "CDC_POSTGRES__DSN": dsn,
            "CDC_POSTGRES__TABLES": TABLES,
            "CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE": "disabled",
            "CDC_KAFKA__BOOTSTRAP_SERVERS": endpoints.kafka_bootstrap,
            "CDC_REDIS__URL": endpoints.redis_url,
            "CDC_SEARCH__URL": endpoints.search_url,
        }
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert ROLE_PASSWORD not in done.stdout + done.stderr
    fails = [line for line in done.stdout.splitlines() if line.startswith("FAIL ")]
    expected = {
        "wal_level": ("wal_level = replica", "fix: set wal_level = logical"),
        "replication": (f"role {ROLE} has no REPLICATION", f"ALTER ROLE {ROLE} REPLICATION"),
        "publication": (
            "publication cdc_pub does not exist",
            "postgres.publication_autocreate_mode=disabled",
            'CREATE PUBLICATION "cdc_pub" FOR TABLE "public"."items"',
        ),
        "keyless": (
            "table public.keyless has no primary key",
            "REPLICA IDENTITY FULL",
            "CDC_POSTGRES__MESSAGE_KEY_COLUMNS='public.keyless:<column>,...'",
        ),
        "select": ("may not SELECT public.hidden", f"GRANT SELECT ON public.hidden TO {ROLE}"),
    }
    for problem, parts in expected.items():
        matching = [line for line in fails if all(part in line for part in parts)]
        assert len(matching) == 1, f"{problem}: {parts} not in one of:\n" + "\n".join(fails)
    assert len(fails) == len(expected), "\n".join(fails)
    # The followers and Kafka are fine: their checks pass.
    for service in ("kafka", "redis", "opensearch"):
        assert any(line.startswith(f"ok   {service}:") for line in done.stdout.splitlines())
    assert done.stdout.splitlines()[-1] == f"{len(expected)} problem(s)"


def test_config_check_passes_on_the_stack_and_changes_nothing(
    pg_database: str, endpoints: Endpoints
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    slot = unique("chk")
    done = _check(
        {
            "CDC_POSTGRES__DSN": pg_database,
            "CDC_POSTGRES__SLOT_NAME": slot,
            "CDC_POSTGRES__PUBLICATION_NAME": slot,
            "CDC_POSTGRES__TABLES": "public.items",
            "CDC_KAFKA__BOOTSTRAP_SERVERS": endpoints.kafka_bootstrap,
            "CDC_REDIS__URL": endpoints.redis_url,
            "CDC_SEARCH__URL": endpoints.search_url,
        }
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "all checks passed"
    assert f"publication {slot} would be created" in done.stdout
    with psycopg.connect(pg_database, autocommit=True) as conn:
        assert (
            conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (slot,)).fetchone()
            is None
        )
        assert (
            conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            is None
        )
