"""Table topics that lost what they held: deleted, or deleted and created again.

Kafka gives every topic an id when it is created; a topic of the same name created again
gets a new one. The reader records the id of each captured table's topic in its state
(:class:`cdc.incremental.queue.SnapshotsState`); a topic whose id changed or that is gone
no longer holds the table, and the reader snapshots that table again, incrementally, while it
streams (a compacted topic is the followers' source of truth for rebuilds, so it must hold
every row again, not only the changes from now on). The rule is pure; reading the ids is one
admin request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaError, KafkaException, TopicCollection

from cdc.kafka_clients import admin_client
from pgcdc.core.errors import PublishError
from pgcdc.core.settings import KafkaSettings


def topic_ids(kafka: KafkaSettings, topics: Iterable[str]) -> dict[str, str | None]:
    """Each topic's id, None for one that does not exist."""
    names = sorted(set(topics))
    if not names:
        return {}
    out: dict[str, str | None] = {}
    admin = admin_client(kafka)  # held until every answer is in: its handle serves them
    futures = admin.describe_topics(TopicCollection(names), request_timeout=30)
    for name, future in futures.items():
        try:
            out[name] = str(future.result(timeout=60).topic_id)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise PublishError(f"cannot describe topic {name}: {e.args[0].str()}") from e
            out[name] = None
    return out


def lost_topics(recorded: Mapping[str, str], current: Mapping[str, str | None]) -> list[str]:
    """The recorded topics that are gone or were created again (another id), in order."""
    return sorted(t for t, tid in recorded.items() if t in current and current[t] != tid)


def describe_loss(topic: str, recorded: str, now: str | None) -> str:
    """Why a topic counts as lost, for its log line and ``cdc status``."""
    if now is None:
        return f"topic {topic} was deleted (it held the table)"
    return f"topic {topic} was deleted and created again (topic id {recorded}, now {now})"
