"""PostgreSQL for the stack: the distribution's own, or another major from a Debian root; TLS.

Which major runs is chosen with ``scripts/stack up --postgres N`` (and ``--port``) and kept in
``STACK_DIR/run/postgres.json`` until chosen again; without a choice it is the installed one
(Debian 12: 15), exactly as before. A major the machine has installed runs from its binaries;
one it lacks (17 from Debian 13, 18 from Debian testing) runs from a Debian root
(:mod:`pgcdc.stack.pgroot`) with chroot. Either way the server listens on the same port with
the same roles, so everything written against the stack runs unchanged.

The server runs as the ``postgres`` OS user when the stack runs as root (initdb and postgres
refuse root), else as the user running the stack. TLS is on, with the stack's own CA
(:mod:`pgcdc.stack.tls`), so ``sslmode=verify-full`` works; plaintext still does too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pgcdc.core import local_stack
from pgcdc.core.ports import HOST, PORTS
from pgcdc.stack import common, pgbin, pgroot, tls
from pgcdc.stack.pgserver import NativeRuntime, PgServer, RootRuntime, Runtime
from pgcdc.stack.service import Service


def server_user() -> str | None:
    """The OS user that runs the server: ``postgres`` under root, else ourselves (None)."""
    return "postgres" if os.geteuid() == 0 else None


@dataclass(frozen=True)
class Choice:
    """The major (None: the installed one) and the port the stack's PostgreSQL runs with."""

    major: int | None = None
    port: int = PORTS["postgres"]


def choice_file(paths: common.Paths) -> Path:
    return paths.run / "postgres.json"


def load_choice(paths: common.Paths) -> Choice:
    try:
        raw = json.loads(choice_file(paths).read_text())
        return Choice(raw.get("major"), int(raw.get("port", PORTS["postgres"])))
    except (OSError, ValueError, TypeError):
        return Choice()


def save_choice(paths: common.Paths, choice: Choice) -> None:
    paths.run.mkdir(parents=True, exist_ok=True)
    choice_file(paths).write_text(json.dumps({"major": choice.major, "port": choice.port}) + "\n")


def _data_major(data: Path) -> int | None:
    try:
        return int((data / "PG_VERSION").read_text().strip())
    except (OSError, ValueError):
        return None


