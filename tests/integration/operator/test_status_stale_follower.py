"""``cdc status`` on real servers: a follower whose watermark has not advanced for longer
than ``spark.watermark_stale_s`` while the reader acknowledged changes past it is unhealthy
(exit 3, naming the job and the watermark's age); an up-to-date one, or an old watermark of
an idle database, is healthy. Watermarks are written through the sinks' own functions, as a
job writes them, so no Spark job runs here."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import Settings
from sinks.cache import CacheSink
from sinks.search import SearchSink
from tests.conftest import Endpoints, wait_until
from tests.e2e.pipeline import CDC, Pipeline, run_reader_until_current
from tests.integration.reader_support import ROOT

pytestmark = pytest.mark.integration

STALE_S = 2.0  # spark.watermark_stale_s for these runs


def _status(p: Pipeline, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [*CDC, "status", *args],
        env=p.env(CDC_SPARK__WATERMARK_STALE_S=str(STALE_S)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


def _record(p: Pipeline, job: str, lsn: int) -> None:
    """The job's watermark, recorded as the job records it (its sink's own function)."""
    settings = Settings(
        redis={"url": p.endpoints.redis_url, "key_prefix": p.key_prefix},  # type: ignore[arg-type]
        search={"url": p.endpoints.search_url, "index_prefix": p.index_prefix},  # type: ignore[arg-type]
    )
    sink = (
        CacheSink.from_settings(settings.redis)
        if job == CACHE_JOB
        else SearchSink.from_settings(settings.search)
    )
    try:
        sink.record_watermark(job, lsn)
    finally:
        sink.close()


def _last_commit(p: Pipeline) -> Lsn:
    """The reader's last acknowledged commit (what it put in Kafka), from its state."""
    _code, out = _status(p, "--json")
    return Lsn.parse(json.loads(out)["state"]["last_commit_lsn"])


def test_status_is_unhealthy_when_changes_wait_for_a_stale_follower(
    endpoints: Endpoints,
    pg_database: str,
    topic_prefix: str,
    index_prefix: str,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    p = Pipeline(endpoints, pg_database, topic_prefix, index_prefix, key_prefix, tmp_path / "ck")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 20) g")
    run_reader_until_current(p)  # the snapshot
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (21, 'streamed')")
    run_reader_until_current(p)  # a streamed commit
    first = _last_commit(p)
    # Both followers applied it, then the database stays idle past the
    # threshold: old watermarks, nothing waiting, healthy.
    _record(p, CACHE_JOB, first.value)
    _record(p, SEARCH_JOB, first.value)
    statuses: list[dict[str, Any]] = []

    def aged() -> bool:
        _code, out = _status(p, "--json")
        statuses.append(json.loads(out))
        ages = [
            statuses[-1]["followers"][job]["watermark_age_s"] for job in (CACHE_JOB, SEARCH_JOB)
        ]
        return all(age is not None and age > STALE_S for age in ages)

    wait_until(aged, timeout=60, interval=0.5, what="both watermarks older than the threshold")
    assert statuses[-1]["healthy"], statuses[-1]["problems"]

    # New changes, acknowledged by the reader: search_sync's watermark stays where it was
    # (a stopped job), cache_sync's advances (a running one).
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE items SET name = name || '!' WHERE id <= 5")
    run_reader_until_current(p)
    second = _last_commit(p)
    assert second > first
    _record(p, CACHE_JOB, second.value)

    code, out = _status(p, "--json")
    status = json.loads(out)
    print(json.dumps(status["followers"], indent=1), status["problems"])
    assert code == 3, out
    (problem,) = status["problems"]
    assert problem.startswith(f"follower {SEARCH_JOB}: watermark {first} has not advanced for ")
    assert f"while the reader acknowledged changes up to {second}" in problem
    search, cache = status["followers"][SEARCH_JOB], status["followers"][CACHE_JOB]
    assert search["watermark_age_s"] > STALE_S
    # Recorded just now (how long `cdc status` took to start is the machine's, not a rule's):
    # younger than the stale one, and not a problem, as the one problem above says.
    assert cache["watermark"] == str(second)
    assert cache["watermark_age_s"] < search["watermark_age_s"]

    # The readable status: each watermark's age in the followers' table, the problem named.
    code, text = _status(p)
    print(text)
    assert code == 3
    assert f"unhealthy: follower {SEARCH_JOB}: watermark {first} has not advanced" in text
    assert re.search(rf"{SEARCH_JOB}\W+{first}\W+\d+\.\ds ago", text), text
    assert "UNHEALTHY" in text

    # search_sync catches up: healthy again.
    _record(p, SEARCH_JOB, second.value)
    code, out = _status(p, "--json")
    assert code == 0, json.loads(out)["problems"]
