"""PostgreSQL 15 from Debian's postgresql-15, run as the ``postgres`` OS user."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import ClassVar

from pgcdc.core.ports import HOST
from pgcdc.stack import common
from pgcdc.stack.service import Service

BIN = Path("/usr/lib/postgresql/15/bin")
OS_USER = "postgres"  # initdb and postgres refuse to run as root


class Postgres(Service):
    name = "postgres"
    packages: ClassVar[dict[str, str]] = {"postgresql-15": str(BIN / "postgres")}
    start_deadline_s = 60
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back sessions, checkpoint, exit

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def sockdir(self) -> Path:
        return self.home / "sock"

    def owns(self, cmdline: str) -> bool:
        return "postgres" in cmdline and str(self.data) in cmdline

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.sockdir.mkdir(exist_ok=True)
        # The postgres user must reach its folders through STACK_DIR.
        for p in (self.paths.stack, self.home):
            p.chmod(0o755)
        self.sockdir.chmod(0o700)  # local "trust" below is then only for postgres (and root)
        common.chown(self.home, OS_USER)
        common.chown(self.sockdir, OS_USER)
        common.check_reachable(OS_USER, self.home)
        if not (self.data / "PG_VERSION").exists():
            common.say(f"initdb {self.data}")
            common.run(
                [
                    BIN / "initdb",
                    "-D",
                    self.data,
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                ],
                user=OS_USER,
                cwd=self.home,
            )
            with open(self.data / "postgresql.conf", "a") as f:
                f.write("\ninclude 'stack.conf'\n")
        self._write(
            self.data / "stack.conf",
            "\n".join(
                [
                    "# Written by scripts/stack on every start; edit pgcdc/stack/postgres.py instead.",
                    f"listen_addresses = '{HOST}'",
                    f"port = {self.port}",
                    f"unix_socket_directories = '{self.sockdir}'",
                    "wal_level = logical",
                    "max_replication_slots = 20",
                    "max_wal_senders = 20",
                    "max_connections = 150",
                    "shared_buffers = 64MB",
                    "logging_collector = off",  # stderr goes to .stack/logs/postgres.log
                    "log_line_prefix = '%m [%p] %q%u@%d '",
                    "",
                ]
            ),
        )
        self._write(
            self.data / "pg_hba.conf",
            "\n".join(
                [
                    "# Written by scripts/stack. Local socket (mode 0700) for bootstrap; TCP needs a password.",
                    "local all         all                  trust",
                    f"host  all         all  {HOST}/32 scram-sha-256",
                    f"host  replication all  {HOST}/32 scram-sha-256",
                    "",
                ]
            ),
        )

    def _write(self, path: Path, text: str) -> None:
        path.write_text(text)
        common.chown(path, OS_USER)

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
        return common.spawn(
            [BIN / "postgres", "-D", self.data], log=self.log, user=OS_USER, cwd=self.home
        )

    def _psql_run(self, sql: str, *, local: bool, db: str, check: bool) -> tuple[int, str]:
        """Run one statement with psql: as postgres on the socket, or as cdc over TCP."""
        if local:
            cmd = [
                str(BIN / "psql"),
                "-h",
                str(self.sockdir),
                "-p",
                str(self.port),
                "-U",
                "postgres",
            ]
            env: dict[str, str] = {}
        else:
            cmd = [str(BIN / "psql"), "-h", HOST, "-p", str(self.port), "-U", "cdc"]
            env = {"PGPASSWORD": "cdc"}
        cmd += ["-d", db, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql]
        env["PGCONNECT_TIMEOUT"] = "3"
        proc = common.run(cmd, env=env, user=OS_USER if local else None, timeout=20, check=check)
        return proc.returncode, proc.stdout.strip()

    def _psql(self, sql: str, *, local: bool, db: str = "postgres") -> str | None:
        """Run one statement; return its unaligned output, or None if it failed."""
        rc, out = self._psql_run(sql, local=local, db=db, check=False)
        return out if rc == 0 else None

    def probe(self) -> bool:
        return self._psql("SELECT 1", local=False, db="cdc") == "1"

    def wait_ready(self) -> None:
        # The cdc role may not exist yet, so first wait on the bootstrap socket.
        common.wait_until(
            self.name,
            lambda: self._psql("SELECT 1", local=True) == "1",
            self.start_deadline_s,
            alive=lambda: self.pid() is not None,
            log=self.log,
        )
        self.after_ready()
        common.wait_until(self.name, self.probe, 10, log=self.log)

    def after_ready(self) -> None:
        if self._psql("SELECT 1 FROM pg_roles WHERE rolname = 'cdc'", local=True) != "1":
            common.say("creating role cdc")
            self._must("CREATE ROLE cdc LOGIN SUPERUSER REPLICATION PASSWORD 'cdc'")
        if self._psql("SELECT 1 FROM pg_database WHERE datname = 'cdc'", local=True) != "1":
            common.say("creating database cdc")
            self._must("CREATE DATABASE cdc OWNER cdc")

    def _must(self, sql: str) -> None:
        self._psql_run(sql, local=True, db="postgres", check=True)
