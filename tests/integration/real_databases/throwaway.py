"""A throwaway PostgreSQL server of a test's own, for what the shared stack must not see.

Started with initdb and pg_ctl (as the ``postgres`` OS user when the tests run as root, like
``pgcdc.stack.postgres``), on a free 127.0.0.1 port, ``wal_level = logical``, a superuser
``cdc`` with password ``cdc``. Options move its WAL position far ahead with ``pg_resetwal -l``
(:data:`LSN_BEYOND_2_47`, :data:`LSN_NEAR_2_63`), pass environment variables to the server
(``LOCPATH`` for a locale built with ``localedef``), add configuration lines and turn on TLS
(``tls=True``: ``ssl = on`` with a self-signed certificate for 127.0.0.1 in its data folder).

Fixtures: :func:`server_beyond_2_47` and :func:`server_near_2_63` (module-scoped). Import them
into a test module (``from tests.integration.real_databases.throwaway import
server_beyond_2_47  # noqa: F401``) or start one with :func:`throwaway_server`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pgcdc.core.lsn import Lsn
from pgcdc.stack.common import StackError, chown, run
from pgcdc.stack.pgserver import PgServer
from tests.pg_majors import chosen_major
from tests.ports import free_port

# PostgreSQL 15's binaries as Debian installs them (PG_BINDIR names others).
BIN = Path(os.environ.get("PG_BINDIR") or "/usr/lib/postgresql/15/bin")
OS_USER = "postgres"  # initdb and postgres refuse to run as root

WAL_SEGMENT_BYTES = 16 * 1024 * 1024  # initdb's default --wal-segsize
# 2**47 bytes of WAL: where OpenSearch's old packed version (LSN << 16 | order) overflowed.
LSN_BEYOND_2_47 = Lsn(2**47)
# 1 GiB below 2**63: OpenSearch's versions are signed 63-bit; room for a large transaction.
LSN_NEAR_2_63 = Lsn(2**63 - 2**30)
PASSWORD = "cdc"


def wal_file_name(lsn: Lsn, timeline: int = 1, segment_bytes: int = WAL_SEGMENT_BYTES) -> str:
    """The name of the WAL segment file holding ``lsn`` (what ``pg_resetwal -l`` takes)."""
    segno = lsn.value // segment_bytes
    per_xlogid = 0x1_0000_0000 // segment_bytes
    return f"{timeline:08X}{segno // per_xlogid:08X}{segno % per_xlogid:08X}"


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A TCP port at 127.0.0.1 that refuses every connection while the block runs: it is bound
    here and never listened on. A port from :func:`free_port` is free only when asked; in a
    parallel suite another test's server (or a client's own end, connecting to itself) can
    take it a second later, and a test that waits for "Connection refused" then sees another
    error."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@dataclass
class ThrowawayServer:
    """A running throwaway server; :meth:`dsn` names one of its databases."""

    home: Path
    port: int
    env: Mapping[str, str]
    tls: bool = False  # ssl = on (a self-signed certificate)

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def log(self) -> Path:
        return self.home / "server.log"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://cdc:{PASSWORD}@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.dsn(dbname), autocommit=True)

    def current_lsn(self) -> Lsn:
        with self.connect() as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return Lsn.parse(str(row[0]))

    def create_database(self, name: str, *options: str) -> str:
        """A new database (``options`` are CREATE DATABASE clauses); returns its DSN."""
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}" ' + " ".join(options))
        return self.dsn(name)

    def pg_ctl(self, *args: str, check: bool = True) -> None:
        _run_as_postgres([str(BIN / "pg_ctl"), "-D", str(self.data), *args], self.env, check)

    def restart(self) -> None:
        """A fast shutdown, then a start (``pg_ctl restart -m fast``)."""
        # -l: the restarted postmaster must not inherit pg_ctl's captured stdout.
        self.pg_ctl("restart", "-m", "fast", "-w", "-t", "60", "-l", str(self.log))

    def stop(self) -> None:
        """Fast shutdown, else immediate (a walsender whose client stopped reading can hold
        a fast shutdown for ever)."""
        try:
            self.pg_ctl("stop", "-m", "fast", "-w", "-t", "30")
        except StackError:
            self.pg_ctl("stop", "-m", "immediate", "-w", "-t", "30", check=False)


@dataclass
class MajorThrowawayServer(ThrowawayServer):
    """A throwaway server of the major ``CDC_TEST_POSTGRES`` chooses (tests.pg_majors)."""

    server: PgServer | None = None

    @property
    def data(self) -> Path:
        assert self.server is not None
        return self.server.data

    @property
    def log(self) -> Path:
        assert self.server is not None
        return self.server.log

    def pg_ctl(self, *args: str, check: bool = True) -> None:
        raise NotImplementedError("use restart() or stop()")

    def restart(self) -> None:
        assert self.server is not None
        self.server.stop()
        self.server.start()

    def stop(self) -> None:
        assert self.server is not None
        self.server.stop()


def _as_root() -> bool:
    return os.geteuid() == 0


def _give_to_postgres(path: Path) -> None:
    if _as_root():
        chown(path, OS_USER)


def _run_as_postgres(cmd: list[str], env: Mapping[str, str], check: bool = True) -> None:
    run(cmd, user=OS_USER if _as_root() else None, env=dict(env), check=check, timeout=180)


def _make_certificate(data: Path, give: Callable[[Path], None]) -> dict[str, str]:
    """A self-signed certificate for 127.0.0.1 as ``data``/server.crt and server.key (the
    server's default file names; the key 0600, both handed to the server's user by ``give``);
    returns the settings that turn TLS on."""
    cert, key = data / "server.crt", data / "server.key"
    run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-days", "2", "-keyout", str(key), "-out", str(cert),
        ],
        timeout=60,
    )  # fmt: skip
    key.chmod(0o600)
    for path in (cert, key):
        give(path)
    return {"ssl": "on"}


def _conf_lines(port: int, sockdir: Path, extra: Mapping[str, str]) -> str:
    conf = {
        "listen_addresses": "'127.0.0.1'",
        "port": str(port),
        "unix_socket_directories": f"'{sockdir}'",
        "wal_level": "logical",
        "max_replication_slots": "10",
        "max_wal_senders": "10",
        "max_connections": "40",
        "shared_buffers": "32MB",
        # A throwaway: durability buys nothing here, speed does. (synchronous_commit stays
        # on: logical decoding reads only flushed WAL.)
        "fsync": "off",
        "full_page_writes": "off",
        **extra,
    }
    return "\n".join(f"{k} = {v}" for k, v in conf.items()) + "\n"


@contextlib.contextmanager
def throwaway_server(
    *,
    wal_start: Lsn | None = None,
    env: Mapping[str, str] | None = None,
    conf: Mapping[str, str] | None = None,
    tls: bool = False,
) -> Iterator[ThrowawayServer]:
    """Start a server of its own; stop it and delete its files afterwards.

    ``wal_start``: move the WAL position there first (``pg_resetwal -l``); the server's
    ``pg_current_wal_lsn()`` is then at least ``wal_start``. ``env`` goes to the server
    process; ``conf`` adds ``postgresql.conf`` settings (values as written in the file);
    ``tls`` turns TLS on (a client's default ``sslmode=prefer`` then negotiates it).

    The major is the installed one, or the one ``CDC_TEST_POSTGRES`` chooses (a matrix run);
    a server that needs ``env`` (a host folder such as ``LOCPATH``) stays on the installed
    one, since a Debian root's server does not see the host's files.
    """
    major = chosen_major()
    if major is not None and not env:
        with _major_server(major, wal_start, conf, tls) as server:
            yield server
        return
    if not (BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL 15 binaries not found in {BIN}")
    home = Path(tempfile.mkdtemp(prefix="cdc-throwaway-"))
    server_env = {"LC_ALL": "C.UTF-8", **(env or {})}
    try:
        home.chmod(0o755)
        (home / "pw").write_text(PASSWORD + "\n")
        sockdir = home / "sock"
        sockdir.mkdir()
        if _as_root():
            chown(home, OS_USER, recursive=True)
        _run_as_postgres(
            [
                str(BIN / "initdb"),
                "-D",
                str(home / "data"),
                "-U",
                "cdc",
                f"--pwfile={home / 'pw'}",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
            ],
            server_env,
        )
        if wal_start is not None:
            _run_as_postgres(
                [
                    str(BIN / "pg_resetwal"),
                    "-l",
                    wal_file_name(wal_start),
                    "-D",
                    str(home / "data"),
                ],
                server_env,
            )
        port = free_port()
        settings = dict(conf or {})
        if tls:
            settings |= _make_certificate(home / "data", _give_to_postgres)
        with open(home / "data" / "postgresql.conf", "a") as f:
            f.write(_conf_lines(port, sockdir, settings))
        server = ThrowawayServer(home, port, server_env, tls)
        server.pg_ctl("start", "-w", "-t", "60", "-l", str(server.log))
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    try:
        if wal_start is not None:
            at = server.current_lsn()
            assert at >= wal_start, f"pg_resetwal left the server at {at}, not {wal_start}"
        yield server
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def _major_server(
    major: int, wal_start: Lsn | None, conf: Mapping[str, str] | None, tls: bool = False
) -> Iterator[MajorThrowawayServer]:
    """:func:`throwaway_server` on ``major``, made with :mod:`tests.pg_majors`'s layout."""
    from tests.pg_majors import BASE_SETTINGS, HBA, _home, _layout, _runtime, _stop_quietly

    home = _home(f"cdc-throwaway-pg{major}-")
    srv: PgServer | None = None
    try:
        runtime = _runtime(major, home)
        data, sockdir = _layout(runtime, home)
        srv = PgServer(runtime, data, free_port(), sockdir, home / "server.log")
        srv.initdb(superuser="cdc", password=PASSWORD)
        if wal_start is not None:
            runtime.run("pg_resetwal", "-l", wal_file_name(wal_start), "-D", runtime.path(data))
        settings = {**BASE_SETTINGS, **(conf or {})}
        if tls:
            settings |= _make_certificate(data, srv.give)
        srv.configure(settings, HBA)
        srv.start()
        server = MajorThrowawayServer(home, srv.port, {}, tls, srv)
        if wal_start is not None:
            at = server.current_lsn()
            assert at >= wal_start, f"pg_resetwal left the server at {at}, not {wal_start}"
        yield server
    finally:
        _stop_quietly(srv)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def server_beyond_2_47() -> Iterator[ThrowawayServer]:
    """A throwaway server whose WAL position is beyond 2**47 (checked)."""
    with throwaway_server(wal_start=LSN_BEYOND_2_47) as server:
        yield server


@pytest.fixture(scope="module")
def server_near_2_63() -> Iterator[ThrowawayServer]:
    """A throwaway server 1 GiB of WAL below 2**63 (checked)."""
    with throwaway_server(wal_start=LSN_NEAR_2_63) as server:
        yield server
