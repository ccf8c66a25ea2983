"""The shape every service of the stack has, and the pidfile logic they share."""

from __future__ import annotations

import signal
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from pgcdc.core.ports import HOST, PORTS
from pgcdc.stack import common


class Service(ABC):
    """One server: prepared once, started detached, probed with a real request."""

    name: str
    # Apt packages this service needs, each with the path or command that proves it is there.
    packages: ClassVar[dict[str, str]] = {}
    # How long ``up`` waits for a real answer after starting it.
    start_deadline_s: float = 60
    stop_signal: int = signal.SIGTERM
    stop_grace_s: float = 60

    def __init__(self, paths: common.Paths) -> None:
        self.paths = paths

    @property
    def port(self) -> int:
        return PORTS[self.name]

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log(self) -> Path:
        return self.paths.log(self.name)

    @property
    def pidfile(self) -> Path:
        return self.paths.pidfile(self.name)

    @property
    def home(self) -> Path:
        """This service's state folder under STACK_DIR."""
        return self.paths.stack / self.name

    def required_packages(self) -> dict[str, str]:
        """The apt packages this service needs as configured (default: :attr:`packages`)."""
        return dict(self.packages)

    def pid(self) -> int | None:
        """The recorded pid if that process is alive and still looks like ours."""
        pid = common.read_pid(self.pidfile)
        if pid is None or not common.pid_alive(pid):
            return None
        return pid if self.owns(common.cmdline(pid)) else None

    def launched_alive(self) -> bool:
        """Whether the server this stack just launched is still there (the ``alive`` check
        while it starts). Popen returns once the child's ``execve`` has begun, before the
        kernel has set up its new command line: a look at that moment reads an empty one
        (7 in 200 java starts on a loaded 2-core machine), which is a server starting, not
        one that exited. Only for the wait after our own launch: a stale pidfile's pid may
        belong to a kernel thread, whose command line is empty too."""
        pid = common.read_pid(self.pidfile)
        if pid is None or not common.pid_alive(pid):
            return False
        command = common.cmdline(pid)
        return not command.strip() or self.owns(command)

    @abstractmethod
    def owns(self, cmdline: str) -> bool:
        """Whether a process with this command line is our server (guards against pid reuse)."""

    @abstractmethod
    def probe(self) -> bool:
        """One real request to the server; True if it answered correctly."""

    @abstractmethod
    def prepare(self) -> None:
        """Download, unpack and configure what the server needs (idempotent, cached)."""

    @abstractmethod
    def launch(self) -> int:
        """Start the server detached and return its pid."""

    def after_ready(self) -> None:
        """Work that needs the server up (e.g. creating a role); idempotent."""
        return None

    def start(self) -> bool:
        """Start the server unless ours is already running; return True if it was started."""
        if self.pid() is not None:
            return False
        if self.probe():
            raise common.StackError(
                f"{self.name}: {self.address} already answers but not from a process this stack "
                f"started (no live pid in {self.pidfile}); stop that server first"
            )
        self.prepare()
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        common.say(f"starting {self.name} on {self.address} (log {self.log})")
        self._launch()
        return True

    # A server that lost its port to another process's connection is started again this
    # many times (the port is free again once that connection ends).
    bind_retries: int = 3

    def _launch(self) -> None:
        """Launch the server and record its pid (and where its log stood, for wait_ready)."""
        self._log_mark = common.log_size(self.log)
        pid = self.launch()
        self.pidfile.write_text(f"{pid}\n")

    def wait_started(self) -> None:
        """Block until the server answers its first real request (the part a retry repeats)."""
        common.wait_until(
            self.name,
            self.probe,
            self.start_deadline_s,
            alive=self.launched_alive,
            log=self.log,
        )

    def wait_ready(self) -> None:
        """Block until the server answers a real request, or raise naming its log.

        A server that exited because its port was taken (see ``common.reserve_ports``) is
        started again, after a pause, up to ``bind_retries`` times."""
        for attempt in range(1, self.bind_retries + 2):
            try:
                self.wait_started()
                break
            except common.StackError:
                mark = getattr(self, "_log_mark", None)
                if (
                    mark is None
                    or attempt > self.bind_retries
                    or self.pid() is not None
                    or not common.bind_failed(self.log, mark)
                ):
                    raise
                common.say(
                    f"{self.name}: {self.address} was taken (by another connection's local "
                    f"port?); starting again in {attempt}s ({attempt}/{self.bind_retries})"
                )
                time.sleep(attempt)
                self._launch()
        self.after_ready()

    def stop(self) -> bool:
        """Stop our server by its recorded pid and wait until it is gone; True if it ran."""
        pid = self.pid()
        if pid is not None:
            common.say(f"stopping {self.name} (pid {pid})")
            common.terminate(pid, sig=self.stop_signal, grace_s=self.stop_grace_s)
        self.pidfile.unlink(missing_ok=True)
        return pid is not None

    def status(self) -> tuple[bool, str]:
        """(up?, one-line description) from pid liveness AND a real request."""
        pid = self.pid()
        if pid is None:
            return False, f"{self.name:<13} down  (no live process; log {self.log})"
        if not self.probe():
            return (
                False,
                f"{self.name:<13} down  (pid {pid} alive but {self.address} does not answer; log {self.log})",
            )
        return True, f"{self.name:<13} up    pid {pid:<8} {self.address}"
