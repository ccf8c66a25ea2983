"""PostgreSQL servers of a chosen major for the tests, beside the shared stack, never instead.

``CDC_TEST_POSTGRES=<major>`` points the whole session's ``endpoints`` at a server of that
major (:func:`session_server`), started on a free 127.0.0.1 port with the stack's role and
database (superuser ``cdc``/``cdc``, database ``cdc``) and stopped when the session ends;
Kafka, Redis and OpenSearch stay the stack's. A major the machine has installed runs from its
binaries; 17 and 18 run from Debian roots (:mod:`pgcdc.stack.pgroot`, built once into
``CACHE_DIR/pgroots``). Unset (or the stack's own major), the tests use the stack's server.

:func:`server` starts one for a single test or module (a primary, a standby made from it with
:func:`standby_of`), with extra settings; the tests of failover and standbys use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from pgcdc.stack import common, pgbin, pgroot
from pgcdc.stack.pgserver import NativeRuntime, PgServer, RootRuntime, Runtime, runtime_for
from tests.ports import free_port

ENV = "CDC_TEST_POSTGRES"
# The newest major the default run covers besides the stack's, and the whole matrix.
NEWEST = 18
MATRIX = (15, 17, 18)
# What `make test-matrix` runs on each major: the reader's suite, the real-database cases,
# the Debezium parity module, the failover test.
READER_SUITE = (
    "tests/integration/test_reader_compaction.py",
    "tests/integration/test_reader_crash.py",
    "tests/integration/test_reader_errors.py",
    "tests/integration/test_reader_heartbeat.py",
    "tests/integration/test_reader_memory.py",
    "tests/integration/test_reader_robustness.py",
    "tests/integration/test_reader_stream.py",
    "tests/integration/test_reader_toast.py",
    "tests/integration/test_replication.py",
    "tests/integration/test_snapshot_records.py",
    "tests/integration/test_type_oracle.py",
    "tests/integration/test_generated_columns.py",
    "tests/integration/test_standby_reader.py",
)
MAJOR_SUITE = (
    *READER_SUITE,
    "tests/integration/real_databases",
    "tests/integration/debezium_parity",
    "tests/e2e/test_failover.py",
)
# The part of the reader's suite `make test` repeats on the newest major (scripts/test's
# newest phase): what a major can change (the replication protocol and its messages, every
# type's text, TOAST and key changes, DDL mid-stream, generated columns).
NEWEST_SUBSET = (
    "tests/integration/test_replication.py",
    "tests/integration/test_type_oracle.py",
    "tests/integration/test_snapshot_records.py",
    "tests/integration/test_reader_toast.py",
    "tests/integration/test_reader_robustness.py",
    "tests/integration/test_generated_columns.py",
)
USER = PASSWORD = DATABASE = "cdc"

BASE_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "100",
    "shared_buffers": "64MB",
    "jit": "off",
    # Throwaway servers: durability buys nothing here (synchronous_commit stays on: logical
    # decoding reads only flushed WAL).
    "fsync": "off",
    "full_page_writes": "off",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
}
HBA = [
    "local all         all                  trust",
    "host  all         all  127.0.0.1/32 scram-sha-256",
    "host  replication all  127.0.0.1/32 scram-sha-256",
]


def requested_major() -> int | None:
    """The major ``CDC_TEST_POSTGRES`` names, or None when it is unset."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise pytest.UsageError(f"{ENV}={raw!r} is not a PostgreSQL major (15, 17, 18)") from None


def chosen_major() -> int | None:
    """The major ``CDC_TEST_POSTGRES`` asks for, or None for the stack's own server."""
    major = requested_major()
    return None if major is None or major == stack_major() else major


def feature_major(since: int, feature: str) -> int:
    """The major a test of a feature of PostgreSQL ``since``+ runs on: the requested one
    (skipped when older: a matrix leg of an older major), else the newest."""
    major = requested_major()
    if major is None:
        return NEWEST
    if major < since:
        pytest.skip(f"PostgreSQL {major} has no {feature} (since {since})")
    return major


