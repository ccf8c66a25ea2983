"""Heartbeats: the reader's last acknowledged LSN, the followers' read-your-writes watermark.

Key ``{"serverName": <prefix>}``, value ``{"ts_ms": …, "lsn": …}`` on the heartbeat topic
(:func:`pgcdc.core.contract.heartbeat_topic`, one partition, so a follower reads every
heartbeat in order from one place). The acknowledged LSN only ever moves to a position whose
transactions are all acknowledged by Kafka (or to an idle keepalive's position, with nothing
in flight), so every event committed before a heartbeat's LSN is already in its topic when
the heartbeat is produced.
"""

from __future__ import annotations

import time

import orjson

from cdc.publisher import Publisher
from pgcdc.core.contract import HEARTBEAT_LSN_FIELD, HEARTBEAT_SERVER_FIELD
from pgcdc.core.lsn import Lsn


class Heartbeats:
    """Publishes heartbeats to ``topic`` for the server named ``server_name``."""

    def __init__(self, publisher: Publisher, topic: str, server_name: str) -> None:
        self._publisher = publisher
        self.topic = topic
        self._key = orjson.dumps({HEARTBEAT_SERVER_FIELD: server_name})

    def ensure_topic(self) -> None:
        """Create the heartbeat topic (one partition) if it is missing."""
        self._publisher.ensure_topics([self.topic], partitions=1)

    def publish(self, last_ack: Lsn | None) -> None:
        """One heartbeat saying that everything before ``last_ack`` is in Kafka."""
        value = {
            "ts_ms": int(time.time() * 1000),
            HEARTBEAT_LSN_FIELD: last_ack.value if last_ack else None,
        }
        self._publisher.produce_plain(self.topic, self._key, orjson.dumps(value))

    def final(self, last_ack: Lsn | None) -> None:
        """On the way out, and delivered: without it a short run (``--until current``)
        could leave the followers' watermark behind its changes."""
        self.publish(last_ack)
        self._publisher.settle(timeout_s=30)
