"""The test servers as containers (testcontainers), from the project's own images.

Used when ``CDC_TEST_DOCKER=1`` (see ``tests/conftest.py``). Nothing is pulled: the images
are the ones ``docker-compose.yml`` builds (``pgcdc.stack.versions.IMAGES``), built first by
``scripts/docker images`` when missing. Two things testcontainers would otherwise assume are
decided here from the machine, not hard-coded:

- **Ryuk**, its reaper container, comes from a registry. When its image is not on the
  engine, Ryuk is disabled (``TESTCONTAINERS_RYUK_DISABLED``); the session removes its own
  containers at the end, and containers left by a session that was killed (labelled with
  its pid) at the start of the next one.
- **Where published ports answer.** Inside a container (``/.dockerenv``) testcontainers
  connects to the bridge gateway. When the engine runs in this process's own network
  namespace (its pid's ``/proc/<pid>/ns/net`` is ours), published ports are on this
  machine's loopback, so ``TESTCONTAINERS_CONNECTION_MODE=docker_host`` and 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pgcdc.stack.versions import IMAGES as ALL_IMAGES
from tests.ports import free_port as _free_port

ROOT = Path(__file__).resolve().parent.parent

# The servers' images: docker-compose.yml's (tests/unit/test_docker_versions.py).
IMAGES = {name: ALL_IMAGES[name] for name in ("postgres", "kafka", "redis", "opensearch")}
LABEL = "pgcdc.tests.pid"
RYUK_IMAGE_DEFAULT = "testcontainers/ryuk:0.8.1"


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def engine_pid() -> int | None:
    """The local dockerd's pid (its pidfile, else a process named dockerd), if readable."""
    try:
        return int(Path("/var/run/docker.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().strip() == "dockerd":
                    return int(proc.name)
            except OSError:
                continue
    return None


def engine_shares_our_network() -> bool:
    """Whether the engine answering on the default socket runs in our network namespace."""
    docker_host = os.environ.get("DOCKER_HOST", "")
    if docker_host and not docker_host.startswith("unix://"):
        return False
    pid = engine_pid()
    if pid is None:
        return False
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def configure_testcontainers() -> dict[str, str]:
    """Set what this machine needs before testcontainers is imported; returns what was set
    (a setting the user gave is kept)."""
    chosen: dict[str, str] = {}
    ryuk = os.environ.get("RYUK_CONTAINER_IMAGE", RYUK_IMAGE_DEFAULT)
    if "TESTCONTAINERS_RYUK_DISABLED" not in os.environ and (
        _docker("image", "inspect", ryuk).returncode != 0
    ):
        chosen["TESTCONTAINERS_RYUK_DISABLED"] = "true"
    if "TESTCONTAINERS_CONNECTION_MODE" not in os.environ and engine_shares_our_network():
        chosen["TESTCONTAINERS_CONNECTION_MODE"] = "docker_host"
    os.environ.update(chosen)
    return chosen


def ensure_images() -> None:
    """Build the servers' images when one is missing (``scripts/docker images``; no pull)."""
    missing = [i for i in IMAGES.values() if _docker("image", "inspect", i).returncode != 0]
    if missing:
        subprocess.run([str(ROOT / "scripts" / "docker"), "images"], check=True, timeout=3600)


def remove_stale_containers() -> list[str]:
    """Remove containers that an earlier test session (now gone) left behind."""
    out = _docker(
        "ps", "-a", "--filter", f"label={LABEL}", "--format", '{{.ID}} {{.Label "' + LABEL + '"}}'
    )
    gone = []
    for line in out.stdout.splitlines():
        cid, _, pid = line.partition(" ")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _docker("rm", "-f", "-v", cid)
            gone.append(cid)
    return gone


def _healthy(container: Any, timeout: float) -> None:
    """Wait for the image's own HEALTHCHECK (each of the project's images has one)."""
    wrapped = container.get_wrapped_container()
    deadline = time.monotonic() + timeout
    while True:
        wrapped.reload()
        state = wrapped.attrs["State"]
        status = (state.get("Health") or {}).get("Status")
        if status == "healthy":
            return
        if not state.get("Running") or time.monotonic() > deadline:
            logs = wrapped.logs(tail=30).decode(errors="replace")
            raise RuntimeError(
                f"{wrapped.image.tags} is {status or state.get('Status')} after "
                f"{timeout:.0f}s; its last lines:\n{logs}"
            )
        time.sleep(0.5)


def start_servers(stack: ExitStack) -> dict[str, str]:
    """Start the four servers (stopped when ``stack`` closes); their client settings."""
    configure_testcontainers()
    ensure_images()
    remove_stale_containers()
    from testcontainers.core.container import DockerContainer

    pid = str(os.getpid())
    if engine_shares_our_network():
        bind, host = "127.0.0.1", "127.0.0.1"  # published on this machine's loopback only
    else:  # a remote engine, or one in a VM: where testcontainers reaches it
        from testcontainers.core.docker_client import DockerClient

        bind, host = "0.0.0.0", DockerClient().host()
    ports = {name: _free_port() for name in IMAGES}
    # The Kafka listener the host uses advertises the published port; the rest of the
    # broker's settings are the image's (the native broker's).
    kafka_env = {
        "KAFKA_LISTENERS": "HOST://:9092,INTERNAL://:9094,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"HOST://{host}:{ports['kafka']},INTERNAL://localhost:9094",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "HOST:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "INTERNAL",
    }
    specs: dict[str, tuple[int, dict[str, str], str | None]] = {
        "postgres": (
            5432,
            {"POSTGRES_USER": "cdc", "POSTGRES_PASSWORD": "cdc", "POSTGRES_DB": "cdc"},
            None,
        ),
        "kafka": (9092, kafka_env, None),
        "redis": (6379, {}, None),
        "opensearch": (9200, {"discovery.type": "single-node"}, None),
    }
    containers = {}
    for name, (port, env, command) in specs.items():
        c = DockerContainer(IMAGES[name]).with_bind_ports(port, ports[name])
        # Published on one address only: its `ports` reach docker-py's as they are, and an
        # (address, port) pair there binds that address (with_bind_ports takes a port alone).
        c.ports[str(port)] = (bind, ports[name])
        for k, v in env.items():
            c = c.with_env(k, v)
        if command:
            c = c.with_command(command)
        c = c.with_kwargs(labels={LABEL: pid})
        containers[name] = stack.enter_context(c)
    for c in containers.values():
        _healthy(c, timeout=300)
    return {
        "postgres_dsn": f"postgresql://cdc:cdc@{host}:{ports['postgres']}/cdc",
        "kafka_bootstrap": f"{host}:{ports['kafka']}",
        "redis_url": f"redis://{host}:{ports['redis']}/0",
        "search_url": f"http://{host}:{ports['opensearch']}",
    }