def stack_major() -> int | None:
    """The major the machine has installed (the stack's, unless chosen otherwise)."""
    found = pgbin.find()
    return pgbin.version(found) if found is not None else None


def can_run(major: int) -> str | None:
    """None if a server of ``major`` can run here, else why not (for a skip)."""
    if major in pgbin.installed():
        return None
    if not pgroot.available(major):
        return f"PostgreSQL {major} is neither installed nor in a Debian suite"
    if os.geteuid() != 0:
        return f"PostgreSQL {major} runs from a Debian root with chroot, which needs root"
    return None


def _layout(runtime: Runtime, home: Path) -> tuple[Path, Path]:
    """(data, socket folder) of a server in ``home``: inside the root for a root's server."""
    if isinstance(runtime, RootRuntime):
        return runtime.root / "var/lib/postgresql/data", runtime.root / "run/postgresql"
    return home / "data", home / "sock"


def _runtime(major: int, home: Path) -> Runtime:
    reason = can_run(major)
    if reason is not None:
        pytest.skip(reason)
    installed = pgbin.installed()
    if major in installed:
        return NativeRuntime(installed[major], major)
    return runtime_for(common.paths(), major, home / "root")


def _home(prefix: str) -> Path:
    home = Path(tempfile.mkdtemp(prefix=prefix))
    home.chmod(0o755)  # the native server's user reaches its folders through it
    return home


@contextlib.contextmanager
def server(
    major: int, *, settings: Mapping[str, str] | None = None, name: str = "pg"
) -> Iterator[PgServer]:
    """A new server of ``major`` with superuser cdc/cdc and database cdc; stopped and
    deleted afterwards."""
    home = _home(f"cdc-pg{major}-{name}-")
    try:
        runtime = _runtime(major, home)
        data, sockdir = _layout(runtime, home)
        srv = PgServer(runtime, data, free_port(), sockdir, home / "server.log")
        srv.initdb(superuser=USER, password=PASSWORD)
        srv.configure({**BASE_SETTINGS, **(settings or {})}, HBA)
        srv.start()
        srv.query(f"CREATE DATABASE {DATABASE}")
    except BaseException:
        _stop_quietly(locals().get("srv"))
        shutil.rmtree(home, ignore_errors=True)
        raise
    try:
        yield srv
    finally:
        _stop_quietly(srv)
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def standby_of(
    primary: PgServer,
    *,
    slot: str,
    settings: Mapping[str, str] | None = None,
    name: str = "standby",
) -> Iterator[PgServer]:
    """A streaming standby of ``primary`` (same major, pg_basebackup through the physical
    slot ``slot``, which is created here), with ``settings``; stopped and deleted after."""
    primary.query(f"SELECT pg_create_physical_replication_slot('{slot}')")
    major = primary.runtime.major
    home = _home(f"cdc-pg{major}-{name}-")
    try:
        runtime = _runtime(major, home)
        data, sockdir = _layout(runtime, home)
        srv = PgServer(runtime, data, free_port(), sockdir, home / "server.log", superuser=USER)
        srv.basebackup_from(primary.port, user=USER, password=PASSWORD, slot=slot, dbname=DATABASE)
        srv.configure({**BASE_SETTINGS, "primary_slot_name": f"'{slot}'", **(settings or {})}, HBA)
        srv.start()
    except BaseException:
        _stop_quietly(locals().get("srv"))
        shutil.rmtree(home, ignore_errors=True)
        raise
    try:
        yield srv
    finally:
        _stop_quietly(srv)
        shutil.rmtree(home, ignore_errors=True)


def _stop_quietly(srv: PgServer | None) -> None:
    if srv is None:
        return
    with contextlib.suppress(common.StackError):
        srv.stop()


@contextlib.contextmanager
def session_server() -> Iterator[PgServer | None]:
    """The server of the major ``CDC_TEST_POSTGRES`` chooses, or None for the stack's."""
    major = chosen_major()
    if major is None:
        yield None
        return
    with server(major, name="session") as srv:
        yield srv


def major_of_dsn(dsn: str) -> int:
    """The major of the server a DSN reaches."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None
    return int(row[0]) // 10000
