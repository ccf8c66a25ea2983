"""A table that leaves the captured set is said (the reader's log, ``cdc status``), and ``cdc
forget`` removes it from its topic and so from both followers (cdc.forget); the table that
stays is untouched."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT, Endpoints
from tests.e2e.pipeline import (
    CDC,
    Pipeline,
    cache_state,
    run_jobs_in_session,
    search_state,
)
from tests.integration.real_databases.support import fresh_pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

ROWS = 20
SCHEMA = """
CREATE TABLE stay (id int PRIMARY KEY, v text NOT NULL);
CREATE TABLE gone (id int PRIMARY KEY, v text NOT NULL);
INSERT INTO stay SELECT g, 'stay ' || g FROM generate_series(1, 20) g;
INSERT INTO gone SELECT g, 'gone ' || g FROM generate_series(1, 20) g;
"""


def _cdc(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CDC, *args], env=p.env(), cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def _tables(p: Pipeline, tables: str) -> Pipeline:
    return replace(p, settings_env=(("CDC_POSTGRES__TABLES", tables),))


def test_a_table_that_leaves_is_said_and_forget_removes_its_follower_copies(
    spark: Any, endpoints: Endpoints, tmp_path: Path
) -> None:
    with fresh_pipeline(endpoints, tmp_path, "leave") as p:  # its slot and database dropped
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
        _steps(spark, _tables(p, "public.stay,public.gone"))


def _steps(spark: Any, both: Pipeline) -> None:
    assert _cdc(both, "run", "--until", "current").returncode == 0
    run_jobs_in_session(spark, both)
    assert len(cache_state(both, "public.gone")) == ROWS
    assert len(search_state(both, "public.gone")) == ROWS

    stay = _tables(both, "public.stay")
    refused = _cdc(stay, "forget", "public.stay")  # still captured: refused, nothing written
    assert refused.returncode == 2 and "still captured" in refused.stderr
    left = _cdc(stay, "run", "--until", "current")
    assert left.returncode == 0, left.stderr
    assert "table public.gone left the captured set" in left.stderr
    assert "cdc forget public.gone" in left.stderr
    with psycopg.connect(both.dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM gone WHERE id <= 5")  # no longer captured
    status = _cdc(stay, "status", "--json")
    warnings = json.loads(status.stdout)["warnings"]
    assert any("public.gone left the captured set" in w for w in warnings), warnings

    forgot = _cdc(stay, "forget", "public.gone")
    assert forgot.returncode == 0, forgot.stderr
    assert f"public.gone: {ROWS} keys tombstoned" in forgot.stdout
    run_jobs_in_session(spark, stay)
    assert cache_state(stay, "public.gone") == {}
    assert search_state(stay, "public.gone") == {}
    assert len(cache_state(stay, "public.stay")) == ROWS
    # The reader's next start does not bring the forgotten table back into its state.
    assert _cdc(stay, "run", "--until", "current").returncode == 0
    after = json.loads(_cdc(stay, "status", "--json").stdout)["warnings"]
    assert not any("left the captured set" in w for w in after), after
