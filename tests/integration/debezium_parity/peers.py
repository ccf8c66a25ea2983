"""The two systems under comparison, on one database: Debezium Server and our reader.

Debezium Server is the benchmark's (:mod:`benchmarks.debezium`: the same distribution, JDK
lookup and base configuration), with the settings that make the comparison exact: an initial
snapshot, TRUNCATE events kept (``skipped.operations=none``), unknown types included. Its topics
are created with ``cleanup.policy=delete``: keyless tables and TRUNCATE events have null keys,
which a compacted topic refuses. Records of both are read back with their headers.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from benchmarks.debezium import DebeziumServer
from benchmarks.env import BenchEnv

# Debezium's topic naming: characters outside [A-Za-z0-9._-] become "_".
_DEBEZIUM_TOPIC_INVALID = re.compile(r"[^A-Za-z0-9._-]")
# Debezium's table.include.list entries are regular expressions (split on commas).
_REGEX_SPECIAL = re.compile(r"([\\.^$|?*+()\[\]{}, -])")


@dataclass(frozen=True)
class Record:
    """One Kafka record as read back: everything the comparison looks at."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    def key_json(self) -> Any:
        """The key as JSON; a key that is not JSON as its text."""
        if self.key is None:
            return None
        try:
            return orjson.loads(self.key)
        except orjson.JSONDecodeError:
            return self.key.decode("utf-8", "replace")

    def value_json(self) -> Any:
        return None if self.value is None else orjson.loads(self.value)


class ParityDebezium(DebeziumServer):
    """Debezium Server configured to capture the parity database like our reader does."""

    def __init__(
        self,
        env: BenchEnv,
        tables: list[str],
        *,
        role: str = "dbz",
        extra: dict[str, str] | None = None,
    ) -> None:
        super().__init__(env, tables, role=role, snapshot_mode="initial")
        # More connector properties (without the debezium.source. prefix): the modes.
        self.extra = dict(extra or {})

    def topic(self, table: str) -> str:
        """Debezium's topic for ``schema.table`` (its default naming, sanitised)."""
        return self.topic_of(self.prefix, table)

    @staticmethod
    def topic_of(prefix: str, table: str) -> str:
        """Debezium's topic for ``schema.table`` under ``prefix``."""
        return _DEBEZIUM_TOPIC_INVALID.sub("_", f"{prefix}.{table}")

    def prepare(self) -> None:
        """The publication (tables named exactly) and delete-policy topics."""
        with self.env.connect() as conn:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                    sql.Identifier(self.publication),
                    sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in self.tables),
                )
            )
        create_topics(self.env.bootstrap, [self.topic(t) for t in self.tables])

    def properties(self) -> str:
        props = dict(
            line.split("=", 1) for line in super().properties().splitlines() if "=" in line
        )
        include = ",".join("^" + _REGEX_SPECIAL.sub(r"\\\1", t) + "$" for t in self.tables)
        props.update(
            {
                "debezium.source.table.include.list": include,
                "debezium.source.skipped.operations": "none",
                "debezium.source.include.unknown.datatypes": "true",
                "quarkus.log.level": "WARN",
                'quarkus.log.category."io.debezium".level': "INFO",
                **{f"debezium.source.{k}": v for k, v in self.extra.items()},
            }
        )
        # java.util.Properties reads a backslash as an escape.
        return "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in props.items())


def create_topics(bootstrap: str, topics: list[str]) -> None:
    """One-partition topics with ``cleanup.policy=delete`` (null keys allowed)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(t, 1, 1, config={"cleanup.policy": "delete"}) for t in topics],
        operation_timeout=30,
    )
    for fut in futures.values():
        fut.result()


def topics_with_prefix(bootstrap: str, prefix: str) -> list[str]:
    """Every topic named ``<prefix>.…``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return sorted(t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix + "."))


def _headers(raw: Any) -> tuple[tuple[str, bytes | None], ...]:
    pairs = raw.items() if isinstance(raw, dict) else raw or ()
    return tuple(
        (str(k), v if v is None or isinstance(v, bytes) else str(v).encode()) for k, v in pairs
    )


def read_topics(bootstrap: str, topics: list[str], timeout_s: float = 60) -> list[Record]:
    """Every record of ``topics`` up to their end offsets now, in (topic, offset) order."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "debezium-parity",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        ends: dict[tuple[str, int], int] = {}
        for topic in topics:
            md = c.list_topics(topic, timeout=10).topics[topic]
            for p in md.partitions:
                low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if high > low:
                    ends[(topic, p)] = high
        out: list[Record] = []
        if not ends:
            return out
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in ends])
        done: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout_s
        while len(done) < len(ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {len(ends) - len(done)} partitions timed out")
            for m in c.consume(10_000, 0.5):
                err = m.error()
                tp = (str(m.topic()), int(m.partition() or 0))
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(tp)
                        continue
                    raise RuntimeError(str(err))
                offset = int(m.offset() or 0)
                out.append(Record(tp[0], tp[1], offset, m.key(), m.value(), _headers(m.headers())))
                if offset + 1 >= ends[tp]:
                    done.add(tp)
        out.sort(key=lambda r: (r.topic, r.partition, r.offset))
        return out
    finally:
        c.close()
