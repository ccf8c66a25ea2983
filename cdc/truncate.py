"""TRUNCATE as records: a delete and a tombstone for every key live in the table's topic.

A truncate removes rows without naming them, and Debezium's ``t`` event has no key, which a
compacted topic refuses. So, for a keyed table, the reader names the rows itself: it waits
until Kafka holds everything produced before the truncate, reads the table's topic from its
start to its end, and for every key live there (its newest record is not a tombstone; see
:mod:`cdc.live_keys`, on disk, so a million keys stay flat in memory) writes a ``d`` event
(``before`` holds the key's columns) and a tombstone. A key that already holds a record
newer than the truncate, from a later transaction, is left alone: a truncate replayed after
a restart must not tombstone what a later change or an incremental snapshot chunk wrote
(compaction would then drop that record for good). They all carry the truncate's version
(its transaction's commit LSN and one order, the next of that transaction), so the rows it
inserted before the truncate are deleted and those it inserts after it win; the
transaction's later records take the orders after it however many keys it named, so a
replay (which names fewer: those the first run's later records made newer) gives them the
same orders as the first run. Followers delete every row, and a
follower rebuilt from the compacted topic never sees them.

Debezium's ``t`` event is written as well unless ``postgres.skipped_operations`` holds ``t``
(its default): into the table topic of a keyless table (null keys are legal there), and into
:func:`pgcdc.core.contract.truncate_topic` for keyed tables, keyed by ``<schema>.<table>`` as a
Connect string (``{"schema": {"type": "string"}, "payload": …}``, as the value format writes
keys).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cdc.live_keys import Version, keys_live_before
from cdc.publisher import Publisher
from cdc.table_topics import TableTopics
from pgcdc.core.settings import KafkaSettings
from schemas.envelope import EventEncoder
from schemas.model import SourceInfo, TableSchema

log = logging.getLogger(__name__)

# (topic, key, value) → queued with the truncate's version (its transaction's, one order).
Send = Callable[[str, bytes | None, bytes | None], None]

FLUSH_TIMEOUT_S = 300.0


class TruncateWriter:
    """Turns one table's truncate into records (see the module docstring)."""

    def __init__(
        self,
        *,
        publisher: Publisher,
        encoder: EventEncoder,
        topics: TableTopics,
        kafka: KafkaSettings,
        truncate_topic: str,
        write_t_events: bool,
        tick: Callable[[], None],
    ) -> None:
        """``tick`` is called now and then during a long truncate (keeps sessions alive)."""
        self._publisher = publisher
        self._encoder = encoder
        self._topics = topics
        self._kafka = kafka
        self._truncate_topic = truncate_topic
        self._write_t = write_t_events
        self._tick = tick

    def write(
        self, table: TableSchema, topic: str, source: SourceInfo, send: Send, version: Version
    ) -> int:
        """Write the truncate of ``table`` (whose topic is ``topic``) at ``version`` (its
        transaction's commit LSN and the truncate's order in it); the deletes written."""
        deleted = 0
        if table.key_columns:
            # Everything before the truncate must be in the topic before it is read.
            self._publisher.flush(timeout_s=FLUSH_TIMEOUT_S)
            with keys_live_before(self._kafka, topic, version, tick=self._tick) as live:
                for key in live:
                    send(topic, key, self._encoder.encode_delete_of_key(table, key, source))
                    send(topic, key, None)
                    deleted += 1
                    if not deleted & 0xFFF:
                        self._tick()
            log.info(
                "truncate: %d keys deleted",
                deleted,
                extra={"table": f"{table.schema}.{table.table}", "topic": topic},
            )
        if self._write_t:
            value = self._encoder.encode_truncate(table, source)
            if table.key_columns:
                self._topics.ensure_plain(self._truncate_topic)
                send(self._truncate_topic, self._encoder.encode_truncate_key(table), value)
            else:
                send(topic, None, value)
        return deleted
