"""docker-compose.yml publishes the same services, host ports and settings as scripts/stack."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pgcdc.core import ports
from pgcdc.core.contract import JOBS
from pgcdc.stack import versions

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"\$\{(\w+):-([^}]*)\}")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${NAME:-default}`` with ``env`` (default: no variable set)."""
    return VARIABLE.sub(lambda m: (env or {}).get(m.group(1)) or m.group(2), value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with open(ROOT / "docker-compose.yml") as f:
        loaded = yaml.safe_load(f)
    assert isinstance(loaded, dict)
    return loaded


def published(
    service: dict[str, Any], env: dict[str, str] | None = None
) -> dict[int, tuple[str, int]]:
    """Host port -> (host ip, container port), "ip:host:container" after interpolation."""
    out: dict[int, tuple[str, int]] = {}
    for spec in service.get("ports", []):
        parts = interpolate(str(spec), env).split(":")
        assert len(parts) == 3, f"publish {spec!r} as ip:host:container so it stays on 127.0.0.1"
        ip, host, container = parts
        out[int(host)] = (ip, int(container))
    return out


def test_every_native_service_is_in_compose(compose: dict[str, Any]) -> None:
    assert set(ports.SERVICES) <= set(compose["services"])
    assert set(ports.PORTS) == set(ports.SERVICES)


@pytest.mark.parametrize("name", ["postgres", "redis", "kafka", "opensearch"])
def test_host_port_defaults_are_the_native_stack_and_a_variable_moves_them(
    compose: dict[str, Any], name: str
) -> None:
    service = compose["services"][name]
    assert published(service)[ports.PORTS[name]][0] == ports.HOST
    moved = published(service, {f"PGCDC_{name.upper()}_PORT": "40001"})
    assert 40001 in moved and ports.PORTS[name] not in moved
    assert all(ip == ports.HOST for ip, _ in published(service).values())


def test_kafka_controller_port_too(compose: dict[str, Any]) -> None:
    kafka = compose["services"]["kafka"]
    assert ports.KAFKA_CONTROLLER_PORT in published(kafka)
    assert 40002 in published(kafka, {"PGCDC_KAFKA_CONTROLLER_PORT": "40002"})


def test_env_urls_use_the_published_ports(compose: dict[str, Any]) -> None:
    env = ports.env_vars()
    hosts = {
        "CDC_POSTGRES__DSN": "postgres",
        "CDC_KAFKA__BOOTSTRAP_SERVERS": "kafka",
        "CDC_REDIS__URL": "redis",
        "CDC_SEARCH__URL": "opensearch",
    }
    for var, service in hosts.items():
        assert f"127.0.0.1:{ports.PORTS[service]}" in env[var], (var, env[var])
        assert ports.PORTS[service] in published(compose["services"][service])


def test_the_registry_profile_is_the_native_registry_s_ports_and_the_pipeline_s_url(
    compose: dict[str, Any],
) -> None:
    """Under its profile, the registry publishes the native registry's ports (PGCDC_REGISTRY_*
    move them); the reader and the job name it by service (docs/avro.md), wait for it only
    when its profile runs, and use it only with PGCDC_VALUE_FORMAT=avro."""
    registry = compose["services"]["registry"]
    assert registry["profiles"] == ["registry"]
    host = published(registry)
    assert set(host) == {ports.OPTIONAL_PORTS["registry"], ports.REGISTRY_MANAGEMENT_PORT}
    assert all(ip == ports.HOST for ip, _ in host.values())
    moved = {"PGCDC_REGISTRY_PORT": "40004", "PGCDC_REGISTRY_MANAGEMENT_PORT": "40005"}
    assert set(published(registry, moved)) == {40004, 40005}
    api_port = host[ports.OPTIONAL_PORTS["registry"]][1]
    assert ports.REGISTRY_URL.endswith(f":{ports.OPTIONAL_PORTS['registry']}/apis/ccompat/v7")
    for name in ("reader", "sync"):
        svc = compose["services"][name]
        env = svc["environment"]
        assert env["CDC_SCHEMA__REGISTRY_URL"] == f"http://registry:{api_port}/apis/ccompat/v7"
        assert interpolate(env["CDC_SCHEMA__VALUE_FORMAT"]) == "json"
        assert (
            interpolate(env["CDC_SCHEMA__VALUE_FORMAT"], {"PGCDC_VALUE_FORMAT": "avro"}) == "avro"
        )
        want = {"condition": "service_healthy", "required": False}
        assert svc["depends_on"]["registry"] == want


def test_kafka_advertises_the_published_host_port(compose: dict[str, Any]) -> None:
    env = compose["services"]["kafka"]["environment"]
    bootstrap = ports.env_vars()["CDC_KAFKA__BOOTSTRAP_SERVERS"]
    assert f"//{bootstrap}" in interpolate(env["KAFKA_ADVERTISED_LISTENERS"])
    moved = {"PGCDC_KAFKA_PORT": "40003"}
    assert "//127.0.0.1:40003" in interpolate(env["KAFKA_ADVERTISED_LISTENERS"], moved)
    # The advertised host listener is the one the published port reaches in the container.
    host_listener = re.search(r"HOST://:(\d+)", env["KAFKA_LISTENERS"])
    assert host_listener is not None
    assert published(compose["services"]["kafka"])[ports.PORTS["kafka"]][1] == int(
        host_listener.group(1)
    )
    assert str(env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]) == "false"


