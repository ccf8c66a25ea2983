"""PostgreSQL from the distribution's packages (any installed version), with TLS.

Run as the ``postgres`` OS user when the stack runs as root (initdb and postgres refuse
root), else as the user running the stack. TLS is on, with the stack's own CA
(:mod:`pgcdc.stack.tls`), so ``sslmode=verify-full`` works; plaintext still does too.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import ClassVar

from pgcdc.core.ports import HOST
from pgcdc.stack import common, pgbin, tls
from pgcdc.stack.service import Service


def server_user() -> str | None:
    """The OS user that runs the server: ``postgres`` under root, else ourselves (None)."""
    return "postgres" if os.geteuid() == 0 else None


class Postgres(Service):
    name = "postgres"
    packages: ClassVar[dict[str, str]] = {pgbin.PACKAGE: "postgres-server"}
    start_deadline_s = 60
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back sessions, checkpoint, exit

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def sockdir(self) -> Path:
        return self.home / "sock"

    @property
    def tls_dir(self) -> Path:
        return self.home / "tls"

    @property
    def bin(self) -> Path:
        """The server's binaries: the version that made the data folder, else the newest."""
        return pgbin.require(self.data)

    def owns(self, cmdline: str) -> bool:
        return "postgres" in cmdline and str(self.data) in cmdline

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.sockdir.mkdir(exist_ok=True)
        # The postgres user must reach its folders through STACK_DIR.
        for p in (self.paths.stack, self.home):
            p.chmod(0o755)
        self.sockdir.chmod(0o700)  # local "trust" below is then only for the server's user
        user = server_user()
        if user is not None:
            common.chown(self.home, user)
            common.chown(self.sockdir, user)
            common.check_reachable(user, self.home)
        if not (self.data / "PG_VERSION").exists():
            common.say(f"initdb {self.data} (PostgreSQL {pgbin.version(self.bin)}, {self.bin})")
            common.run(
                [
                    self.bin / "initdb",
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
                user=user,
                cwd=self.home,
            )
            with open(self.data / "postgresql.conf", "a") as f:
                f.write("\ninclude 'stack.conf'\n")
        self._install_certificates()
        self._write(self.data / "stack.conf", self._config())
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

    def _config(self) -> str:
        return "\n".join(
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
                # TLS beside plaintext: pg_hba's "host" lines match both.
                "ssl = on",
                f"ssl_cert_file = '{self.tls_dir / 'server.crt'}'",
                f"ssl_key_file = '{self.tls_dir / 'server.key'}'",
                "",
            ]
        )

    def _install_certificates(self) -> None:
        """Copy the stack's server certificate and key where the server's user owns them
        (PostgreSQL refuses a key that others may read)."""
        pki = tls.ensure(self.paths)
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        for src, mode in ((pki.server_cert, 0o644), (pki.server_key, 0o600)):
            dest = self.tls_dir / src.name
            shutil.copyfile(src, dest)
            dest.chmod(mode)
        user = server_user()
        if user is not None:
            common.chown(self.tls_dir, user, recursive=True)

    def _write(self, path: Path, text: str) -> None:
        path.write_text(text)
        user = server_user()
        if user is not None:
            common.chown(path, user)

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
            [self.bin / "postgres", "-D", self.data],
            log=self.log,
            user=server_user(),
            cwd=self.home,
        )

    def _psql_run(self, sql: str, *, local: bool, db: str, check: bool) -> tuple[int, str]:
        """Run one statement with psql: as postgres on the socket, or as cdc over TCP."""
        if local:
            cmd = [
                str(self._psql_exe()),
                "-h",
                str(self.sockdir),
                "-p",
                str(self.port),
                "-U",
                "postgres",
            ]
            env: dict[str, str] = {}
        else:
            cmd = [str(self._psql_exe()), "-h", HOST, "-p", str(self.port), "-U", "cdc"]
            env = {"PGPASSWORD": "cdc"}
        cmd += ["-d", db, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql]
        env["PGCONNECT_TIMEOUT"] = "3"
        proc = common.run(
            cmd, env=env, user=server_user() if local else None, timeout=20, check=check
        )
        return proc.returncode, proc.stdout.strip()

    def _psql_exe(self) -> Path:
        """psql of the server's version if it is there (Debian ships it beside postgres)."""
        beside = self.bin / "psql"
        return beside if beside.exists() else Path(shutil.which("psql") or "psql")

    def _psql(self, sql: str, *, local: bool, db: str = "postgres") -> str | None:
        """Run one statement; return its unaligned output, or None if it failed."""
        rc, out = self._psql_run(sql, local=local, db=db, check=False)
        return out if rc == 0 else None

    def probe(self) -> bool:
        return self._psql("SELECT 1", local=False, db="cdc") == "1"

    def wait_started(self) -> None:
        # The cdc role may not exist yet, so wait on the bootstrap socket.
        common.wait_until(
            self.name,
            lambda: self._psql("SELECT 1", local=True) == "1",
            self.start_deadline_s,
            alive=lambda: self.pid() is not None,
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

    def _ensure_tls(self) -> None:
        """Turn TLS on in a server started before the stack had it: ssl is reloadable, so
        the server keeps running (and every session stays connected)."""
        if self._psql("SHOW ssl", local=True) == "on":
            return
        common.say("postgres: turning TLS on (configuration reload, no restart)")
        self._install_certificates()
        self._write(self.data / "stack.conf", self._config())
        self._must("SELECT pg_reload_conf()")
        common.wait_until(
            "postgres TLS", lambda: self._psql("SHOW ssl", local=True) == "on", 15, log=self.log
        )

    def _must(self, sql: str) -> None:
        self._psql_run(sql, local=True, db="postgres", check=True)
