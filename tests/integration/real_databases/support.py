"""Shared by the real-databases suite: a throwaway pipeline and PostgreSQL as the oracle.

Each case builds its own database, runs the reader (and, where it says so, both sync jobs)
and ends by comparing every row of PostgreSQL with Redis and OpenSearch. Table names may be
anything PostgreSQL allows: followers are found through the contract's name encodings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import redis
from confluent_kafka.admin import AdminClient
from opensearchpy import OpenSearch
from psycopg import sql

from demo.compare import canonical, diff
from pgcdc.core.cache_hashes import every_hash
from pgcdc.core.contract import JOBS, table_id, table_index, table_of_topic, table_topic
from pgcdc.core.search_documents import every_document
from sinks.base import key_id
from tests.conftest import Endpoints, unique, wait_until
from tests.e2e.pipeline import Pipeline, run_jobs_available_now, run_reader_until_current

__all__ = [
    "JOBS",
    "Pipeline",
    "Table",
    "assert_followers_equal",
    "fresh_pipeline",
    "run_jobs_available_now",
    "run_reader_until_current",
]


@dataclass(frozen=True)
class Table:
    """A captured table and the columns that form its Kafka key."""

    schema: str
    name: str
    key: tuple[str, ...] = ("id",)

    @property
    def ident(self) -> sql.Composable:
        return sql.Identifier(self.schema, self.name)

    def topic(self, prefix: str) -> str:
        return table_topic(prefix, self.schema, self.name)

    def follower_id(self, prefix: str) -> str:
        """The table as the followers name it (taken from its topic, as the jobs do)."""
        return table_of_topic(prefix, self.topic(prefix))


@contextlib.contextmanager
def fresh_pipeline(endpoints: Endpoints, tmp: Path, name: str = "rdb") -> Iterator[Pipeline]:
    """A new database, slot, topic prefix, index prefix and key prefix; all removed after."""
    db = unique(name)
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    p = Pipeline(
        endpoints=endpoints,
        dsn=endpoints.postgres_dsn_for(db),
        name=db,
        index_prefix=db.lower(),
        key_prefix=db,
        checkpoint_dir=tmp / f"{db}-checkpoints",
    )
    try:
        yield p
    finally:
        cleanup(p)


def cleanup(p: Pipeline) -> None:
    """Drop the pipeline's slots, database, topics, indices and keys."""
    ep = p.endpoints
    with psycopg.connect(ep.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE database = %s AND active_pid IS NOT NULL",
            (p.name,),
        )
        wait_until(
            lambda: (
                not conn.execute(
                    "SELECT 1 FROM pg_replication_slots WHERE database = %s AND active", (p.name,)
                ).fetchone()
            ),
            timeout=30,
            what="slots to be released",
        )
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE database = %s",
            (p.name,),
        )
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(p.name))
        )
    admin = AdminClient({"bootstrap.servers": ep.kafka_bootstrap})
    topics = [
        t
        for t in admin.list_topics(timeout=10).topics
        if t.startswith(p.name) or t == f"__cdc-heartbeat.{p.name}"
    ]
    if topics:
        for fut in admin.delete_topics(topics, operation_timeout=30).values():
            fut.result()
    client = OpenSearch(ep.search_url)
    client.indices.delete(
        index=f"{p.index_prefix}*", ignore_unavailable=True, expand_wildcards="all"
    )
    client.close()
    r = redis.Redis.from_url(ep.redis_url)
    batch: list[bytes] = []  # a thousand keys a call: one round trip per key took 20-30 s
    for k in r.scan_iter(match=f"{p.key_prefix}*", count=5000):
        batch.append(k)
        if len(batch) == 1000:
            r.unlink(*batch)
            batch.clear()
    if batch:
        r.unlink(*batch)
    r.close()


def column_types(dsn: str, table: Table) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped",
            (table.schema, table.name),
        ).fetchall()
    return dict(rows)


def leader_rows(dsn: str, table: Table) -> dict[str, dict[str, Any]]:
    """Every row of the table by its follower document id, values in the compared form."""
    types = column_types(dsn, table)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT to_jsonb(t) FROM {} t").format(table.ident)).fetchall()
    return {
        key_id({c: r[c] for c in table.key}): {c: canonical(v, types[c]) for c, v in r.items()}
        for (r,) in rows
    }


def cache_rows(p: Pipeline, table: Table) -> dict[str, dict[str, Any]]:
    types = column_types(p.dsn, table)
    prefix = f"{p.key_prefix}:{table.follower_id(p.name)}:"
    r = redis.Redis.from_url(p.endpoints.redis_url)
    out: dict[str, dict[str, Any]] = {}
    try:
        for k, fields in every_hash(r, _glob_escape(prefix) + "*"):
            row = {f.decode(): orjson.loads(v) for f, v in fields.items()}
            out[k.decode()[len(prefix) :]] = {
                c: canonical(v, types.get(c, "?")) for c, v in row.items()
            }
    finally:
        r.close()
    return out


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def search_rows(p: Pipeline, table: Table) -> dict[str, dict[str, Any]]:
    types = column_types(p.dsn, table)
    index = table_index(p.index_prefix, table.follower_id(p.name))
    return {
        h["_id"]: {c: canonical(v, types.get(c, "?")) for c, v in h["_source"].items()}
        for h in every_document(p.endpoints.search_url, index, page=5000)
    }


def assert_followers_equal(
    p: Pipeline, tables: Sequence[Table], *, allow_empty: bool = False
) -> None:
    """Redis and OpenSearch each hold exactly the rows of every table."""
    problems = []
    for table in tables:
        leader = leader_rows(p.dsn, table)
        if not allow_empty:
            assert leader, f"{table.schema}.{table.name} is empty: the case tested nothing"
        for follower, rows in (
            ("Redis", cache_rows(p, table)),
            ("OpenSearch", search_rows(p, table)),
        ):
            d = diff(leader, rows)
            if d:
                problems.append(f"{follower} differs from {table.schema}.{table.name}:\n{d}")
    assert not problems, "\n".join(problems)


def table_key_id(table: Table, **values: Any) -> str:
    """The follower document id of one key."""
    return key_id({c: values[c] for c in table.key})


__all__ += ["cache_rows", "cleanup", "leader_rows", "search_rows", "table_id", "table_key_id"]
