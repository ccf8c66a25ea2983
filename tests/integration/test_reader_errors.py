"""Bad input: one clear ``error:`` line and a non-zero exit, never a silent data loss."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import Endpoints, unique, wait_until
from tests.integration.reader_support import ReaderEnv
from tests.integration.real_databases.throwaway import refused_port
from tests.ports import free_port as _free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return errors[0]


def test_postgres_unreachable(reader: ReaderEnv) -> None:
    with refused_port() as port:
        dsn = f"postgresql://cdc:cdc@127.0.0.1:{port}/nowhere"
        done = reader.run("run", timeout=60, CDC_POSTGRES__DSN=dsn)
    assert done.returncode != 0
    line = _one_error_line(done.stderr)
    assert "PostgreSQL" in line and "unreachable" in line


def test_kafka_unreachable(reader: ReaderEnv) -> None:
    with refused_port() as port:
        done = reader.run("run", timeout=60, CDC_KAFKA__BOOTSTRAP_SERVERS=f"127.0.0.1:{port}")
    assert done.returncode != 0
    line = _one_error_line(done.stderr)
    assert "Kafka" in line and "unreachable" in line


def test_vanished_slot_is_not_silently_recreated(reader: ReaderEnv) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO items SELECT g, 'v' FROM generate_series(1, 10) g")
    reader.catch_up()
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (reader.slot,))
    done = reader.run("run", "--until", "current", timeout=60)
    assert done.returncode != 0
    line = _one_error_line(done.stderr)
    assert reader.slot in line and "no longer exists" in line and "when_needed" in line
    with psycopg.connect(reader.dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (reader.slot,)
        ).fetchone()
        assert row == (0,), "the slot must not be recreated silently"
    # The documented recovery works: a new snapshot with when_needed.
    again = reader.catch_up(CDC_POSTGRES__SNAPSHOT_MODE="when_needed")
    assert "snapshot complete: 10 rows" in again.stderr


@pytest.fixture(scope="module")
def replica_level_server() -> Iterator[str]:
    """A throwaway PostgreSQL with wal_level=replica, run as the postgres user under /tmp."""
    bindir = Path(
        subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
    )
    if os.geteuid() != 0 or shutil.which("runuser") is None or not (bindir / "initdb").exists():
        pytest.skip("needs root (to run initdb as postgres) and PostgreSQL server binaries")
    data = Path(tempfile.mkdtemp(prefix="cdc-replica-"))
    shutil.chown(data, "postgres")
    port = _free_port()
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_pg, str(bindir / "initdb"), "-D", str(data / "db"), "-U", "cdc", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_pg,
            str(bindir / "pg_ctl"),
            "-D",
            str(data / "db"),
            "-l",
            str(data / "log"),
            "-w",
            "-o",
            f"-p {port} -c wal_level=replica -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={data}",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://cdc@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_pg, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(data, ignore_errors=True)


def test_wal_level_not_logical(reader: ReaderEnv, replica_level_server: str) -> None:
    wait_until(lambda: psycopg.connect(replica_level_server).close() is None, timeout=30)
    done = reader.run("run", timeout=60, CDC_POSTGRES__DSN=replica_level_server)
    assert done.returncode != 0
    line = _one_error_line(done.stderr)
    assert "wal_level" in line and "replica" in line
