"""docker-compose.yml publishes the same services, host ports and versions as scripts/stack."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _stacklib(module: str) -> ModuleType:
    """The stack's ``<module>``: ports live in the kernel, the rest in ``pgcdc.stack``."""
    return importlib.import_module(
        "pgcdc.core.ports" if module == "ports" else f"pgcdc.stack.{module}"
    )


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with open(ROOT / "docker-compose.yml") as f:
        loaded = yaml.safe_load(f)
    assert isinstance(loaded, dict)
    return loaded


def _published(service: dict[str, Any]) -> dict[int, tuple[str, int]]:
    """Host port -> (host ip, container port) for the short "ip:host:container" syntax."""
    out: dict[int, tuple[str, int]] = {}
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        assert len(parts) == 3, f"publish {spec!r} as ip:host:container so it stays on 127.0.0.1"
        ip, host, container = parts
        out[int(host)] = (ip, int(container))
    return out


def test_every_native_service_is_in_compose(compose: dict[str, Any]) -> None:
    ports = _stacklib("ports")
    assert set(ports.SERVICES) <= set(compose["services"])
    assert set(ports.PORTS) == set(ports.SERVICES)


@pytest.mark.parametrize("name", ["postgres", "redis", "kafka", "opensearch"])
def test_host_port_matches_native_stack(compose: dict[str, Any], name: str) -> None:
    ports = _stacklib("ports")
    published = _published(compose["services"][name])
    assert ports.PORTS[name] in published, f"{name} must publish host port {ports.PORTS[name]}"
    assert published[ports.PORTS[name]][0] == ports.HOST


def test_env_urls_use_the_published_ports(compose: dict[str, Any]) -> None:
    env = _stacklib("ports").env_vars()
    hosts = {
        "CDC_POSTGRES__DSN": "postgres",
        "CDC_KAFKA__BOOTSTRAP_SERVERS": "kafka",
        "CDC_REDIS__URL": "redis",
        "CDC_SEARCH__URL": "opensearch",
    }
    for var, service in hosts.items():
        port = next(iter(_published(compose["services"][service])))
        assert f"127.0.0.1:{port}" in env[var], (var, env[var])


def test_kafka_advertises_the_host_listener(compose: dict[str, Any]) -> None:
    env = compose["services"]["kafka"]["environment"]
    bootstrap = _stacklib("ports").env_vars()["CDC_KAFKA__BOOTSTRAP_SERVERS"]
    assert f"//{bootstrap}" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert str(env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]) == "false"


def test_postgres_has_logical_replication(compose: dict[str, Any]) -> None:
    svc = compose["services"]["postgres"]
    command = " ".join(svc["command"])
    assert "wal_level=logical" in command
    assert "max_replication_slots=10" in command and "max_wal_senders=10" in command
    assert svc["image"] == "postgres:15"
    assert svc["environment"] == {
        "POSTGRES_USER": "cdc",
        "POSTGRES_PASSWORD": "cdc",
        "POSTGRES_DB": "cdc",
    }


def test_images_match_native_versions(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["kafka"]["image"] == f"apache/kafka:{_stacklib('kafka').KAFKA_VERSION}"
    assert services["opensearch"]["image"] == (
        f"opensearchproject/opensearch:{_stacklib('opensearch').VERSION}"
    )
    assert services["opensearch"]["environment"]["DISABLE_SECURITY_PLUGIN"] == "true"


def test_pipeline_services_run_the_reader_and_both_jobs(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["reader"]["command"] == ["cdc", "run"]
    assert services["search-sync"]["command"][-1] == "spark_jobs/search_sync.py"
    assert services["cache-sync"]["command"][-1] == "spark_jobs/cache_sync.py"
    for name in ("reader", "search-sync", "cache-sync"):
        env = services[name]["environment"]
        # Inside the compose network the services are reached by name, not host ports.
        assert env["CDC_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
        assert "@postgres:5432/" in env["CDC_POSTGRES__DSN"]
        assert "kafka" in services[name]["depends_on"]