class Postgres(Service):
    name = "postgres"
    packages: ClassVar[dict[str, str]] = {pgbin.PACKAGE: "postgres-server"}
    start_deadline_s = 60
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back sessions, checkpoint, exit

    def __init__(self, paths: common.Paths) -> None:
        super().__init__(paths)
        self.choice = load_choice(paths)
        self._runtime: Runtime | None = None
        major = self.choice.major
        self._in_root = major is not None and major not in pgbin.installed()

    # ------------------------------------------------------------------ layout

    @property
    def port(self) -> int:
        return self.choice.port

    @property
    def in_root(self) -> bool:
        """Whether the chosen major runs from a Debian root (the machine lacks it)."""
        return self._in_root

    @property
    def home(self) -> Path:
        """``STACK_DIR/postgres`` for the installed major (as always), ``postgres-<N>`` for
        another one."""
        legacy = self.paths.stack / self.name
        major = self.choice.major
        if major is None or (not self.in_root and _data_major(legacy / "data") in (None, major)):
            return legacy
        return self.paths.stack / f"{self.name}-{major}"

    @property
    def root(self) -> Path:
        """The server's own instance of its Debian root (only when :attr:`in_root`)."""
        return self.home / "root"

    @property
    def data(self) -> Path:
        if self.in_root:
            return self.root / "var" / "lib" / "postgresql" / "data"
        return self.home / "data"

    @property
    def sockdir(self) -> Path:
        return (self.root / "run" / "postgresql") if self.in_root else self.home / "sock"

    @property
    def tls_dir(self) -> Path:
        return (
            (self.root / "var" / "lib" / "postgresql" / "tls")
            if self.in_root
            else (self.home / "tls")
        )

    @property
    def bin(self) -> Path:
        """The installed server's binaries: the version that made the data folder, else the
        chosen one, else the newest."""
        major = self.choice.major
        if major is not None and _data_major(self.data) is None:
            found = pgbin.installed().get(major)
            if found is not None:
                return found
        return pgbin.require(self.data)

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            if self.in_root:
                assert self.choice.major is not None
                root = pgroot.ensure(self.paths, self.choice.major)
                pgroot.instance(root, self.root)
                self._runtime = RootRuntime(self.root, root.major, root.version)
            else:
                self._runtime = NativeRuntime(self.bin)
        return self._runtime

    def required_packages(self) -> dict[str, str]:
        if self.in_root:
            # A root is unpacked with dpkg-deb and checked with gpgv against Debian's keys.
            return {"gpgv": "gpgv", "debian-archive-keyring": str(pgroot.KEYRING)}
        return dict(self.packages)

    def server(self) -> PgServer:
        return PgServer(
            self.runtime,
            self.data,
            self.port,
            self.sockdir,
            self.log,
            superuser="postgres",
            conf_name="stack.conf",
        )

    # ------------------------------------------------------------------ process

    def owns(self, cmdline: str) -> bool:
        if self.in_root:
            return "postgres" in cmdline and "/var/lib/postgresql/data" in cmdline
        return "postgres" in cmdline and str(self.data) in cmdline

    def pid(self) -> int | None:
        pid = super().pid()
        if pid is not None and self.in_root and pgroot.root_of_process(pid) != self.root:
            return None  # another root's server (another stack's)
        return pid

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        # The postgres user must reach its folders through STACK_DIR.
        for p in (self.paths.stack, self.home):
            p.chmod(0o755)
        runtime = self.runtime
        user = server_user()
        self.sockdir.mkdir(parents=True, exist_ok=True)
        self.sockdir.chmod(0o700)  # local "trust" below is then only for the server's user
        runtime.give(self.home)
        runtime.give(self.sockdir)
        if user is not None and not self.in_root:
            common.check_reachable(user, self.home)
        server = self.server()
        if not (self.data / "PG_VERSION").exists():
            common.say(f"initdb {self.data} ({runtime.describe()})")
            server.initdb(superuser="postgres", sync=True)
        self._install_certificates()
        server.configure(self._settings(), self._hba())

    def _settings(self) -> dict[str, str]:
        settings = {
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "max_connections": "150",
            "shared_buffers": "64MB",
            "logging_collector": "off",  # stderr goes to .stack/logs/postgres.log
            "log_line_prefix": "'%m [%p] %q%u@%d '",
            # TLS beside plaintext: pg_hba's "host" lines match both.
            "ssl": "on",
            "ssl_cert_file": f"'{self.runtime.path(self.tls_dir / 'server.crt')}'",
            "ssl_key_file": f"'{self.runtime.path(self.tls_dir / 'server.key')}'",
        }
        if self.in_root:
            settings["jit"] = "off"  # a root has no LLVM
        return settings

    @staticmethod
    def _hba() -> list[str]:
        return [
            "# Written by scripts/stack. Local socket (mode 0700) for bootstrap; TCP needs a password.",
            "local all         all                  trust",
            f"host  all         all  {HOST}/32 scram-sha-256",
            f"host  replication all  {HOST}/32 scram-sha-256",
        ]

    def _install_certificates(self) -> None:
        """Copy the stack's server certificate and key where the server's user owns them
        (PostgreSQL refuses a key that others may read)."""
        pki = tls.ensure(self.paths)
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        for src, mode in ((pki.server_cert, 0o644), (pki.server_key, 0o600)):
            dest = self.tls_dir / src.name
            shutil.copyfile(src, dest)
            dest.chmod(mode)
        self.runtime.give(self.tls_dir, recursive=True)

    def server_processes(self) -> list[int]:
        """Every process of our cluster, orphans included: they all run inside the data dir."""
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if Path(os.readlink(proc / "cwd")) == self.data:
                        found.append(int(proc.name))
                except OSError:
                    continue
        return [pid for pid in found if common.pid_alive(pid)]

    def _kill_leftovers(self) -> None:
        """Children that outlived a killed postmaster hold its shared memory; end them."""
        leftovers = self.server_processes()
        if leftovers:
            common.say(f"postgres: ending leftover server processes {leftovers}")
            for pid in leftovers:
                common.terminate(pid, sig=signal.SIGQUIT, grace_s=5)

    def stop(self) -> bool:
        pid = self.pid()
        if pid is not None:
            common.say(f"stopping postgres (pid {pid})")
            # Fast shutdown can wait forever on a walsender whose client stopped reading;
            # then immediate shutdown (SIGQUIT), as pg_ctl -m immediate does.
            common.terminate(pid, sig=signal.SIGINT, grace_s=15, escalate=signal.SIGQUIT)
        self._kill_leftovers()
        self.pidfile.unlink(missing_ok=True)
        return pid is not None

    def launch(self) -> int:
        self._kill_leftovers()
        return self.server().launch()

    def status(self) -> tuple[bool, str]:
        up, line = super().status()
        if up:
            version = self._psql("SHOW server_version", local=True) or "?"
            where = (
                f"Debian {pgroot.SUITES.get(self.runtime.major, '?')} root"
                if self.in_root
                else "installed"
            )
            line += f"  PostgreSQL {version} ({where})"
        return up, line

    # ------------------------------------------------------------------ SQL

    def _psql_run(self, sql: str, *, local: bool, db: str, check: bool) -> tuple[int, str]:
        """Run one statement with psql: as postgres on the socket, or as cdc over TCP."""
        if local:
            target = ["-h", self.runtime.path(self.sockdir), "-p", str(self.port), "-U", "postgres"]
            target += ["-d", db]
        else:
            # The stack's fixed local password; a conninfo keeps it out of the host's env.
            target = ["-d", f"host={HOST} port={self.port} user=cdc password=cdc dbname={db}"]
        args = [*target, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql]
        if self.in_root or local:
            proc = self.runtime.run("psql", *args, check=check, timeout=20)
        else:
            proc = common.run(
                [str(self._psql_exe()), *args],
                env={"PGCONNECT_TIMEOUT": "3"},
                timeout=20,
                check=check,
            )
        return proc.returncode, proc.stdout.strip()

    def _psql_exe(self) -> Path:
        """psql of the server's version if it is there (Debian ships it beside postgres)."""
        beside = self.bin / "psql"
        return beside if beside.exists() else Path(shutil.which("psql") or "psql")

    def _psql(self, sql: str, *, local: bool, db: str = "postgres") -> str | None:
        """Run one statement; return its unaligned output, or None if it failed."""
        try:
            rc, out = self._psql_run(sql, local=local, db=db, check=False)
        except common.StackError:
            return None
        return out if rc == 0 else None

    def probe(self) -> bool:
        return self._psql("SELECT 1", local=False, db="cdc") == "1"

    def wait_started(self) -> None:
        # The cdc role may not exist yet, so wait on the bootstrap socket.
        common.wait_until(
            self.name,
            lambda: self._psql("SELECT 1", local=True) == "1",
            self.start_deadline_s,
            alive=self.launched_alive,
            log=self.log,
        )

    def wait_ready(self) -> None:
        super().wait_ready()  # ends with after_ready(), which creates the cdc role
        common.wait_until(self.name, self.probe, 10, log=self.log)

    def after_ready(self) -> None:
        if self._psql("SELECT 1 FROM pg_roles WHERE rolname = 'cdc'", local=True) != "1":
            common.say("creating role cdc")
            self._must("CREATE ROLE cdc LOGIN SUPERUSER REPLICATION PASSWORD 'cdc'")
        if self._psql("SELECT 1 FROM pg_database WHERE datname = 'cdc'", local=True) != "1":
            common.say("creating database cdc")
            self._must("CREATE DATABASE cdc OWNER cdc")
        self._ensure_tls()
        # The key that signs signals to the readers of this server (pgcdc.core.local_stack).
        secret = self.paths.stack / local_stack.SIGNAL_SECRET_FILE
        if not secret.exists():
            common.say(f"writing the signal key of the stack's readers to {secret}")
            local_stack.ensure_secret(secret)

    def _ensure_tls(self) -> None:
        """Turn TLS on in a server started before the stack had it: ssl is reloadable, so
        the server keeps running (and every session stays connected)."""
        if self._psql("SHOW ssl", local=True) == "on":
            return
        common.say("postgres: turning TLS on (configuration reload, no restart)")
        self._install_certificates()
        self.server().configure(self._settings())
        self._must("SELECT pg_reload_conf()")
        common.wait_until(
            "postgres TLS", lambda: self._psql("SHOW ssl", local=True) == "on", 15, log=self.log
        )

    def _must(self, sql: str) -> None:
        self._psql_run(sql, local=True, db="postgres", check=True)
