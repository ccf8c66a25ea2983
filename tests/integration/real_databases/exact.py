"""Leader and followers read in the exact, per-type form of :mod:`.canonical`, and the
dead-letter topic read back, for cases where a value must be exact or dead-lettered."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from psycopg import sql

from pgcdc.core.cache_hashes import every_hash
from pgcdc.core.contract import table_index
from pgcdc.core.search_documents import every_document
from sinks.base import key_id
from tests.integration.real_databases.canonical import (
    ColumnType,
    canonical,
    column_types,
    loads_exact,
)
from tests.integration.real_databases.support import Pipeline, Table

Rows = dict[str, dict[str, Any]]


def _canonical_rows(
    raw: dict[str, dict[str, Any]], types: dict[str, ColumnType], side: str
) -> Rows:
    return {
        k: {c: canonical(v, types.get(c, ColumnType("?")), side) for c, v in row.items()}
        for k, row in raw.items()
    }


def leader_exact(p: Pipeline, table: Table) -> Rows:
    """Every row by follower document id, each value PostgreSQL's to_jsonb, exactly."""
    with psycopg.connect(p.dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        types = column_types(conn, table.schema, table.name)
        rows = conn.execute(
            sql.SQL("SELECT to_jsonb(t)::text FROM {} t").format(table.ident)
        ).fetchall()
    raw = {}
    for (text,) in rows:
        row = loads_exact(text)
        raw[key_id({c: row[c] for c in table.key})] = row
    return _canonical_rows(raw, types, "pg")


def _types(p: Pipeline, table: Table) -> dict[str, ColumnType]:
    with psycopg.connect(p.dsn) as conn:
        return column_types(conn, table.schema, table.name)


def cache_exact(p: Pipeline, table: Table) -> Rows:
    """The Redis follower's rows (hash mode: one JSON value per field), exactly."""
    prefix = f"{p.key_prefix}:{table.follower_id(p.name)}:"
    r = redis.Redis.from_url(p.endpoints.redis_url)
    raw: dict[str, dict[str, Any]] = {}
    try:
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
        for k, fields in every_hash(r, pattern):
            name = k.decode() if isinstance(k, bytes) else str(k)
            raw[name[len(prefix) :]] = {f.decode(): loads_exact(v) for f, v in fields.items()}
    finally:
        r.close()
    return _canonical_rows(raw, _types(p, table), "follower")


def search_exact(p: Pipeline, table: Table) -> Rows:
    """The OpenSearch follower's documents (``_source``), exactly."""
    index = table_index(p.index_prefix, table.follower_id(p.name))
    raw = {
        h["_id"]: h["_source"]
        for h in every_document(p.endpoints.search_url, index, loads=loads_exact)
    }
    return _canonical_rows(raw, _types(p, table), "follower")


@dataclass(frozen=True)
class DeadLetter:
    job: str | None
    table: str | None
    key: str | None
    reason: str


def dead_letters(p: Pipeline, timeout: float = 30) -> list[DeadLetter]:
    """Every record of the pipeline's dead-letter topic, from the start."""
    topic = f"{p.name}.dlq"
    c = Consumer(
        {
            "bootstrap.servers": p.endpoints.kafka_bootstrap,
            "group.id": f"{p.name}-dlq-check",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: list[DeadLetter] = []
    try:
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return out
        ends = {}
        for part in md.partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
            if high > low:
                ends[part] = high
        if not ends:
            return out
        c.assign([TopicPartition(topic, part, OFFSET_BEGINNING) for part in ends])
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(ends):
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for m in c.consume(1000, 0.5):
                err = m.error()
                part, offset, value = m.partition(), m.offset(), m.value()
                assert part is not None
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, str(err)
                    done.add(part)
                    continue
                assert value is not None and offset is not None
                v = orjson.loads(value)
                out.append(DeadLetter(v.get("job"), v.get("table"), v.get("key"), v["reason"]))
                if offset + 1 >= ends[part]:
                    done.add(part)
    finally:
        c.close()
    return out


def differences(leader: Rows, follower: Rows) -> dict[str, str]:
    """Per document id, how the follower differs from the leader ('' ids are equal)."""
    out: dict[str, str] = {}
    for k in leader.keys() | follower.keys():
        if k not in follower:
            out[k] = "missing"
        elif k not in leader:
            out[k] = "extra"
        elif leader[k] != follower[k]:
            cols = sorted(
                c
                for c in leader[k].keys() | follower[k].keys()
                if leader[k].get(c) != follower[k].get(c)
            )
            out[k] = "; ".join(
                f"{c}: {str(leader[k].get(c))[:60]!r} vs {str(follower[k].get(c))[:60]!r}"
                for c in cols
            )
    return out
