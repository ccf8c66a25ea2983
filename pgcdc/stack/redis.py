"""Redis from Debian's redis-server, run directly (not the system service), no persistence."""

from __future__ import annotations

import shutil
import socket
from typing import ClassVar

from pgcdc.core.ports import HOST
from pgcdc.stack import common
from pgcdc.stack.service import Service


class Redis(Service):
    name = "redis"
    packages: ClassVar[dict[str, str]] = {"redis-server": "redis-server"}
    start_deadline_s = 20

    def owns(self, cmdline: str) -> bool:
        # Redis retitles itself from "... --port N ..." to "redis-server 127.0.0.1:N".
        return "redis-server" in cmdline and str(self.port) in cmdline

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)

    def _exe(self) -> str:
        return shutil.which("redis-server") or "/usr/bin/redis-server"

    def launch(self) -> int:
        exe = self._exe()
        # Followers are rebuilt from Kafka, so the cache needs no snapshots or AOF.
        return common.spawn(
            [
                exe,
                "--bind",
                HOST,
                "--port",
                str(self.port),
                "--dir",
                self.home,
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
            ],
            log=self.log,
            cwd=self.home,
        )

    def probe(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=2) as s:
                s.sendall(b"*1\r\n$4\r\nPING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False
