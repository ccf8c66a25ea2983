"""What crosses Kafka between the reader and the sync jobs: the one definition.

The reader (``cdc``) writes records by these rules and the jobs (``spark_jobs``, ``sinks``)
read them by the same rules; both import this module, so the two sides cannot drift apart.
Standard library only.

- **Topics.** Every captured table has ``<prefix>.<schema>.<table>`` (compacted, keyed by
  primary key); the reader's heartbeats go to ``__cdc-heartbeat.<prefix>``, its durable state
  to ``<prefix>.__cdc_state``; records a follower cannot apply go to the dead-letter topic.
- **Headers.** Every change record carries its transaction's commit LSN and its position in
  the transaction (:data:`HEADER_COMMIT_LSN`, :data:`HEADER_ORDER`), as decimal ASCII. The
  pair is the record's :class:`VersionOrder`: followers apply a change only when its version
  is newer than the one they hold.
- **Heartbeats.** Key ``{"serverName": <prefix>}``, value ``{"ts_ms": …, "lsn": …}``: every
  change committed before ``lsn`` is already in its topic (the followers' watermark).
- **Unchanged TOAST values** that an event could not carry are Debezium's placeholder
  :data:`UNAVAILABLE_VALUE_PLACEHOLDER` (as text, or base64 of it in binary columns).
- **Followers** record their watermark per job (:data:`JOBS`) under
  :func:`redis_watermark_key` and in the index :func:`search_watermark_index`.
"""

from __future__ import annotations

import base64
import re
from typing import Final, NamedTuple, Protocol, TypeAlias

# -- headers -------------------------------------------------------------------------------

HEADER_COMMIT_LSN: Final = "cdc.commit_lsn"
HEADER_ORDER: Final = "cdc.order"

# Record headers as confluent-kafka takes them.
Headers: TypeAlias = list[tuple[str, str | bytes | None]]


class VersionOrder(NamedTuple):
    """Where a change stands in the log: its transaction's commit LSN, then its position in
    that transaction. Tuples compare in that order, which is commit order per key."""

    commit_lsn: int
    order: int

    def headers(self) -> Headers:
        """The record headers that carry this version."""
        return version_headers(str(self.commit_lsn).encode(), self.order)


def version_headers(commit_lsn: bytes, order: int) -> Headers:
    """Headers for a change at ``order`` in the transaction committed at ``commit_lsn``
    (decimal ASCII, precomputed once per transaction by the reader's hot path)."""
    return [(HEADER_COMMIT_LSN, commit_lsn), (HEADER_ORDER, str(order).encode())]


# -- topics --------------------------------------------------------------------------------

_INVALID_TOPIC_CHARS: Final = re.compile(r"[^A-Za-z0-9._-]")

DEFAULT_DEAD_LETTER_TOPIC: Final = "cdc.dlq"


def table_topic(prefix: str, schema: str, table: str) -> str:
    """``<prefix>.<schema>.<table>``, characters Kafka refuses replaced with ``_``."""
    return _INVALID_TOPIC_CHARS.sub("_", f"{prefix}.{schema}.{table}")


def table_of_topic(prefix: str, topic: str) -> str:
    """The ``<schema>.<table>`` part of a table topic (the topic itself if it is not one)."""
    head = prefix + "."
    return topic[len(head) :] if topic.startswith(head) else topic


def table_topic_pattern(prefix: str) -> str:
    """A regular expression (Java's, matched against the whole name) for every table topic
    of ``prefix``: ``<prefix>.<schema>.<table>``, nothing else."""
    return rf"{re.escape(prefix)}\.[^.]+\.[^.]+"


def state_topic(prefix: str) -> str:
    """The compacted topic holding the reader's durable state."""
    return f"{prefix}.__cdc_state"


class HeartbeatConfig(Protocol):
    """The Kafka settings that decide the heartbeat topic."""

    @property
    def topic_prefix(self) -> str: ...
    @property
    def heartbeat_topic(self) -> str | None: ...
    @property
    def heartbeat_enabled(self) -> bool: ...


def heartbeat_topic(kafka: HeartbeatConfig) -> str | None:
    """The heartbeat topic, None when heartbeats are off: ``__cdc-heartbeat.<prefix>`` unless
    set, after Debezium's ``__debezium-heartbeat.<prefix>``."""
    if not kafka.heartbeat_enabled:
        return None
    return kafka.heartbeat_topic or f"__cdc-heartbeat.{kafka.topic_prefix}"


HEARTBEAT_SERVER_FIELD: Final = "serverName"
HEARTBEAT_LSN_FIELD: Final = "lsn"

# -- values --------------------------------------------------------------------------------

# Debezium's placeholder for unchanged TOAST values (unavailable.value.placeholder).
UNAVAILABLE_VALUE_PLACEHOLDER: Final = "__debezium_unavailable_value"
UNAVAILABLE_VALUE_PLACEHOLDER_B64: Final = base64.b64encode(
    UNAVAILABLE_VALUE_PLACEHOLDER.encode()
).decode()
UNAVAILABLE_VALUE_PLACEHOLDERS: Final = (
    UNAVAILABLE_VALUE_PLACEHOLDER,
    UNAVAILABLE_VALUE_PLACEHOLDER_B64,
)

# -- followers -----------------------------------------------------------------------------

CACHE_JOB: Final = "cache_sync"
SEARCH_JOB: Final = "search_sync"
JOBS: Final = (CACHE_JOB, SEARCH_JOB)

SEARCH_WATERMARK_SUFFIX: Final = "cdc-watermarks"


def redis_watermark_key(key_prefix: str, job: str) -> str:
    """The Redis key holding ``job``'s watermark LSN (20 decimal digits, only increasing)."""
    return f"{key_prefix}:__watermark__:{job}"


def search_watermark_index(index_prefix: str) -> str:
    """The OpenSearch index holding one document per job with its watermark LSN."""
    return f"{index_prefix}-{SEARCH_WATERMARK_SUFFIX}".lower()
