"""The stack's schema registry: started only when asked for, configured as Confluent's
defaults, its schemas kept on disk, basic auth only when given users. The server itself runs
in ``tests/integration/registry``."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcdc.core import ports
from pgcdc.stack import cli, common
from pgcdc.stack.registry import Registry

pytestmark = pytest.mark.unit


def _paths(tmp_path: Path) -> common.Paths:
    return common.Paths(stack=tmp_path / "stack", cache=tmp_path / "cache")


def _settings(registry: Registry) -> dict[str, str]:
    return dict(
        option[2:].split("=", 1) for option in registry.java_options() if option.startswith("-D")
    )


def test_the_registry_starts_only_when_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACK_DIR", str(tmp_path))
    assert "registry" not in {s.name for s in cli._services([])}
    assert [s.name for s in cli._services([], registry=True)] == [*ports.SERVICES, "registry"]
    assert [s.name for s in cli._services(["kafka"], registry=True)] == ["kafka", "registry"]
    assert [type(s) for s in cli._services(["registry"])] == [Registry]


def test_its_ports_clash_with_no_other_server() -> None:
    ours = [*ports.OPTIONAL_PORTS.values(), ports.REGISTRY_MANAGEMENT_PORT]
    others = [p for p in ports.ALL_PORTS if p not in ours]
    assert len(set(ports.ALL_PORTS)) == len(ports.ALL_PORTS)
    assert not set(ours) & set(others)


def test_confluent_defaults_on_the_stack_ports_and_schemas_on_disk(tmp_path: Path) -> None:
    registry = Registry(_paths(tmp_path))
    settings = _settings(registry)
    assert settings["quarkus.http.host"] == settings["quarkus.management.host"] == ports.HOST
    assert settings["quarkus.http.port"] == str(ports.OPTIONAL_PORTS["registry"])
    assert settings["quarkus.management.port"] == str(ports.REGISTRY_MANAGEMENT_PORT)
    assert settings["apicurio.rules.global.compatibility"] == "BACKWARD"
    # A file under .stack/: schemas outlive a restart, as the Kafka records naming them do.
    assert (
        settings["apicurio.datasource.url"]
        == f"jdbc:h2:file:{tmp_path}/stack/registry/data/registry"
    )
    assert not any("auth" in key or "security" in key for key in settings)
    assert registry.url == ports.REGISTRY_URL
    assert "-Xmx512m" in registry.java_options()


def test_users_turn_basic_auth_on(tmp_path: Path) -> None:
    registry = Registry(_paths(tmp_path), port=40001, management_port=40002, users={"u": "pw"})
    settings = _settings(registry)
    assert settings["quarkus.http.auth.basic"] == "true"
    assert settings["quarkus.security.users.embedded.users.u"] == "pw"
    assert registry.url == f"http://{ports.HOST}:40001/apis/ccompat/v7"


def test_it_owns_only_the_registry_on_its_own_port(tmp_path: Path) -> None:
    registry = Registry(_paths(tmp_path))
    mine = " ".join(["java", *registry.java_options(), "-jar", "/c/quarkus-run.jar", ""])
    assert registry.owns(mine)
    other = Registry(_paths(tmp_path), port=18091, management_port=18092)
    assert not other.owns(mine)
    assert not registry.owns("java -Dquarkus.http.port=18081 -jar debezium-server.jar ")


def test_env_registry_adds_the_avro_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["env", "--registry"]) == 0
    out = capsys.readouterr().out
    assert "export CDC_SCHEMA__VALUE_FORMAT=avro\n" in out
    assert f"export CDC_SCHEMA__REGISTRY_URL={ports.REGISTRY_URL}\n" in out
    assert cli.main(["env"]) == 0
    assert "CDC_SCHEMA__" not in capsys.readouterr().out
