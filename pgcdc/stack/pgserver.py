"""One PostgreSQL server of any major: the host's binaries, or a Debian root's (:mod:`pgroot`).

:class:`Runtime` says where the programs run: :class:`NativeRuntime` runs the installed
binaries (as the ``postgres`` OS user under root, since initdb and postgres refuse root),
:class:`RootRuntime` runs a root's binaries through ``chroot`` as the root's ``postgres``
user. :class:`PgServer` is a data folder, a port and a log on top of one: initdb, configure,
start, stop, SQL through the local socket, a base backup for a standby, promotion. The stack's
``postgres`` service and the tests' servers of other majors are both made of these.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pgcdc.core.ports import HOST
from pgcdc.stack import common, pgbin, pgroot


class Runtime:
    """Where a server's programs run."""

    major: int

    def path(self, host: Path) -> str:
        """``host`` as the server's programs see it."""
        raise NotImplementedError

    def argv(self, program: str, *args: str | os.PathLike[str]) -> list[str]:
        """The command line that runs ``program`` (a PostgreSQL binary) with ``args``."""
        raise NotImplementedError

    def run(
        self, program: str, *args: str | os.PathLike[str], check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def spawn(self, program: str, *args: str | os.PathLike[str], log: Path) -> int:
        raise NotImplementedError

    def server_ids(self) -> tuple[int, int] | None:
        """uid and gid the server runs as (None: this process's own)."""
        raise NotImplementedError

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` runs in this runtime (a root's processes run inside it)."""
        return True

    def describe(self) -> str:
        raise NotImplementedError

    def give(self, host: Path, *, recursive: bool = False) -> None:
        """Hand ``host`` to the server's user."""
        ids = self.server_ids()
        if ids is None:
            return
        targets = [host]
        if recursive:
            targets += [Path(r) / n for r, ds, fs in os.walk(host) for n in ds + fs]
        for t in targets:
            os.lchown(t, *ids)


@dataclass
class NativeRuntime(Runtime):
    """The machine's own PostgreSQL binaries."""

    bindir: Path
    major: int = 0

    def __post_init__(self) -> None:
        self.major = self.major or pgbin.version(self.bindir) or 0

    @staticmethod
    def user() -> str | None:
        return "postgres" if os.geteuid() == 0 else None

    def path(self, host: Path) -> str:
        return str(host)

    def argv(self, program: str, *args: str | os.PathLike[str]) -> list[str]:
        return [str(self.bindir / program), *map(str, args)]

    def run(
        self, program: str, *args: str | os.PathLike[str], check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return common.run(
            self.argv(program, *args),
            user=self.user(),
            env={"LC_ALL": "C.UTF-8"},
            cwd=Path("/"),
            timeout=timeout,
            check=check,
        )

    def spawn(self, program: str, *args: str | os.PathLike[str], log: Path) -> int:
        return common.spawn(
            self.argv(program, *args),
            log=log,
            user=self.user(),
            env={"LC_ALL": "C.UTF-8"},
            cwd=Path("/"),
        )

    def server_ids(self) -> tuple[int, int] | None:
        user = self.user()
        if user is None:
            return None
        entry = pwd.getpwnam(user)
        return entry.pw_uid, entry.pw_gid

    def owns(self, pid: int) -> bool:
        return pgroot.root_of_process(pid) == Path("/")

    def describe(self) -> str:
        return f"PostgreSQL {self.major} ({self.bindir})"


@dataclass
class RootRuntime(Runtime):
    """A Debian root's binaries, run with chroot; ``root`` is a server's own instance of it."""

    root: Path
    major: int = 0
    version: str = ""

    def __post_init__(self) -> None:
        self.major = self.major or pgroot.major_of(self.root)

    def path(self, host: Path) -> str:
        try:
            return "/" + str(host.resolve().relative_to(self.root.resolve()))
        except ValueError as e:
            raise common.StackError(f"{host} is outside the root {self.root}") from e

    def argv(self, program: str, *args: str | os.PathLike[str]) -> list[str]:
        return [f"/usr/lib/postgresql/{self.major}/bin/{program}", *map(str, args)]

    def run(
        self, program: str, *args: str | os.PathLike[str], check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return pgroot.run_in(self.root, self.argv(program, *args), check=check, timeout=timeout)

    def spawn(self, program: str, *args: str | os.PathLike[str], log: Path) -> int:
        return pgroot.spawn_in(self.root, self.argv(program, *args), log=log)

    def server_ids(self) -> tuple[int, int] | None:
        return pgroot.server_ids(self.root)

    def owns(self, pid: int) -> bool:
        where = pgroot.root_of_process(pid)
        return where is not None and where.resolve() == self.root.resolve()

    def describe(self) -> str:
        suite = pgroot.SUITES.get(self.major, "?")
        return f"PostgreSQL {self.major} (Debian {suite} root {self.root})"


def runtime_for(paths: common.Paths, major: int | None, instance: Path | None) -> Runtime:
    """The installed binaries of ``major`` (None: the newest installed) if the machine has
    them, else a root's, instantiated at ``instance`` (built first if needed)."""
    installed = pgbin.installed()
    if major is None:
        found = pgbin.require()
        return NativeRuntime(found)
    if major in installed:
        return NativeRuntime(installed[major], major)
    if instance is None:
        raise common.StackError(f"PostgreSQL {major} needs a root instance folder")
    root = pgroot.ensure(paths, major)
    return RootRuntime(pgroot.instance(root, instance), major, root.version)


@dataclass
class PgServer:
    """A data folder, a port and a log, run by a :class:`Runtime`."""

    runtime: Runtime
    data: Path  # host paths from here on
    port: int
    sockdir: Path
    log: Path
    pid: int | None = None
    settings: dict[str, str] = field(default_factory=dict)
    # The role psql uses on the local socket (trust): initdb's -U.
    superuser: str = "postgres"
    # The file of our settings, included by postgresql.conf.
    conf_name: str = "pgcdc.conf"

    # ------------------------------------------------------------------ set up

    def initdb(self, *, superuser: str, password: str | None = None, sync: bool = False) -> None:
        """A new cluster (UTF8, C.UTF-8); ``password`` for ``superuser`` over TCP."""
        self.superuser = superuser
        parent = self.data.parent
        parent.mkdir(parents=True, exist_ok=True)
        self.runtime.give(parent)
        args: list[str] = [
            "-D",
            self.runtime.path(self.data),
            "-U",
            superuser,
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
        ]
        pwfile = parent / ".pw"
        if password is not None:
            pwfile.write_text(password + "\n")
            self.runtime.give(pwfile)
            args.append(f"--pwfile={self.runtime.path(pwfile)}")
        if not sync:
            args.append("--no-sync")
        try:
            self.runtime.run("initdb", *args, timeout=180)
        finally:
            pwfile.unlink(missing_ok=True)
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"\ninclude '{self.conf_name}'\n")
        self.give(self.data / "postgresql.conf")

    def give(self, path: Path) -> None:
        self.runtime.give(path)

    def write(self, path: Path, text: str, mode: int = 0o600) -> None:
        path.write_text(text)
        path.chmod(mode)
        self.give(path)

    def configure(self, settings: Mapping[str, str], hba: Sequence[str] | None = None) -> None:
        """Write the server's settings (:attr:`conf_name`, included by postgresql.conf) and,
        given, pg_hba.conf. Values are written as given (quote strings yourself)."""
        self.sockdir.mkdir(parents=True, exist_ok=True)
        self.sockdir.chmod(0o700)  # local "trust" is then only for the server's user
        self.give(self.sockdir)
        conf = {
            "listen_addresses": f"'{HOST}'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.runtime.path(self.sockdir)}'",
            **self.settings,
            **settings,
        }
        self.settings = {k: v for k, v in conf.items()}
        self.write(
            self.data / self.conf_name,
            "# Written by pgcdc.stack.pgserver\n"
            + "".join(f"{k} = {v}\n" for k, v in conf.items()),
        )
        if hba is not None:
            self.write(self.data / "pg_hba.conf", "\n".join(hba) + "\n")

    # ------------------------------------------------------------------ run

    def launch(self) -> int:
        """Start the postmaster detached; returns its pid."""
        self.pid = self.runtime.spawn("postgres", "-D", self.runtime.path(self.data), log=self.log)
        return self.pid

    def alive(self) -> bool:
        return self.pid is not None and common.pid_alive(self.pid)

    def start(self, deadline_s: float = 60) -> None:
        """Launch and wait until it accepts connections (a standby: read-only ones)."""
        self.launch()
        common.wait_until(
            f"PostgreSQL {self.runtime.major} on port {self.port}",
            self.ready,
            deadline_s,
            alive=self.alive,
            log=self.log,
        )

    def ready(self) -> bool:
        return self.query("SELECT 1", check=False) == "1"

    def stop(self, *, immediate: bool = False) -> None:
        """Fast shutdown (immediate after 15 s: a walsender whose client stopped reading can
        hold a fast one for ever); ``immediate`` kills it at once, like a crash."""
        if self.pid is None:
            return
        if immediate:
            common.terminate(self.pid, sig=signal.SIGQUIT, grace_s=15)
        else:
            common.terminate(self.pid, sig=signal.SIGINT, grace_s=15, escalate=signal.SIGQUIT)
        self.pid = None

    # ------------------------------------------------------------------ use

    def query(
        self, sql: str, *, db: str = "postgres", user: str | None = None, check: bool = True
    ) -> str | None:
        """Run one statement with psql on the local socket; its unaligned output (None if
        it failed and not ``check``)."""
        proc = self.runtime.run(
            "psql",
            "-h",
            self.runtime.path(self.sockdir),
            "-p",
            str(self.port),
            "-U",
            user or self.superuser,
            "-d",
            db,
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
            check=check,
            timeout=60,
        )
        return proc.stdout.strip() if proc.returncode == 0 else None

    def dsn(self, db: str, user: str = "cdc", password: str = "cdc") -> str:
        return f"postgresql://{user}:{password}@{HOST}:{self.port}/{db}"

    def basebackup_from(
        self, primary_port: int, *, user: str, password: str, slot: str | None, dbname: str
    ) -> None:
        """Make this (not yet initialised) server a streaming standby of the server on
        ``primary_port``: pg_basebackup -R, so ``primary_conninfo`` (with ``dbname``, which
        slot synchronization needs) and ``standby.signal`` are written for it."""
        parent = self.data.parent
        parent.mkdir(parents=True, exist_ok=True)
        self.runtime.give(parent)
        conninfo = (
            f"host={HOST} port={primary_port} user={user} password={password} dbname={dbname}"
        )
        args: list[str] = [
            "-D",
            self.runtime.path(self.data),
            "-d",
            conninfo,
            "-X",
            "stream",
            "-R",
            "--no-sync",
            "-c",
            "fast",
        ]
        if slot is not None:
            args += ["-S", slot]
        self.runtime.run("pg_basebackup", *args, timeout=300)

    def promote(self, deadline_s: float = 60) -> None:
        """Promote a standby and wait until it accepts writes."""
        self.query("SELECT pg_promote(wait => true, wait_seconds => 60)")
        end = time.monotonic() + deadline_s
        while self.query("SELECT pg_is_in_recovery()") != "f":
            if time.monotonic() > end:
                raise common.StackError(f"server on port {self.port} did not leave recovery")
            time.sleep(0.1)
