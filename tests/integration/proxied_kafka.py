"""A throwaway Kafka broker that clients reach only through a :class:`Proxy` the test cuts.

A proxy on the shared broker's bootstrap address alone cuts nothing: after bootstrap a
Kafka client connects to the broker's *advertised* address. So the test runs a KRaft broker
of its own (the stack's jars, its own ports and storage under the test's folder) whose
advertised listener is the proxy's port: every connection of a client goes through the
proxy, and cutting it makes Kafka unreachable without touching the shared stack.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pgcdc.core.ports import HOST
from pgcdc.stack import common
from pgcdc.stack.kafka import Kafka
from tests.e2e.proxy import Proxy
from tests.ports import free_port


class _ProxiedBroker(Kafka):
    name = "kafka-proxied"
    start_deadline_s = 180

    def __init__(self, paths: common.Paths, port: int, controller: int, advertised: int) -> None:
        super().__init__(paths)
        self._port, self._controller, self._advertised = port, controller, advertised

    @property
    def port(self) -> int:
        return self._port

    @property
    def controller_port(self) -> int:
        return self._controller

    def listener_properties(self) -> list[str]:
        return [
            f"listeners=PLAINTEXT://{HOST}:{self._port},CONTROLLER://{HOST}:{self._controller}",
            f"advertised.listeners=PLAINTEXT://{HOST}:{self._advertised}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
        ]

    def extra_properties(self) -> list[str]:
        # A transaction open past its timeout is aborted within a second, not ten.
        return ["transaction.abort.timed.out.transaction.cleanup.interval.ms=1000"]


@dataclass(frozen=True)
class ProxiedKafka:
    proxy: Proxy
    bootstrap: str  # the proxy's address: what the reader is given
    log: Path
    broker: Kafka

    def restart(self) -> float:
        """Stop the broker and start it again on its storage (a broker restart, the proxy
        left as it is); the seconds it was down."""
        t0 = time.monotonic()
        self.broker.stop()
        self.broker.start()
        self.broker.wait_ready()
        return time.monotonic() - t0


@contextmanager
def proxied_kafka(folder: Path) -> Iterator[ProxiedKafka]:
    """Start a broker behind a proxy; stop it (by its own pid) and the proxy afterwards."""
    broker_port = free_port()
    proxy = Proxy(HOST, broker_port)
    paths = common.Paths(stack=folder, cache=common.paths().cache)
    broker = _ProxiedBroker(paths, broker_port, free_port(), proxy.port)
    try:
        broker.start()
        broker.wait_ready()
        yield ProxiedKafka(proxy, f"{HOST}:{proxy.port}", broker.log, broker)
    finally:
        broker.stop()
        proxy.close()
