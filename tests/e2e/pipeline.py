"""Drive the whole pipeline from tests: the reader and the sync jobs as real processes.

Everything here talks to real servers; nothing is mocked. Each helper takes a `Pipeline`,
which names this test's own database, slot, topic prefix, index prefix and key prefix.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import redis
from opensearchpy import OpenSearch

from tests.conftest import ROOT, Endpoints

SPARK_SUBMIT = ROOT / "scripts" / "spark-submit"
CDC = [sys.executable, "-m", "cdc"]


@dataclass(frozen=True)
class Pipeline:
    endpoints: Endpoints
    dsn: str
    name: str  # slot, publication and topic prefix
    index_prefix: str
    key_prefix: str
    checkpoint_dir: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
        env.update(
            CDC_POSTGRES__DSN=self.dsn,
            CDC_POSTGRES__SLOT_NAME=self.name,
            CDC_POSTGRES__PUBLICATION_NAME=self.name,
            CDC_KAFKA__BOOTSTRAP_SERVERS=self.endpoints.kafka_bootstrap,
            CDC_KAFKA__TOPIC_PREFIX=self.name,
            CDC_KAFKA__DEAD_LETTER_TOPIC=f"{self.name}.dlq",
            CDC_REDIS__URL=self.endpoints.redis_url,
            CDC_REDIS__KEY_PREFIX=self.key_prefix,
            CDC_SEARCH__URL=self.endpoints.search_url,
            CDC_SEARCH__INDEX_PREFIX=self.index_prefix,
            CDC_SPARK__CHECKPOINT_DIR=str(self.checkpoint_dir),
        )
        env.update(extra)
        return env

    def with_follower(self, suffix: str) -> Pipeline:
        """The same topics, a brand-new follower: new index, key prefix and checkpoints."""
        return replace(
            self,
            index_prefix=f"{self.index_prefix}{suffix}".lower(),
            key_prefix=f"{self.key_prefix}{suffix}",
            checkpoint_dir=self.checkpoint_dir.with_name(self.checkpoint_dir.name + suffix),
        )


def run_reader_until_current(p: Pipeline, timeout: float = 600) -> None:
    out = subprocess.run(
        [*CDC, "run", "--until", "current"],
        env=p.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, f"cdc run failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


def start_job(p: Pipeline, job: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """Start a sync job through scripts/spark-submit in its own process group."""
    with log.open("ab") as f:
        return subprocess.Popen(
            [str(SPARK_SUBMIT), f"spark_jobs/{job}.py", *args],
            env=p.env(),
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run_jobs_available_now(
    p: Pipeline, jobs: tuple[str, ...], log_dir: Path, *args: str, timeout: float = 900
) -> None:
    """Run the jobs side by side with --available-now; each must exit 0."""
    procs = {
        job: start_job(p, job, "--available-now", *args, log=log_dir / f"{job}.log") for job in jobs
    }
    deadline = time.monotonic() + timeout
    for job, proc in procs.items():
        try:
            rc = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise AssertionError(f"{job} did not finish; log: {log_dir / f'{job}.log'}") from None
        assert rc == 0, f"{job} exited {rc}:\n{tail(log_dir / f'{job}.log')}"


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Kill the job's whole process group (spark-submit's JVM and its Python workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait(60)


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


# --- state of the leader and the followers, in one comparable form -------------------------


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


def column_types(dsn: str, table: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (table,),
        ).fetchall()
    return dict(rows)


def leader_state(dsn: str, table: str, key: str = "id") -> dict[str, dict[str, Any]]:
    types = column_types(dsn, table)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT to_jsonb(t) FROM {table} t").fetchall()
    return {str(r[key]): {c: canonical(v, types[c]) for c, v in r.items()} for (r,) in rows}


def cache_state(p: Pipeline, table: str) -> dict[str, dict[str, Any]]:
    import orjson

    types = column_types(p.dsn, table)
    r = redis.Redis.from_url(p.endpoints.redis_url)
    prefix = f"{p.key_prefix}:{table}:"
    out: dict[str, dict[str, Any]] = {}
    try:
        for k in r.scan_iter(match=f"{prefix}*", count=5000):
            fields = r.hgetall(k)
            row = {f.decode(): orjson.loads(v) for f, v in fields.items()}
            out[k.decode()[len(prefix) :]] = {
                c: canonical(v, types.get(c, "?")) for c, v in row.items()
            }
    finally:
        r.close()
    return out


def search_state(p: Pipeline, table: str) -> dict[str, dict[str, Any]]:
    types = column_types(p.dsn, table)
    client = OpenSearch(p.endpoints.search_url, timeout=60)
    index = f"{p.index_prefix}-{table}".lower()
    out: dict[str, dict[str, Any]] = {}
    try:
        if not client.indices.exists(index=index):
            return out
        client.indices.refresh(index=index)
        after: list[Any] | None = None
        while True:
            body: dict[str, Any] = {
                "size": 5000,
                "sort": [{"_id": "asc"}],
                "query": {"match_all": {}},
            }
            if after:
                body["search_after"] = after
            hits = client.search(index=index, body=body)["hits"]["hits"]
            if not hits:
                break
            for h in hits:
                out[h["_id"]] = {
                    c: canonical(v, types.get(c, "?")) for c, v in h["_source"].items()
                }
            after = hits[-1]["sort"]
    finally:
        client.close()
    return out


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
