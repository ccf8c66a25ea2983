"""``scripts/stack up --postgres 18``: the newest major from its Debian root, as the stack's
PostgreSQL (same role, database and TLS), in a stack folder of its own on a free port, so the
shared stack's server is left alone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from pgcdc.stack import common
from tests.conftest import STACK
from tests.pg_majors import NEWEST, can_run, free_port

pytestmark = pytest.mark.integration


def _stack(stack_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STACK_DIR": str(stack_dir), "CACHE_DIR": str(common.paths().cache)}
    return subprocess.run(
        [str(STACK), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_up_postgres_runs_the_chosen_major_with_the_stacks_role_and_tls(tmp_path: Path) -> None:
    reason = can_run(NEWEST)
    if reason:
        pytest.skip(reason)
    stack_dir = tmp_path / "stack"
    port = free_port()
    up = _stack(stack_dir, "up", "postgres", "--postgres", str(NEWEST), "--port", str(port))
    try:
        assert up.returncode == 0, up.stderr
        status = _stack(stack_dir, "status", "postgres")
        assert status.returncode == 0 and f"PostgreSQL {NEWEST}." in status.stdout, status.stdout
        env = _stack(stack_dir, "env").stdout
        dsn = f"postgresql://cdc:cdc@127.0.0.1:{port}/cdc"
        assert f"CDC_POSTGRES__DSN={dsn}" in env
        ca = stack_dir / "tls" / "ca.crt"
        with psycopg.connect(f"{dsn}?sslmode=verify-full&sslrootcert={ca}") as conn:
            row = conn.execute(
                "SELECT current_setting('server_version_num')::int / 10000, rolsuper, "
                "current_setting('wal_level'), ssl FROM pg_roles, pg_stat_ssl "
                "WHERE rolname = current_user AND pid = pg_backend_pid()"
            ).fetchone()
        assert row == (NEWEST, True, "logical", True)
        again = _stack(stack_dir, "up", "postgres")  # the choice is kept
        assert again.returncode == 0 and "already running" in again.stdout
        other = _stack(stack_dir, "up", "postgres", "--postgres", "15")
        assert other.returncode == 1
        assert "stop it first (scripts/stack down postgres)" in other.stderr, other.stderr
    finally:
        down = _stack(stack_dir, "down", "postgres")
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
