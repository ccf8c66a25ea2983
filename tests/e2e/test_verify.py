"""``cdc verify`` against a running pipeline: a clean one verifies clean, and drift of every
kind, written into each follower by another client, is found key for key.

Real PostgreSQL, reader (streaming, heartbeats each second), Kafka, the shared sync job
(streaming) and both followers. The Redis follower lives in a logical database of its own,
so that ``FLUSHDB`` touches nothing but this test's keys.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import redis
from opensearchpy import OpenSearch

from demo.compare import diff, leader_state
from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB, table_index
from pgcdc.core.durations import duration
from sinks.cache_script import version_bytes
from tests.conftest import ROOT, Endpoints, wait_until
from tests.e2e.pipeline import (
    CDC,
    Pipeline,
    cache_state,
    cache_watermark,
    kill_group,
    new_pipeline,
    search_state,
    search_watermark,
    start_job,
    start_reader,
    tail,
)
from tests.integration.real_databases.support import cleanup
from tests.pg_majors import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

SCHEMA = """
CREATE TABLE items (
    id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2), at timestamptz,
    tags text[], doc jsonb, ratio double precision
);
CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (a, b));
INSERT INTO items
SELECT i, 'item ' || i, i * 1.25, timestamptz '2024-01-02 03:04:05.123456+00' + i * interval '1 h',
       ARRAY['t' || i, 'x'], jsonb_build_object('n', i, 'deep', jsonb_build_array(i, 'é')),
       i / 7.0
FROM generate_series(1, 120) i;
INSERT INTO pairs SELECT i, 'k' || i, i FROM generate_series(1, 30) i;
CREATE TABLE load (id int PRIMARY KEY, n int NOT NULL, note text);
INSERT INTO load SELECT i, 0, 'row ' || i FROM generate_series(1, 3000) i;
"""
ITEMS, PAIRS, LOAD = "public.items", "public.pairs", "public.load"
CDC_VERIFY = [*CDC, "verify", "--fence-timeout", "60"]


def _own_redis_db(url: str) -> str:
    """The stack's Redis URL on an empty logical database (from 15 down)."""
    base = url.rsplit("/", 1)[0] if url.count("/") > 2 else url
    for db in range(15, 0, -1):
        candidate = f"{base}/{db}"
        r = redis.Redis.from_url(candidate)
        try:
            if r.dbsize() == 0:
                return candidate
        finally:
            r.close()
    pytest.skip("no empty Redis logical database for the FLUSHDB case")


@dataclass
class Running:
    p: Pipeline
    log_dir: Path


