"""The stack's portable parts without servers: finding PostgreSQL's binaries, installing
packages without root, choosing services, and the secured endpoints' settings."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from pgcdc.core import ports
from pgcdc.stack import cli, common, pgbin, prereqs

pytestmark = pytest.mark.unit


def _server(bindir: Path) -> Path:
    bindir.mkdir(parents=True)
    for exe in ("postgres", "initdb"):
        (bindir / exe).write_text("#!/bin/sh\n")
    return bindir


@pytest.fixture
def no_system_postgres(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A machine whose only PostgreSQL installs are the ones a test makes under tmp_path."""
    root = tmp_path / "usr-lib-postgresql"
    root.mkdir()
    monkeypatch.setattr(pgbin, "DEBIAN_ROOT", root)
    monkeypatch.delenv("PG_BINDIR", raising=False)
    monkeypatch.setattr(pgbin.shutil, "which", lambda cmd: None)
    return root


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        (["15"], "15"),  # Debian 12
        (["17"], "17"),  # Debian 13
        (["14"], "14"),  # Ubuntu 22.04
        (["16"], "16"),  # Ubuntu 24.04
        (["14", "16"], "16"),  # several: the newest
    ],
)
def test_the_installed_debian_version_is_found(
    no_system_postgres: Path, installed: list[str], expected: str
) -> None:
    for v in installed:
        _server(no_system_postgres / v / "bin")
    assert pgbin.find() == no_system_postgres / expected / "bin"
    assert pgbin.version(no_system_postgres / expected / "bin") == int(expected)


def test_a_data_folder_runs_with_the_version_that_made_it(
    no_system_postgres: Path, tmp_path: Path
) -> None:
    for v in ("15", "17"):
        _server(no_system_postgres / v / "bin")
    data = tmp_path / "data"
    data.mkdir()
    (data / "PG_VERSION").write_text("15\n")
    assert pgbin.find(data) == no_system_postgres / "15" / "bin"


def test_a_data_folder_of_a_missing_version_says_what_to_install(
    no_system_postgres: Path, tmp_path: Path
) -> None:
    _server(no_system_postgres / "17" / "bin")
    data = tmp_path / "data"
    data.mkdir()
    (data / "PG_VERSION").write_text("15\n")
    with pytest.raises(common.StackError, match=r"PostgreSQL 15.*install postgresql-15"):
        pgbin.require(data)


