"""The leader's and the followers' state in one comparable form, and how two states differ.

Shared by the demo's final check and the end-to-end tests, so both agree on what "equal"
means: rows by document id, each value in one form whether PostgreSQL, Redis or OpenSearch
holds it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson
import psycopg
import redis
from redis.cluster import RedisCluster

from pgcdc.core.cache_hashes import every_hash
from pgcdc.core.follower_clients import redis_cluster_url
from pgcdc.core.search_documents import every_document
from sinks.search_index import index_name


def canonical(value: Any, pg_type: str) -> Any:
    """One form for a value whether PostgreSQL, Redis or OpenSearch holds it."""
    if value is None:
        return None
    if pg_type == "numeric":
        return Decimal(str(value))
    if pg_type == "timestamptz":
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if pg_type in ("int4", "int8", "int2"):
        return int(value)
    return value


def _followed(value: Any, pg_type: str) -> Any:
    """A follower's value in the leader's form before :func:`canonical`: a ``json`` or
    ``jsonb`` column is held as its JSON text (Debezium's ``io.debezium.data.Json``), which
    ``to_jsonb`` gives parsed."""
    if pg_type in ("json", "jsonb") and isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def column_types(dsn: str, table: str) -> dict[str, str]:
    """Each column's type name."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (table,),
        ).fetchall()
    return dict(rows)


def leader_state(dsn: str, table: str, key: str = "id") -> dict[str, dict[str, Any]]:
    """The table's rows by their ``key`` column."""
    types = column_types(dsn, table)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT to_jsonb(t) FROM {table} t").fetchall()
    return {str(r[key]): {c: canonical(v, types[c]) for c, v in r.items()} for (r,) in rows}


def cache_state(dsn: str, redis_url: str, key_prefix: str, table: str) -> dict[str, dict[str, Any]]:
    """The Redis follower's rows of ``table`` (hashes ``<key_prefix>:<table>:<id>``)."""
    types = column_types(dsn, table)
    url, cluster = redis_cluster_url(redis_url)
    # A cluster client scans every master.
    r = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    prefix = f"{key_prefix}:{table}:"
    out: dict[str, dict[str, Any]] = {}
    try:
        for k, fields in every_hash(r, f"{prefix}*"):
            row = {_text(f): orjson.loads(v) for f, v in fields.items()}
            out[_text(k)[len(prefix) :]] = {
                c: canonical(_followed(v, types.get(c, "?")), types.get(c, "?"))
                for c, v in row.items()
            }
    finally:
        r.close()
    return out


def _text(b: bytes | str) -> str:
    return b.decode() if isinstance(b, bytes) else b


def search_state(
    dsn: str, search_url: str, index_prefix: str, table: str
) -> dict[str, dict[str, Any]]:
    """The search follower's documents of ``table`` (index ``<index_prefix>-<table>``)."""
    types = column_types(dsn, table)
    return {
        h["_id"]: {
            c: canonical(_followed(v, types.get(c, "?")), types.get(c, "?"))
            for c, v in h["_source"].items()
        }
        for h in every_document(search_url, index_name(index_prefix, table), page=5000)
    }


def diff(leader: Mapping[str, Any], follower: Mapping[str, Any], limit: int = 5) -> str:
    """A short, readable account of how two states differ ('' when equal)."""
    missing = sorted(set(leader) - set(follower))
    extra = sorted(set(follower) - set(leader))
    changed = [k for k in leader if k in follower and leader[k] != follower[k]]
    if not (missing or extra or changed):
        return ""
    lines = [f"{len(missing)} missing, {len(extra)} extra, {len(changed)} differ"]
    lines += [f"missing {k}: {leader[k]}" for k in missing[:limit]]
    lines += [f"extra {k}: {follower[k]}" for k in extra[:limit]]
    for k in changed[:limit]:
        cols = [c for c in leader[k] if leader[k].get(c) != follower[k].get(c)]
        cols += [c for c in follower[k] if c not in leader[k]]
        lines.append(
            f"differs {k}: "
            + ", ".join(
                f"{c}: {str(leader[k].get(c))[:40]!r} vs {str(follower[k].get(c))[:40]!r}"
                for c in cols
            )
        )
    return "\n".join(lines)