@pytest.fixture(scope="module")
def running(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    own = replace(endpoints, redis_url=_own_redis_db(endpoints.redis_url))
    base = new_pipeline(own, "verify", SCHEMA, tmp_path_factory.mktemp("ckpt"))
    p = replace(base, settings_env=(("CDC_SPARK__TRIGGER_INTERVAL", "500 milliseconds"),))
    log_dir = tmp_path_factory.mktemp("logs")
    reader = start_reader(p, log_dir / "reader.log")
    job: subprocess.Popen[bytes] | None = None
    try:
        job = start_job(p, "sync", "--followers", "cache,search", log=log_dir / "sync.log")
        for table, rows in ((ITEMS, 120), (PAIRS, 30), (LOAD, 3000)):
            wait_until(
                lambda t=table, n=rows: _holds(p, t, n),
                timeout=180,
                interval=0.5,
                what=f"both followers to hold {table}",
            )
        yield Running(p, log_dir)
    finally:
        if job is not None:
            kill_group(job)
        kill_group(reader)
        cleanup(p)
        r = redis.Redis.from_url(own.redis_url)
        r.flushdb()
        r.close()


def _holds(p: Pipeline, table: str, rows: int) -> bool:
    """Both followers hold ``rows`` rows of ``table`` (the snapshot's, all applied)."""
    return len(cache_state(p, table)) == rows and len(search_state(p, table)) == rows


def _cdc(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc", *args],
        env=p.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _verify(p: Pipeline, *args: str) -> tuple[int, dict[str, Any], str]:
    out = _cdc(p, "verify", "--json", "--fence-timeout", "60", *args)
    try:
        found = json.loads(out.stdout)
    except ValueError:
        pytest.fail(f"cdc verify printed no JSON (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return out.returncode, found, out.stderr


def _by(found: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["table"], r["follower"]): r for r in found["results"]}


def _keys(result: dict[str, Any], kind: str) -> set[str]:
    entry = result[kind]
    assert entry["count"] == len(entry["examples"]) or entry["count"] > 5, entry
    return set(entry["examples"])


def test_a_clean_pipeline_verifies_clean(running: Running) -> None:
    code, found, err = _verify(running.p)
    assert code == 0, (found, err)
    assert found["clean"] is True
    results = _by(found)
    tables = {ITEMS: 120, PAIRS: 30, LOAD: 3000}
    assert set(results) == {(t, f) for t in tables for f in ("cache", "search")}
    for r in results.values():
        assert r["leader_rows"] == r["follower_rows"] == tables[r["table"]]
        # Folded inside each store: no bucket differed, so no row was read back.
        assert r["folded"] is True and r["buckets_read"] == 0, r
        assert r["missing"]["count"] == r["extra"]["count"] == r["differ"]["count"] == 0
    # The human form says so too.
    text = _cdc(running.p, "verify", "--follower", "cache", "items")
    assert text.returncode == 0, text.stderr
    assert "clean: every follower equals PostgreSQL" in text.stdout
    assert "public.pairs" not in text.stdout  # only the table asked for


# The suite's load: about 280 changes a second, two passes. ``make verify-load`` runs the
# same test alone at the acceptance: 1,000 changes a second, ten passes in a row.
LOAD_TXNS_PER_SECOND = float(os.environ.get("VERIFY_LOAD_TXNS_PER_SECOND", "6"))
LOAD_PASSES = int(os.environ.get("VERIFY_LOAD_PASSES", "2"))


def test_a_live_load_shows_no_drift(running: Running) -> None:
    """Changes (updates, and deletes with re-inserts; 47 a transaction) into one table while
    ``cdc verify`` checks it pass after pass: no pass reports drift, changes land in the
    followers during each pass, and the fence had in-flight differences to settle."""
    p = running.p
    stop = threading.Event()
    written = [0]
    failures: list[BaseException] = []

    def write() -> None:
        rng = random.Random(7)
        try:
            with psycopg.connect(p.dsn, autocommit=True) as conn:
                start = time.monotonic()
                for tx in itertools.count():
                    if stop.is_set():
                        return
                    ids = rng.sample(range(1, 3001), 45)
                    churn = 3001 + tx % 200
                    with conn.transaction():
                        conn.execute("UPDATE load SET n = n + 1 WHERE id = ANY(%s)", (ids,))
                        conn.execute("DELETE FROM load WHERE id = %s", (churn,))
                        conn.execute(
                            "INSERT INTO load VALUES (%s, %s, 'churn') "
                            "ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n",
                            (churn + 100, tx),
                        )
                    written[0] += 47
                    # Paced: 6 transactions (about 280 changes) a second by default.
                    stop.wait(max(0.0, start + (tx + 1) / LOAD_TXNS_PER_SECOND - time.monotonic()))
        except BaseException as e:  # reported by the test below
            failures.append(e)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    passes = []
    try:
        wait_until(lambda: written[0] >= 600, timeout=30, what="the load to get going")
        for _ in range(LOAD_PASSES):
            before = (written[0], search_watermark(p, SEARCH_JOB), cache_watermark(p, CACHE_JOB))
            t0 = time.monotonic()
            code, found, err = _verify(p, "load")
            seconds = time.monotonic() - t0
            after = (written[0], search_watermark(p, SEARCH_JOB), cache_watermark(p, CACHE_JOB))
            passes.append((code, found, before, after, seconds))
            assert not failures, failures
            assert code == 0 and found["drift"] is False, (json.dumps(found), err)
            # Folded inside the stores; the buckets of keys in flight read row by row.
            assert all(r["folded"] for r in found["results"]), found
    finally:
        stop.set()
        writer.join(30)
    rates = [round((a[0] - b[0]) / secs) for _, _, b, a, secs in passes]
    asked = 47 * LOAD_TXNS_PER_SECOND
    assert min(rates) >= 0.8 * asked, f"the load fell behind its pace of {asked:.0f}/s: {rates}"
    candidates = 0
    buckets = [sum(r["buckets_read"] for r in x[1]["results"]) for x in passes]
    for _, found, before, after, _ in passes:
        assert after[0] > before[0]  # the load went on during the pass
        assert (after[1] or 0) > (before[1] or 0) and (after[2] or 0) > (before[2] or 0)
        candidates += sum(r["candidates"] for r in found["results"])
    # The followers trailed the load: the first passes found keys in flight, which the
    # fenced re-checks cleared instead of reporting them.
    assert candidates > 0, passes
    print(
        f"live load: changes/s during each pass {rates}, passes took "
        f"{[round(x[4], 1) for x in passes]} s, {candidates} candidates settled, buckets read "
        f"row by row {buckets}"
    )


def test_drift_of_every_kind_is_found_exactly(running: Running) -> None:
    p = running.p
    ep = p.endpoints
    r = redis.Redis.from_url(ep.redis_url)
    search = OpenSearch(ep.search_url)
    row_key = f"{p.key_prefix}:{ITEMS}:{{}}"
    index = table_index(p.index_prefix, ITEMS)
    try:
        # Row 3 as it is now: a backup's copy, restored later over a newer state.
        old_fields = r.hgetall(row_key.format(3))
        old_source = search.get(index=index, id="3")["_source"]
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET name = 'renamed' WHERE id = 3")
        wait_until(
            lambda: (
                cache_state(p, ITEMS)["3"]["name"] == "renamed"
                and search_state(p, ITEMS)["3"]["name"] == "renamed"
            ),
            timeout=60,
            interval=0.3,
            what="the update of row 3 in both followers",
        )
        # Another client's writes. Redis: a row deleted, a field changed, a key added, and
        # row 3 restored from the backup with its old version.
        r.delete(row_key.format(1))
        r.hset(row_key.format(2), "name", orjson.dumps("changed by hand"))
        r.hset(row_key.format(9001), mapping={"id": b"9001", "name": b'"stray"'})
        version_key = f"{p.key_prefix}:__v__:{{{row_key.format(3)}}}:{ITEMS}:3"
        held = r.get(version_key)
        assert held is not None
        r.delete(row_key.format(3))
        r.hset(row_key.format(3), mapping=old_fields)
        r.set(version_key, version_bytes(1, 0))
        # OpenSearch: the same kinds on other keys.
        search.delete(index=index, id="4", params={"refresh": "true"})
        src5 = search.get(index=index, id="5")["_source"]
        search.index(index=index, id="5", body={**src5, "price": "0.01"})
        search.index(index=index, id="9002", body={"id": 9002, "name": "stray"})
        search.index(index=index, id="3", body=old_source)
        search.indices.refresh(index=index)

        code, found, err = _verify(p, ITEMS, PAIRS)
        assert code == 3, (found, err)
        assert found["clean"] is False
        got = _by(found)
        cache, hits = got[(ITEMS, "cache")], got[(ITEMS, "search")]
        assert (_keys(cache, "missing"), _keys(cache, "extra"), _keys(cache, "differ")) == (
            {"1"},
            {"9001"},
            {"2", "3"},
        )
        assert (_keys(hits, "missing"), _keys(hits, "extra"), _keys(hits, "differ")) == (
            {"4"},
            {"9002"},
            {"3", "5"},
        )
        for result in (cache, hits):
            assert result["folded"] is True and 1 <= result["buckets_read"] <= 4, result
            assert result["unsettled"]["count"] == 0
            # Each key was confirmed by two fenced re-checks in fresh snapshots.
            assert result["rechecks"] == 2 and result["candidates"] == 4
        for follower in ("cache", "search"):
            assert got[(PAIRS, follower)]["clean"] is True

        # Whole stores lost: the pairs index dropped, the cache's Redis database flushed.
        search.indices.delete(index=table_index(p.index_prefix, PAIRS))
        r.flushdb()
        # The job records its watermark again at its next batch (the reader's heartbeats).
        wait_until(
            lambda: cache_watermark(p, CACHE_JOB) is not None,
            timeout=60,
            interval=0.3,
            what="the cache watermark recorded again after FLUSHDB",
        )
        assert search_watermark(p, SEARCH_JOB) is not None
        code, found, err = _verify(p, ITEMS, PAIRS)
        assert code == 3, (found, err)
        got = _by(found)
        for table, rows in ((ITEMS, 120), (PAIRS, 30)):
            lost = got[(table, "cache")]
            assert lost["missing"]["count"] == rows and lost["follower_rows"] == 0
            assert lost["extra"]["count"] == lost["differ"]["count"] == 0
        pairs = got[(PAIRS, "search")]
        assert pairs["missing"]["count"] == 30 and pairs["follower_rows"] == 0
        assert all(x["folded"] for x in got.values()), got
        assert set(pairs["missing"]["examples"]) <= {
            json.dumps([i, f"k{i}"], separators=(",", ":")) for i in range(1, 31)
        }
        # The search drift of items is still there, and nothing else.
        hits = got[(ITEMS, "search")]
        assert (_keys(hits, "missing"), _keys(hits, "extra"), _keys(hits, "differ")) == (
            {"4"},
            {"9002"},
            {"3", "5"},
        )
        # One follower at a time, and a table not captured is a settings error.
        code, found, _ = _verify(p, "--follower", "search", ITEMS)
        assert code == 3 and set(_by(found)) == {(ITEMS, "search")}
        code, found, err = _verify(p, "public.nope")
        assert code == 2 and "not captured" in found["error"], err

        # --repair: the reader publishes the missing and differing rows again (a snapshot
        # of those keys), and the followers apply them; the extra key stays, said so.
        code, found, err = _verify(p, "--repair", ITEMS, PAIRS)
        assert code == 3, (found, err)
        sent = {x["table"]: x for x in found["repairs"]}
        # Every items row is missing from the flushed cache, every pairs row from both.
        assert {t: (x["keys"], x["whole_table"]) for t, x in sent.items()} == {
            ITEMS: (120, False),
            PAIRS: (30, False),
        }
        assert found["extra_not_repaired"] == 1  # 9002 in the search follower

        def repaired() -> bool:
            _, again, _ = _verify(p, ITEMS, PAIRS)
            return all(
                x["missing"]["count"] == 0 and x["differ"]["count"] == 0 for x in again["results"]
            )

        wait_until(repaired, timeout=180, interval=2, what="the repaired rows in both followers")
        # The pairs index the running job made again when the repair's rows came: the
        # table's mapping (its int columns integer, where OpenSearch's guess is long) and
        # the job's write alias.
        pairs_index = table_index(p.index_prefix, PAIRS)
        made = search.indices.get(index=pairs_index)[pairs_index]
        props = made["mappings"]["properties"]
        assert (props["a"]["type"], props["v"]["type"]) == ("integer", "integer"), props
        assert set(made["aliases"]) == {f"{pairs_index}-W"}, made["aliases"]
        code, found, err = _verify(p, ITEMS, PAIRS)
        got = _by(found)
        assert code == 3 and _keys(got[(ITEMS, "search")], "extra") == {"9002"}, (found, err)
        assert [k for k, x in got.items() if not x["clean"]] == [(ITEMS, "search")]

        # --remove-extra: the follower-only repair deletes the extra keys, in both
        # followers (a stray cache key again, the first went with FLUSHDB); then the pass
        # is clean and each follower equals the table.
        r.hset(row_key.format(9003), mapping={"id": b"9003", "name": b'"stray"'})
        code, found, err = _verify(p, "--remove-extra", ITEMS, PAIRS)
        assert code == 3, (found, err)  # the pass found them; it removed them after
        removed = {(x["follower"], x["table"]): x for x in found["extra_removed"]}
        assert {k: (x["removed"], x["kept"]) for k, x in removed.items()} == {
            ("cache", ITEMS): (["9003"], []),
            ("search", ITEMS): (["9002"], []),
        }
        assert found["extra_not_repaired"] == 0
        assert not r.exists(row_key.format(9003))
        code, found, err = _verify(p, ITEMS, PAIRS)
        assert code == 0 and found["clean"] is True, (found, err)
        leader = leader_state(p.dsn, ITEMS)
        for state in (cache_state, search_state):
            problems = diff(leader, state(p, ITEMS))
            assert not problems, f"{state.__name__}: {problems}"
        with psycopg.connect(p.dsn) as conn:
            (rows,) = conn.execute("SELECT count(*) FROM pairs").fetchone() or (0,)
        assert len(cache_state(p, PAIRS)) == len(search_state(p, PAIRS)) == rows
    finally:
        search.close()
        r.close()


def _metric(text: str, name: str, **labels: str) -> float | None:
    """One sample of a Prometheus text exposition, by name and labels (None: not there)."""
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def _status(p: Pipeline) -> tuple[int, dict[str, Any]]:
    out = _cdc(p, "status", "--json")
    try:
        return out.returncode, json.loads(out.stdout)
    except ValueError:
        pytest.fail(f"cdc status printed no JSON (exit {out.returncode}):\n{out.stderr[-3000:]}")


def test_verify_every_records_each_pass_for_status_and_metrics(running: Running) -> None:
    """``cdc verify --every 1s`` on one table: each pass is recorded for ``cdc status`` and
    counted in its metrics; a row key deleted from the cache between passes is drift in the
    next pass, in both (status unhealthy, exit 3); SIGTERM ends the run with exit 0."""
    p = running.p
    port = free_port()
    log = running.log_dir / "verify-every.log"
    r = redis.Redis.from_url(p.endpoints.redis_url)
    key = f"{p.key_prefix}:{PAIRS}:" + json.dumps([1, "k1"], separators=(",", ":"))
    fields = r.hgetall(key)
    assert fields, key
    every = [*CDC_VERIFY, "--every", "1s", "--metrics-port", str(port), "pairs"]
    with log.open("ab") as f:
        proc = subprocess.Popen(
            every, env=p.env(), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )

    def metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text: str = answer.read().decode()
        return text

    def after(outcome: str, passes: int) -> str | None:
        text = metrics()
        return (
            text
            if (_metric(text, "cdc_verify_passes_total", outcome=outcome) or 0) >= passes
            else None
        )

    try:
        first = wait_until(lambda: after("clean", 2), timeout=120, interval=0.3, what="2 passes")
        assert first is not None
        # 30 keys each pass, on each follower.
        assert (
            _metric(first, "cdc_verify_rows_checked_total", table=PAIRS, follower="cache") or 0
        ) >= 60
        done_at = _metric(first, "cdc_verify_last_pass_completed_timestamp_seconds")
        assert done_at is not None and time.time() - 120 < done_at <= time.time()
        code, status = _status(p)
        verify = status["verify"]
        assert verify["outcome"] == "clean" and verify["every_s"] == 1.0, verify
        assert verify["number"] >= 2
        assert {(c["table"], c["follower"], c["rows_checked"]) for c in verify["checks"]} == {
            (PAIRS, "cache", 30),
            (PAIRS, "search", 30),
        }
        assert code == 0 and status["healthy"] is True, status["problems"]

        r.delete(key)  # drift between passes: a row the cache lost
        drifted = wait_until(lambda: after("drift", 1), timeout=120, interval=0.3, what="drift")
        assert drifted is not None
        missing = {
            f: _metric(
                drifted, "cdc_verify_divergent_keys", table=PAIRS, follower=f, kind="missing"
            )
            for f in ("cache", "search")
        }
        assert missing == {"cache": 1.0, "search": 0.0}, drifted
        code, status = _status(p)
        verify = status["verify"]
        assert code == 3 and verify["outcome"] == "drift", status
        by = {c["follower"]: c for c in verify["checks"]}
        assert by["cache"]["missing"] == 1 and by["cache"]["examples"] == {"missing": ['[1,"k1"]']}
        assert by["search"]["outcome"] == "clean"
        assert [x for x in status["problems"] if "cdc verify" in x] == [
            f"the last pass {verify['number']} of cdc verify --every (finished "
            f"{duration(verify['age_s'])} ago) found drift: {PAIRS} on cache (missing 1); "
            "`cdc verify --repair` publishes the missing and differing rows again "
            "(docs/verify.md)"
        ]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, tail(log)
    finally:
        if proc.poll() is None:
            kill_group(proc)
        r.hset(key, mapping=fields)
        r.close()
    out = log.read_text()
    assert "verify pass 1: 1 table(s) on cache, search, 60 rows checked, clean, in" in out, out
    assert "DRIFT: public.pairs on cache (missing 1), in" in out, out
    assert "stopped after" in out and "Traceback" not in out and "Warning" not in out, out


def test_reads_are_paced_to_the_row_rate(running: Running) -> None:
    """``verify.max_rows_per_second`` holds a pass back: pairs' 30 rows read from PostgreSQL
    and from each follower are 90 rows, which at 20 rows a second (one second's 20 banked)
    take at least 3.5 s; the pass takes a fraction of that unbounded."""
    p = running.p
    out = subprocess.run(
        [*CDC_VERIFY, "--json", "pairs"],
        env=p.env(CDC_VERIFY__MAX_ROWS_PER_SECOND="20"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    # The pass's own time, as recorded for cdc status (the process's start-up aside).
    _, status = _status(p)
    verify = status["verify"]
    assert verify["every_s"] is None and verify["outcome"] == "clean", verify
    assert verify["rows_checked"] == 60 and verify["duration_s"] >= 3.5, verify