def test_pg_bindir_overrides_and_is_checked(
    no_system_postgres: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _server(no_system_postgres / "16" / "bin")
    mine = _server(tmp_path / "opt" / "pg" / "bin")
    monkeypatch.setenv("PG_BINDIR", str(mine))
    assert pgbin.find() == mine
    monkeypatch.setenv("PG_BINDIR", str(tmp_path / "nowhere"))
    with pytest.raises(common.StackError, match=r"PG_BINDIR=.*holds no postgres"):
        pgbin.require()


def test_no_postgres_anywhere_names_the_package(no_system_postgres: Path) -> None:
    assert pgbin.find() is None
    assert not prereqs.present("postgres-server")
    with pytest.raises(common.StackError, match="install the postgresql package"):
        pgbin.require()


def test_postgres_on_path_is_used_when_not_debian_laid_out(
    no_system_postgres: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usr_bin = _server(tmp_path / "usr" / "bin")
    monkeypatch.setattr(
        pgbin.shutil, "which", lambda cmd: str(usr_bin / cmd) if cmd == "postgres" else None
    )
    assert pgbin.find() == usr_bin


# --- packages without root -------------------------------------------------------------------


def _not_root(monkeypatch: pytest.MonkeyPatch, *, sudo: bool, sudo_without_password: bool) -> None:
    monkeypatch.setattr(prereqs.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(prereqs, "present", lambda probe: probe != "missing-probe")
    real_which = prereqs.shutil.which
    monkeypatch.setattr(
        prereqs.shutil,
        "which",
        lambda cmd: ("/usr/bin/sudo" if sudo else None) if cmd == "sudo" else real_which(cmd),
    )

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
        assert cmd == ["sudo", "-n", "true"], f"only sudo -n true may run here, not {cmd}"
        return subprocess.CompletedProcess(cmd, 0 if sudo_without_password else 1)

    monkeypatch.setattr(prereqs.subprocess, "run", fake_run)
    monkeypatch.setattr(prereqs.sys.stdin, "isatty", lambda: False, raising=False)


def test_non_root_without_sudo_says_who_must_install_what(monkeypatch: pytest.MonkeyPatch) -> None:
    _not_root(monkeypatch, sudo=False, sudo_without_password=False)
    monkeypatch.setattr(
        prereqs.shutil, "which", lambda cmd: "/usr/bin/apt-get" if cmd == "apt-get" else None
    )
    with pytest.raises(common.StackError) as e:
        prereqs.ensure([{"redis-server": "missing-probe"}])
    assert "no sudo" in str(e.value)
    assert "apt-get install -y redis-server" in str(e.value)


def test_non_root_whose_sudo_wants_a_password_gets_the_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _not_root(monkeypatch, sudo=True, sudo_without_password=False)
    real_which = prereqs.shutil.which
    monkeypatch.setattr(
        prereqs.shutil,
        "which",
        lambda cmd: "/usr/bin/apt-get" if cmd == "apt-get" else real_which(cmd),
    )
    with pytest.raises(common.StackError, match=r"run `sudo apt-get install -y redis-server`"):
        prereqs.ensure([{"redis-server": "missing-probe"}])


def test_non_root_with_passwordless_sudo_installs_through_sudo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _not_root(monkeypatch, sudo=True, sudo_without_password=True)
    real_which = prereqs.shutil.which
    monkeypatch.setattr(
        prereqs.shutil,
        "which",
        lambda cmd: "/usr/bin/apt-get" if cmd == "apt-get" else real_which(cmd),
    )
    ran: list[list[str]] = []
    monkeypatch.setattr(prereqs.common, "run", lambda cmd, **kw: ran.append(list(cmd)))
    prereqs.ensure([{"redis-server": "missing-probe"}])
    assert [c[:2] for c in ran] == [["sudo", "-n"], ["sudo", "-n"]]
    assert ran[-1][-1] == "redis-server" and "install" in ran[-1]


def test_nothing_missing_touches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prereqs.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(prereqs.common, "run", lambda *a, **kw: pytest.fail("ran a command"))
    prereqs.ensure([{"python3": "python3"}])


# --- service choice and the secured endpoints -----------------------------------------------


def test_secured_services_start_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACK_DIR", str(tmp_path / "stack"))
    names = lambda **kw: [s.name for s in cli._services(**kw)]  # noqa: E731
    assert names(names=[]) == list(ports.SERVICES)
    assert names(names=[], secure=True) == [*ports.SERVICES, *ports.SECURE_SERVICES]
    assert names(names=["redis-secure", "kafka"]) == ["kafka", "redis-secure"]
    with pytest.raises(common.StackError, match="unknown service nope"):
        cli._services(["nope"])
    secure = {s.name: s for s in cli._services(list(ports.SECURE_SERVICES))}
    assert {n: s.port for n, s in secure.items()} == ports.SECURE_PORTS
    clash = set(ports.SECURE_PORTS.values()) & {
        *ports.PORTS.values(),
        ports.KAFKA_CONTROLLER_PORT,
        ports.OPENSEARCH_TRANSPORT_PORT,
    }
    assert not clash
    # Pidfile guards: neither secured server is taken for its plaintext sibling, or back.
    plain = {s.name: s for s in cli._services(["kafka", "redis"])}
    assert not plain["redis"].owns(
        f"redis-server {ports.HOST}:{ports.SECURE_PORTS['redis-secure']}"
    )
    assert not secure["redis-secure"].owns(f"redis-server {ports.HOST}:{ports.PORTS['redis']}")
    assert not plain["kafka"].owns(f"java kafka.Kafka {secure['kafka-secure'].config}")  # type: ignore[attr-defined]


def test_env_secure_prints_every_secured_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STACK_DIR", str(tmp_path / "stack"))
    assert cli.main(["env", "--secure"]) == 0
    env = dict(
        line.removeprefix("export ").split("=", 1) for line in capsys.readouterr().out.splitlines()
    )
    env = {k: shlex.split(v)[0] for k, v in env.items()}
    ca = tmp_path / "stack" / "tls" / "ca.crt"
    assert ca.exists()
    assert env["CDC_POSTGRES__DSN"].endswith(f"?sslmode=verify-full&sslrootcert={ca}")
    assert (
        env["CDC_KAFKA__BOOTSTRAP_SERVERS"] == f"{ports.HOST}:{ports.SECURE_PORTS['kafka-secure']}"
    )
    assert env["CDC_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["CDC_KAFKA__SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert env["CDC_KAFKA__SSL_CA_LOCATION"] == str(ca)
    assert env["CDC_KAFKA__SASL_PASSWORD"].startswith("kpw-")
    assert env["CDC_REDIS__URL"].startswith("rediss://cdc:rpw-")
    assert env["CDC_REDIS__URL"].endswith(f"@{ports.HOST}:{ports.SECURE_PORTS['redis-secure']}/0")
    # The private keys and the passwords are readable by their owner only.
    for private in ("ca.key", "server.key", "client.key", "server.p12", "credentials.json"):
        assert (ca.parent / private).stat().st_mode & 0o077 == 0, private
    # A second call reuses the same CA and passwords.
    before = ca.read_bytes()
    assert cli.main(["env", "--secure"]) == 0
    again = dict(
        line.removeprefix("export ").split("=", 1) for line in capsys.readouterr().out.splitlines()
    )
    assert {k: shlex.split(v)[0] for k, v in again.items()} == env
    assert ca.read_bytes() == before
