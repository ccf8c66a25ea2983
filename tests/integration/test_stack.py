"""scripts/stack against the real machine: status, idempotent up, recovery of a killed service.

`down` is not tested here: it would stop the servers every other test is using.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest

# exclusive: it kills the stack's Redis, which every other test shares (tests/schedule.py).
pytestmark = [pytest.mark.integration, pytest.mark.exclusive]

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "scripts" / "stack"


def _stacklib(module: str) -> ModuleType:
    """The stack's ``<module>``: ports live in the kernel, the rest in ``pgcdc.stack``."""
    return importlib.import_module(
        "pgcdc.core.ports" if module == "ports" else f"pgcdc.stack.{module}"
    )


def stack(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STACK), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def status_lines() -> tuple[int, dict[str, str]]:
    """Exit code of `status`, and each service's up/down word."""
    proc = stack("status", timeout=60)
    words = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines() if line.strip()}
    return proc.returncode, words


def cache_snapshot(cache: Path) -> dict[str, tuple[int, int]]:
    """Every file the stack keeps in the cache, with size and mtime: a download changes it.

    Only the stack's own folders: other tools share .cache/ and may write there meanwhile.
    """
    owned = [
        "downloads",
        "m2",
        "spark-jars",
        f"kafka-{_stacklib('kafka').KAFKA_VERSION}",
        f"opensearch-{_stacklib('opensearch').VERSION}",
    ]
    return {
        str(p.relative_to(cache)): (p.stat().st_size, p.stat().st_mtime_ns)
        for name in owned
        for p in (cache / name).rglob("*")
        if p.is_file()
    }


@pytest.fixture(scope="module")
def running() -> None:
    up = stack("up")
    assert up.returncode == 0, f"scripts/stack up failed:\n{up.stdout}\n{up.stderr}"


def test_status_reports_every_service_up(running: None) -> None:
    code, words = status_lines()
    ports = _stacklib("ports")
    # An on-demand server (the schema registry) is listed too while it runs, never as down.
    optional = {s: words.pop(s) for s in ports.OPTIONAL_SERVICES if s in words}
    assert words == dict.fromkeys(ports.SERVICES, "up")
    assert set(optional.values()) <= {"up"}
    assert code == 0


def test_second_up_downloads_nothing_and_is_quick(running: None) -> None:
    cache = _stacklib("common").paths().cache
    before = cache_snapshot(cache)
    assert before, f"{cache} should hold the downloads of the first up"
    t0 = time.monotonic()
    up = stack("up", timeout=120)
    elapsed = time.monotonic() - t0
    assert up.returncode == 0, up.stderr
    assert "downloading" not in up.stderr and "apt-get" not in up.stderr
    assert all("already running" in line for line in up.stdout.splitlines()), up.stdout
    assert cache_snapshot(cache) == before
    assert elapsed < 30, f"an up with everything running took {elapsed:.1f}s"


def _gone(pid: int) -> bool:
    return not _stacklib("common").pid_alive(pid)


def test_killed_redis_is_reported_down_and_restarted_alone(running: None) -> None:
    common = _stacklib("common")
    pidfile = common.paths().pidfile("redis")
    pid = common.read_pid(pidfile)
    assert pid is not None and common.pid_alive(pid)
    others = {
        s: common.read_pid(common.paths().pidfile(s)) for s in ("postgres", "kafka", "opensearch")
    }

    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _gone(pid):
        assert time.monotonic() < deadline, f"redis pid {pid} survived SIGKILL"
        time.sleep(0.05)

    code, words = status_lines()
    assert code == 1
    assert words["redis"] == "down"
    assert {s: words[s] for s in others} == dict.fromkeys(others, "up")

    up = stack("up", "redis", timeout=120)
    assert up.returncode == 0, up.stderr
    assert "redis" in up.stdout and "started" in up.stdout
    new_pid = common.read_pid(pidfile)
    assert new_pid is not None and new_pid != pid

    code, words = status_lines()
    assert code == 0, words
    # Only redis was restarted: every other service kept its process.
    assert {s: common.read_pid(common.paths().pidfile(s)) for s in others} == others


def test_a_server_whose_port_is_taken_at_start_is_started_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stack's ports lie in Linux's ephemeral range, so a client connection can hold one
    for a moment as its local port. A real redis-server on a port held by a bound socket
    exits with "Address already in use"; the start is retried once the holder lets go."""
    import socket
    import threading

    common = _stacklib("common")
    redis_mod = _stacklib("redis")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    class TakenRedis(redis_mod.Redis):  # type: ignore[misc, name-defined]
        name = "redis-taken"

        @property
        def port(self) -> int:
            return port

    paths = common.Paths(stack=tmp_path, cache=common.paths().cache)
    server = TakenRedis(paths)
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))  # bound, not listening: what a client's local port is
    hit = threading.Event()

    def let_go_after_the_first_failure() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not common.bind_failed(server.log, 0):
            time.sleep(0.05)
        hit.set()
        holder.close()

    releaser = threading.Thread(target=let_go_after_the_first_failure, daemon=True)
    try:
        assert server.start()
        releaser.start()
        server.wait_ready()
        assert server.probe()
    finally:
        server.stop()
        holder.close()
    assert hit.is_set() and common.bind_failed(server.log, 0), "the port was never taken"
    assert "was taken" in capsys.readouterr().err
