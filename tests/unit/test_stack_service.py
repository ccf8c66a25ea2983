"""A server the stack just launched is judged alive the way the kernel shows it starting."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcdc.stack import common
from pgcdc.stack.kafka import Kafka

pytestmark = pytest.mark.unit

# A process whose command line is empty while it lives: what a child shows between the start
# of its execve (when Popen returns) and the kernel setting up its new arguments. kthreadd
# (pid 2) always shows it; a test cannot hold a real child inside execve.
MID_EXEC_PID = 2


class _Probed(Kafka):
    """A Kafka service whose probe answers on its third call (no server is started)."""

    start_deadline_s = 10

    def __init__(self, paths: common.Paths) -> None:
        super().__init__(paths)
        self.probes = 0

    def probe(self) -> bool:
        self.probes += 1
        return self.probes >= 3


@pytest.fixture
def service(tmp_path: Path) -> _Probed:
    s = _Probed(common.Paths(stack=tmp_path / "stack", cache=tmp_path / "cache"))
    s.pidfile.parent.mkdir(parents=True)
    return s


@pytest.fixture
def other_process() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _mid_exec_pid(other: int, monkeypatch: pytest.MonkeyPatch) -> int:
    if common.pid_alive(MID_EXEC_PID) and not common.cmdline(MID_EXEC_PID).strip():
        return MID_EXEC_PID
    # In a pid namespace without kthreadd: a live child, its command line read as empty.
    real = common.cmdline
    monkeypatch.setattr(common, "cmdline", lambda pid: "" if pid == other else real(pid))
    return other


def test_a_process_still_inside_execve_is_starting_not_exited(
    service: _Probed, other_process: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    service.pidfile.write_text(f"{_mid_exec_pid(other_process, monkeypatch)}\n")
    assert service.pid() is None  # not ours by its command line: stop and status leave it
    assert service.launched_alive()
    service.wait_started()  # before the fix: "kafka exited during startup" on the first look
    assert service.probes == 3


def test_a_launched_process_that_is_gone_or_not_ours_has_exited(
    service: _Probed, other_process: int
) -> None:
    assert not service.launched_alive()  # no pidfile
    service.pidfile.write_text(f"{other_process}\n")
    assert not service.launched_alive()
    with pytest.raises(common.StackError, match="kafka exited during startup"):
        service.wait_started()
    assert service.probes == 1
