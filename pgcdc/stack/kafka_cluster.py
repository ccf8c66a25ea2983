"""A Kafka cluster of three KRaft nodes (each broker and controller) on loopback.

Started on demand (``scripts/stack up kafka-cluster``, ``scripts/stack up --kafka-brokers 3``,
or :class:`KafkaClusterService` from a test or a benchmark), beside the single broker on
19092, never instead of it. Node ``i`` listens on the i-th of
:data:`~pgcdc.core.ports.KAFKA_CLUSTER_PORTS` (controller on the i-th of
:data:`~pgcdc.core.ports.KAFKA_CLUSTER_CONTROLLER_PORTS`); the three controllers form a
static quorum (``controller.quorum.voters``), and the storage of all three is formatted with
one cluster id. Topics default to replication factor 3 and ``min.insync.replicas=2``, so one
node may be stopped while producers with ``acks=all`` go on and lose nothing. Heap 256 MiB
per node.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import uuid
from typing import ClassVar

from pgcdc.core.ports import HOST, KAFKA_CLUSTER_CONTROLLER_PORTS, KAFKA_CLUSTER_PORTS
from pgcdc.stack import common
from pgcdc.stack.kafka import HEAP, LOG4J2, Kafka, probe_kafka
from pgcdc.stack.service import Service

NODE_HEAP = ["-Xms64m", "-Xmx256m"]
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2

# What the single broker's server.properties says, and what a three-node cluster says instead.
_CLUSTER_OVERRIDES = {
    "offsets.topic.replication.factor": str(REPLICATION_FACTOR),
    "transaction.state.log.replication.factor": str(REPLICATION_FACTOR),
    "transaction.state.log.min.isr": str(MIN_INSYNC_REPLICAS),
    "share.coordinator.state.topic.replication.factor": str(REPLICATION_FACTOR),
    "share.coordinator.state.topic.min.isr": str(MIN_INSYNC_REPLICAS),
}


def voters() -> str:
    """``controller.quorum.voters``: ``<id>@host:port`` of every node."""
    return ",".join(
        f"{i + 1}@{HOST}:{port}" for i, port in enumerate(KAFKA_CLUSTER_CONTROLLER_PORTS)
    )


class KafkaClusterNode(Kafka):
    """Node ``index`` (1-based) of the cluster: its node.id, ports and storage."""

    def __init__(self, paths: common.Paths, index: int) -> None:
        super().__init__(paths)
        self.index = index
        self.name = f"kafka-cluster-{index}"
        self.stop_grace_s = 30

    @property
    def port(self) -> int:
        return KAFKA_CLUSTER_PORTS[self.index - 1]

    @property
    def controller_port(self) -> int:
        return KAFKA_CLUSTER_CONTROLLER_PORTS[self.index - 1]

    def _java(self) -> list[str]:
        return [NODE_HEAP[HEAP.index(a)] if a in HEAP else a for a in super()._java()]

    def _properties(self) -> str:
        lines = []
        for line in super()._properties().splitlines():
            key = line.split("=", 1)[0]
            if key == "node.id":
                line = f"node.id={self.index}"
            elif key == "controller.quorum.bootstrap.servers":
                line = f"controller.quorum.voters={voters()}"
            elif key in _CLUSTER_OVERRIDES:
                line = f"{key}={_CLUSTER_OVERRIDES[key]}"
            lines.append(line)
        lines[-1:-1] = [
            f"default.replication.factor={REPLICATION_FACTOR}",
            f"min.insync.replicas={MIN_INSYNC_REPLICAS}",
            # Leadership moves back to a restarted node soon, so the test sees it rejoin.
            "leader.imbalance.check.interval.seconds=10",
        ]
        return "\n".join(lines) + "\n"

    def format_storage(self, cluster_id: str) -> None:
        """Format this node's storage for ``cluster_id`` (static quorum: no --standalone)."""
        self.fetch()
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "log4j2.properties").write_text(LOG4J2)
        self.config.write_text(self._properties())
        if (self.data / "meta.properties").exists():
            return
        common.run(
            [
                *self._java(),
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",
                "-c",
                self.config,
            ],
            timeout=120,
        )

    def prepare(self) -> None:
        raise common.StackError(f"{self.name}: start it through kafka-cluster")


class KafkaClusterService(Service):
    """The three nodes as one service: up, down and status act on all of them."""

    name = "kafka-cluster"
    packages: ClassVar[dict[str, str]] = Kafka.packages
    start_deadline_s = 180

    def __init__(self, paths: common.Paths) -> None:
        super().__init__(paths)
        self.nodes = [KafkaClusterNode(paths, i + 1) for i in range(len(KAFKA_CLUSTER_PORTS))]

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def address(self) -> str:
        return ",".join(n.address for n in self.nodes)

    @property
    def bootstrap_servers(self) -> str:
        return self.address

    def owns(self, cmdline: str) -> bool:
        return self.nodes[0].owns(cmdline)

    def pid(self) -> int | None:
        pids = [n.pid() for n in self.nodes]
        return pids[0] if all(p is not None for p in pids) else None

    def prepare(self) -> None:
        """Format every node's storage with one cluster id (kept in the first node's home)."""
        stamp = self.paths.stack / self.name / "cluster-id"
        stamp.parent.mkdir(parents=True, exist_ok=True)
        if not stamp.exists():
            stamp.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))
        cluster_id = stamp.read_text().strip()
        for n in self.nodes:
            n.format_storage(cluster_id)

    def launch(self) -> int:  # pragma: no cover - start() launches each node instead
        raise NotImplementedError

    def start(self) -> bool:
        """Start every node that is not running; True if any was started."""
        self.prepare()
        started = False
        for n in self.nodes:
            started |= self.start_node(n)
        return started

    def start_node(self, node: KafkaClusterNode) -> bool:
        """Start one node (e.g. again after :meth:`stop_node`); True if it was started."""
        if node.pid() is not None:
            return False
        node.pidfile.parent.mkdir(parents=True, exist_ok=True)
        common.say(f"starting {node.name} on {node.address} (log {node.log})")
        node._launch()
        return True

    def stop_node(self, node: KafkaClusterNode) -> bool:
        """Stop one node cleanly (SIGTERM: it hands its leaderships over first)."""
        return node.stop()

    def wait_ready(self) -> None:
        for n in self.nodes:
            n.wait_ready()
        common.wait_until(self.name, self.probe, self.start_deadline_s, log=self.nodes[0].log)

    def probe(self) -> bool:
        """Every node answers Metadata listing all three brokers."""
        return all(probe_kafka(HOST, n.port, brokers=len(self.nodes)) for n in self.nodes)

    def stop(self) -> bool:
        """Stop every node. All get SIGTERM at once: a node stopped last would otherwise wait
        for a controller quorum that is gone before shutting down."""
        pids = [(n, n.pid()) for n in self.nodes]
        for _, pid in pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for n, pid in pids:
            if pid is not None:
                common.terminate(pid, grace_s=n.stop_grace_s)
            n.pidfile.unlink(missing_ok=True)
        return any(pid is not None for _, pid in pids)

    def status(self) -> tuple[bool, str]:
        if self.pid() is None:
            down = [n.name for n in self.nodes if n.pid() is None]
            return False, f"{self.name:<13} down  ({', '.join(down)} not running)"
        if not self.probe():
            return False, f"{self.name:<13} down  (not all brokers listed; logs {self.paths.logs})"
        return True, f"{self.name:<13} up    {self.address}"
