"""Helpers of test_keys_and_truncate.py: variant pipelines on the same database, what log
compaction would keep of a topic, the followers read exactly in any binary mode, readers and
jobs run side by side, and a process's peak memory."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import psycopg
import redis
from confluent_kafka.admin import AdminClient
from opensearchpy import OpenSearch

from cdc.table_topics import cleanup_policy as topic_cleanup_policy
from pgcdc.core.cache_hashes import every_hash
from pgcdc.core.contract import (
    SYNC_JOB,
    UNAVAILABLE_VALUE_PLACEHOLDER,
    UNAVAILABLE_VALUE_PLACEHOLDER_B64,
    UNAVAILABLE_VALUE_PLACEHOLDER_HEX,
    table_index,
)
from pgcdc.core.search_documents import every_document
from sinks.base import key_id
from tests.conftest import ROOT, Endpoints
from tests.e2e.pipeline import CDC, kill_group, start_job, tail
from tests.integration.reader_support import Record, read_topic
from tests.integration.real_databases.canonical import (
    ColumnType,
    canonical,
    column_types,
    loads_exact,
)
from tests.integration.real_databases.exact import differences, leader_exact
from tests.integration.real_databases.support import Pipeline, Table

PLACEHOLDER_FORMS = frozenset(
    {
        UNAVAILABLE_VALUE_PLACEHOLDER,
        UNAVAILABLE_VALUE_PLACEHOLDER_B64,
        UNAVAILABLE_VALUE_PLACEHOLDER_HEX,
    }
)


def variant(p: Pipeline, suffix: str) -> Pipeline:
    """Another reader and follower on ``p``'s database: its own slot, topics, index and keys
    (all named after ``p``'s, so ``p``'s cleanup removes them)."""
    return dataclasses.replace(
        p,
        name=p.name + suffix,
        index_prefix=p.index_prefix + suffix,
        key_prefix=p.key_prefix + suffix,
        checkpoint_dir=p.checkpoint_dir.with_name(p.checkpoint_dir.name + suffix),
    )


def cleanup_policy(p: Pipeline, topic: str) -> str:
    return topic_cleanup_policy(p.endpoints.kafka_bootstrap, topic)


Version = tuple[int, int]


def tombstone_and_row_versions(
    p: Pipeline, table: Table, keys: int
) -> list[tuple[Version, Version]]:
    """((commit LSN, order) of the old bytes' tombstone, that of the new row) per key in the
    table's newest snapshot: its rows at the newest LSN, its tombstones one LSN below."""
    records = read_topic(p.endpoints.kafka_bootstrap, table.topic(p.name))
    last = max(r.commit_lsn for r in records)
    versions: dict[str, dict[str, Version]] = {}
    for r in records:
        if r.key is None or r.commit_lsn < last - 1 or (r.value is None) != (r.commit_lsn < last):
            continue
        key = orjson.loads(r.key)
        kind = "row" if r.value is not None else "tombstone"
        versions.setdefault(str(key.get("payload", key)["id"]), {})[kind] = (r.commit_lsn, r.order)
    assert len(versions) == keys, table.name
    return [(v["tombstone"], v["row"]) for v in versions.values()]


def live_ids(records: Iterable[Record]) -> list[str]:
    """The follower ids of the keys log compaction keeps alive (each key's newest record is
    neither a tombstone nor a delete), one per live key form: an id twice means a key lives
    under two byte forms."""
    newest: dict[bytes, Record] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.key is not None:
            newest[r.key] = r
    out = []
    for key, r in newest.items():
        if r.payload is None or r.payload["op"] == "d":
            continue
        doc = orjson.loads(key)
        out.append(key_id(doc["payload"] if doc.keys() == {"schema", "payload"} else doc))
    return sorted(out)


# --- followers read exactly, bytea in any binary mode ----------------------------------------


def _cache_raw(p: Pipeline, table: Table) -> dict[str, dict[str, Any]]:
    prefix = f"{p.key_prefix}:{table.follower_id(p.name)}:"
    r = redis.Redis.from_url(p.endpoints.redis_url)
    raw: dict[str, dict[str, Any]] = {}
    try:
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
        for k, fields in every_hash(r, pattern):
            name = k.decode() if isinstance(k, bytes) else k
            raw[name[len(prefix) :]] = {
                (f.decode() if isinstance(f, bytes) else f): loads_exact(v)
                for f, v in fields.items()
            }
    finally:
        r.close()
    return raw


def _search_raw(p: Pipeline, table: Table) -> dict[str, dict[str, Any]]:
    index = table_index(p.index_prefix, table.follower_id(p.name))
    client = OpenSearch(p.endpoints.search_url, timeout=120)
    try:
        if not client.indices.exists(index=index):
            return {}
        client.indices.refresh(index=index)
    finally:
        client.close()
    return {
        h["_id"]: h["_source"]
        for h in every_document(p.endpoints.search_url, index, loads=loads_exact)
    }


def _follower_value(value: Any, t: ColumnType, binary_mode: str) -> Any:
    if t.name == "bytea" and value is not None and binary_mode == "hex":
        return bytes.fromhex(value)
    return canonical(value, t, "follower")


def follower_problems(p: Pipeline, table: Table, binary_mode: str = "base64") -> list[str]:
    """How Redis and OpenSearch differ from the table, and any placeholder they hold
    (``binary_mode``: how bytea values reach them, "bytes" and "base64" both as base64)."""
    with psycopg.connect(p.dsn) as conn:
        types = column_types(conn, table.schema, table.name)
    leader = leader_exact(p, table)
    problems = []
    for name, raw in (("Redis", _cache_raw(p, table)), ("OpenSearch", _search_raw(p, table))):
        for doc_id, doc in raw.items():
            for column, value in doc.items():
                if _is_placeholder(value):
                    problems.append(f"{name} {doc_id}.{column} holds the placeholder")
        rows = {
            k: {
                c: _follower_value(v, types.get(c, ColumnType("?")), binary_mode)
                for c, v in d.items()
            }
            for k, d in raw.items()
        }
        problems += [f"{name} {k}: {v}" for k, v in differences(leader, rows).items()]
    return problems


def _is_placeholder(value: Any) -> bool:
    if isinstance(value, str):
        return value in PLACEHOLDER_FORMS or UNAVAILABLE_VALUE_PLACEHOLDER in value
    if isinstance(value, list):
        return any(_is_placeholder(v) for v in value)
    return False


# --- running the reader and the jobs ------------------------------------------------------


def start_reader(
    p: Pipeline, work: Path, schema: dict[str, Any], **env: str
) -> subprocess.Popen[str]:
    """``cdc run --until current``; ``schema`` settings through a config file."""
    config = work / f"{p.name}-{len(list(work.glob('*.toml')))}.toml"
    config.write_text(
        "[schema]\n" + "".join(f"{k} = {orjson.dumps(v).decode()}\n" for k, v in schema.items())
    )
    return subprocess.Popen(
        [*CDC, "run", "--until", "current"],
        env=p.env(CDC_CONFIG=str(config), **env),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(*procs: subprocess.Popen[str], timeout: float = 600) -> list[str]:
    """Wait for readers started side by side; each must exit 0. Their logs (stderr)."""
    logs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"cdc run failed:\n{out[-2000:]}\n{err[-4000:]}"
        logs.append(err)
    return logs


def reset_state(p: Pipeline) -> None:
    done = subprocess.run(
        [*CDC, "reset-state", "--drop-slot"],
        env=p.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def run_jobs_together(
    runs: Sequence[tuple[Pipeline, Path, Sequence[str]]], timeout: float = 900
) -> None:
    """Both followers of each pipeline by the shared job (one JVM, one read) with
    --available-now and the run's arguments, the pipelines side by side; each must exit 0."""
    procs = []
    for p, logs, args in runs:
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{SYNC_JOB}.log"
        followers = ("--followers", "cache,search")
        procs.append(
            (SYNC_JOB, log, start_job(p, SYNC_JOB, "--available-now", *followers, *args, log=log))
        )
    deadline = time.monotonic() + timeout
    for job, log, proc in procs:
        try:
            rc = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise AssertionError(f"{job} did not finish; log: {log}") from None
        assert rc == 0, f"{job} exited {rc}:\n{tail(log)}"


def drop_heartbeats(endpoints: Endpoints, pipelines: Any) -> None:
    """Delete the heartbeat topics of ``pipelines`` (named after each, not its prefix)."""
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    names = {f"__cdc-heartbeat.{v.name}" for v in pipelines}
    topics = [t for t in admin.list_topics(timeout=10).topics if t in names]
    if topics:
        for fut in admin.delete_topics(topics, operation_timeout=30).values():
            fut.result()
