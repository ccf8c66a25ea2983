"""A Redis Cluster of three masters (no replicas) from Debian's redis-server, on loopback.

Started on demand (``scripts/stack up redis-cluster``, or :func:`RedisClusterService.start`
from a test), beside the single Redis, never instead of it. Each node is its own
redis-server with ``cluster-enabled yes`` on :data:`~pgcdc.core.ports.REDIS_CLUSTER_PORTS`
(cluster bus on :data:`~pgcdc.core.ports.REDIS_CLUSTER_BUS_PORTS`), state in
``.stack/redis-cluster-<i>/``; the first start joins them with ``redis-cli --cluster
create`` (16384 slots split in three). Clients reach it as
:data:`~pgcdc.core.ports.REDIS_CLUSTER_URL` (``?cluster=true``: the project's cluster client).
"""

from __future__ import annotations

import shutil
import socket
from typing import ClassVar

from pgcdc.core.ports import HOST, REDIS_CLUSTER_BUS_PORTS, REDIS_CLUSTER_PORTS
from pgcdc.stack import common
from pgcdc.stack.redis import Redis
from pgcdc.stack.redis_secure import _command
from pgcdc.stack.service import Service


class RedisClusterNode(Redis):
    """One master of the cluster: node ``index`` (1-based)."""

    def __init__(self, paths: common.Paths, index: int) -> None:
        super().__init__(paths)
        self.index = index
        self.name = f"redis-cluster-{index}"

    @property
    def port(self) -> int:
        return REDIS_CLUSTER_PORTS[self.index - 1]

    @property
    def bus_port(self) -> int:
        return REDIS_CLUSTER_BUS_PORTS[self.index - 1]

    def launch(self) -> int:
        # Followers are rebuilt from Kafka: no snapshots or AOF; nodes.conf keeps the slots.
        return common.spawn(
            [
                self._exe(),
                "--bind",
                HOST,
                "--port",
                str(self.port),
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                str(self.bus_port),
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "3000",
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
                "--maxmemory-policy",
                "noeviction",
            ],
            log=self.log,
            cwd=self.home,
        )

    def cluster_info(self) -> dict[str, str]:
        """``CLUSTER INFO`` as a dict ({} if the node does not answer)."""
        try:
            reply = ask(self.port, "CLUSTER", "INFO")
        except OSError:
            return {}
        return dict(line.split(":", 1) for line in reply.decode().splitlines() if ":" in line)


class RedisClusterService(Service):
    """The three nodes as one service: up, down and status act on all of them."""

    name = "redis-cluster"
    packages: ClassVar[dict[str, str]] = {"redis-server": "redis-cli"}
    start_deadline_s = 60

    def __init__(self, paths: common.Paths) -> None:
        super().__init__(paths)
        self.nodes = [RedisClusterNode(paths, i + 1) for i in range(len(REDIS_CLUSTER_PORTS))]

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def address(self) -> str:
        return ",".join(n.address for n in self.nodes)

    @property
    def url(self) -> str:
        """The URL the project's clients take (any node; ``cluster=true``)."""
        return f"redis://{self.nodes[0].address}/0?cluster=true"

    def owns(self, cmdline: str) -> bool:
        return self.nodes[0].owns(cmdline)

    def pid(self) -> int | None:
        pids = [n.pid() for n in self.nodes]
        return pids[0] if all(p is not None for p in pids) else None

    def prepare(self) -> None:
        for n in self.nodes:
            n.prepare()

    def launch(self) -> int:  # pragma: no cover - start() launches each node instead
        raise NotImplementedError

    def start(self) -> bool:
        """Start every node that is not running; True if any was started."""
        return any([n.start() for n in self.nodes])

    def wait_ready(self) -> None:
        """Every node answers, the slots are assigned (created on first start), state ok."""
        for n in self.nodes:
            n.wait_ready()
        if self.nodes[0].cluster_info().get("cluster_slots_assigned") != "16384":
            common.say(f"redis-cluster: creating the cluster over {self.address}")
            common.run(
                [
                    shutil.which("redis-cli") or "/usr/bin/redis-cli",
                    "--cluster",
                    "create",
                    *(n.address for n in self.nodes),
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                timeout=60,
            )
        common.wait_until(self.name, self.probe, self.start_deadline_s, log=self.nodes[0].log)

    def probe(self) -> bool:
        """Every node sees the cluster as ok, with all slots and all nodes."""
        for n in self.nodes:
            info = n.cluster_info()
            if info.get("cluster_state") != "ok" or info.get("cluster_known_nodes") != str(
                len(self.nodes)
            ):
                return False
        return True

    def stop(self) -> bool:
        return any([n.stop() for n in reversed(self.nodes)])

    def status(self) -> tuple[bool, str]:
        if self.pid() is None:
            down = [n.name for n in self.nodes if n.pid() is None]
            return False, f"{self.name:<13} down  ({', '.join(down)} not running)"
        if not self.probe():
            return False, f"{self.name:<13} down  (cluster state not ok; logs {self.paths.logs})"
        return True, f"{self.name:<13} up    {self.address}"


def ask(port: int, *words: str, timeout: float = 2) -> bytes:
    """One command to the node on ``port``; the reply's payload (a bulk or simple string)."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(_command(*words))
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                raise OSError("connection closed")
            data += chunk
        head, _, rest = data.partition(b"\r\n")
        if head.startswith(b"$"):
            size = int(head[1:])
            while len(rest) < size:
                chunk = s.recv(4096)
                if not chunk:
                    raise OSError("connection closed")
                rest += chunk
            return rest[:size]
        if head.startswith(b"-"):
            raise OSError(head[1:].decode())
        return head[1:]