def test_postgres_has_logical_replication(compose: dict[str, Any]) -> None:
    svc = compose["services"]["postgres"]
    command = " ".join(svc["command"])
    assert "wal_level=logical" in command
    assert "max_replication_slots=20" in command and "max_wal_senders=20" in command
    assert svc["environment"] == {
        "POSTGRES_USER": "cdc",
        "POSTGRES_PASSWORD": "cdc",
        "POSTGRES_DB": "cdc",
        "POSTGRES_READER_USER": "cdc_reader",
        "POSTGRES_READER_PASSWORD": "cdc_reader",
    }


def test_pipeline_services_run_the_reader_and_the_shared_job(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["reader"]["command"][:2] == ["cdc", "run"]
    sync = services["sync"]["command"]
    assert sync[sync.index("spark_jobs/sync.py") + 1 :][:2] == ["--followers", "cache,search"]
    assert {"kafka", "redis", "opensearch"} <= set(services["sync"]["depends_on"])
    # cdc status reads each follower's metrics from the one job's endpoint.
    endpoints = json.loads(services["sync"]["environment"]["CDC_SPARK__JOB_ENDPOINTS"])
    assert endpoints == dict.fromkeys(JOBS, "http://sync:9411")
    for name in ("reader", "sync"):
        svc = services[name]
        assert svc["image"] == versions.IMAGES["pipeline"]
        env = svc["environment"]
        # Inside the compose network the services are reached by name, not host ports.
        assert env["CDC_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
        assert "@postgres:5432/" in env["CDC_POSTGRES__DSN"]
        # The reader's least-privilege role, on the publication the postgres service made,
        # and the stack's signal key as make docker-up passes it (issue 34).
        assert env["CDC_POSTGRES__DSN"].startswith("postgresql://cdc_reader:")
        assert env["CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE"] == "disabled"
        assert env["CDC_POSTGRES__SIGNAL_SECRET"] == "${PGCDC_SIGNAL_SECRET:-}"
        assert "kafka" in svc["depends_on"]
        # Each answers its healthcheck on the port its command serves /readyz on.
        port = svc["command"][svc["command"].index("--health-port") + 1]
        assert f"127.0.0.1:{port}/readyz" in " ".join(svc["healthcheck"]["test"])


def test_state_in_named_volumes_limits_and_restart_policies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    mounts = {
        name: [v.split(":")[0] for v in svc.get("volumes", [])] for name, svc in services.items()
    }
    assert mounts["postgres"] == ["postgres-data"] and mounts["kafka"] == ["kafka-data"]
    assert mounts["opensearch"] == ["opensearch-data"]
    assert mounts["sync"] == ["checkpoints"]
    assert mounts["registry"] == ["registry-data"]  # its H2 file: schemas outlive a restart
    assert set(compose["volumes"]) == {
        "postgres-data",
        "kafka-data",
        "opensearch-data",
        "checkpoints",
        "registry-data",
    }
    # The base image's service only exits (it is there to be built first): it never restarts.
    assert services["base"]["restart"] == "no" and services["base"]["command"] == ["true"]
    running = {name: svc for name, svc in services.items() if name != "base"}
    for name, svc in running.items():
        assert svc["restart"] == "unless-stopped", name
        assert "healthcheck" in svc, name
    # For 2 cores and 24 GiB: every service limited, all together well under the memory.
    units = {"m": 2**20, "g": 2**30}
    limits = {n: int(s["mem_limit"][:-1]) * units[s["mem_limit"][-1]] for n, s in running.items()}
    assert sum(limits.values()) <= 10 * 2**30, limits
