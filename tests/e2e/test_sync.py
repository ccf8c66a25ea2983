"""The shared job (spark_jobs/sync.py): one query keeps both followers in sync, and a
follower that stays unreachable falls behind and catches up without holding the other.

Real PostgreSQL, reader, Kafka, Spark, Redis and OpenSearch; the search follower is cut off
through a TCP proxy (tests/e2e/proxy.py), the shared server itself stays up.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from pgcdc.core import native
from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB
from spark_jobs.checkpoint_lock import LOCK_FILE
from tests.conftest import Endpoints, wait_until
from tests.e2e.pipeline import (
    Pipeline,
    cache_state,
    cache_watermark,
    diff,
    kill_group,
    leader_state,
    new_pipeline,
    run_jobs_available_now,
    run_reader_until_current,
    search_state,
    search_watermark,
    start_job,
    start_reader,
    tail,
)
from tests.e2e.proxy import Proxy
from tests.integration.reader_support import KILLER, slot_row
from tests.integration.real_databases.support import cleanup

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

TABLE = "public.items"
SCHEMA = "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, n int);"
ROWS = 200
FOLLOWERS = ("--followers", "cache,search")


@pytest.fixture(scope="module")
def pipeline(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    p = new_pipeline(endpoints, "sync", SCHEMA, tmp_path_factory.mktemp("ckpt"))
    try:
        yield p
    finally:
        cleanup(p)


def _write(p: Pipeline, wave: int, read: bool = True) -> None:
    """Every row written again (inserted at wave 0), a few deleted and re-inserted; then
    the reader run to the current position (unless one is running)."""
    with psycopg.connect(p.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO items SELECT i, %s || i, %s FROM generate_series(1, %s) i "
            "ON CONFLICT (id) DO UPDATE SET name = excluded.name, n = excluded.n",
            (f"w{wave}-", wave, ROWS),
        )
        conn.execute("DELETE FROM items WHERE id %% 50 = %s", (wave % 50,))
    if read:
        run_reader_until_current(p)


def _equal(p: Pipeline, state: object) -> bool:
    return not diff(leader_state(p.dsn, TABLE), state(p, TABLE))  # type: ignore[operator]


@pytest.mark.parametrize("read", ["spark", "direct", "native", "kafka-planned"])
def test_one_query_keeps_both_followers(pipeline: Pipeline, tmp_path: Path, read: str) -> None:
    """With either read; the direct one in several batches, its checkpoint written through
    Hadoop's FileSystem API (spark.checkpoint_files = filesystem), the other's through
    FileContext (the default); ``native``: the direct read with ``spark.apply = native``
    (spark_jobs/fast_changes.py), whose batches say how many changes it built;
    ``kafka-planned``: the direct read planned by Spark's Kafka source
    (``spark.direct_planner = kafka``), each batch's ranges from its offsets log, going on
    from a checkpoint the Python planner made (as a job does after an upgrade to ``auto``)."""
    if read == "native" and not hasattr(native.module(), "FastChanges"):
        pytest.skip("pgcdc's native module is not built (make install, with cargo)")
    _write(pipeline, {"spark": 0, "direct": 1, "native": 3, "kafka-planned": 4}[read])
    path = "spark" if read == "spark" else "direct"
    planner = "kafka" if read == "kafka-planned" else "python"
    # Each read path with its own checkpoint: the direct one starts from offset 0 too.
    files = "filesystem" if path == "direct" else "filecontext"
    p = replace(
        pipeline,
        checkpoint_dir=pipeline.checkpoint_dir / read,
        settings_env=(
            *pipeline.settings_env,
            ("CDC_SPARK__READ", path),
            ("CDC_SPARK__CHECKPOINT_FILES", files),
            ("CDC_SPARK__APPLY", "native" if read == "native" else "python"),
            ("CDC_SPARK__DIRECT_PLANNER", planner),
        ),
    )
    # The direct read in batches of 150, from offset 0: each batch's ranges come from the
    # checkpoint's offsets log, the first's too (from "earliest": no Spark job collects them).
    limit = ("--max-offsets-per-trigger", "150") if path == "direct" else ()
    before = 0
    if planner == "kafka":
        # The Python planner's batches first, on the same checkpoint; then more writes.
        py = replace(p, settings_env=(*p.settings_env, ("CDC_SPARK__DIRECT_PLANNER", "python")))
        (tmp_path / "python").mkdir()
        run_jobs_available_now(py, ("sync",), tmp_path / "python", *FOLLOWERS, *limit)
        before = len(list((p.checkpoint_dir / "sync" / "commits").glob("[0-9]*")))
        assert before >= 2, before  # batches of 150
        _write(pipeline, 5)
    run_jobs_available_now(p, ("sync",), tmp_path, *FOLLOWERS, *limit)
    log = (tmp_path / "sync.log").read_text(errors="replace")
    assert f" read={path} " in log, log[-3000:]
    assert (f" planner={planner} " in log) == (path == "direct"), log[-3000:]
    logged = "batch 0: the offset ranges come from the checkpoint's offsets log" in log
    assert logged == (path == "direct" and planner == "python"), log[-3000:]
    built = re.findall(r"batch \d+: cache_sync applied=\d+ .* native=(\d+) ", log)
    assert bool(built) == (read == "native"), log[-3000:]
    checkpoint = p.checkpoint_dir / "sync"
    offsets = [f.name for f in (checkpoint / "offsets").iterdir()]
    assert "0" in offsets
    if planner == "kafka":
        # Spark's Kafka source planned batches after the Python planner's, in batches of 150
        # (a fresh checkpoint's first batch, from the initial offsets the Kafka source logs
        # in sources/0/0, is every other e2e test's: `auto` on their local checkpoints).
        assert len([name for name in offsets if name.isdigit()]) >= before + 2, (before, offsets)
        assert re.search(rf"batch {before}: cache_sync applied=[1-9]", log), log[-3000:]
    assert any(name.endswith(".crc") for name in offsets) == (files == "filecontext"), offsets
    assert (checkpoint / LOCK_FILE).exists() == (files == "filesystem")
    for state in (cache_state, search_state):
        problems = diff(leader_state(pipeline.dsn, TABLE), state(pipeline, TABLE))
        assert not problems, f"{state.__name__} differs:\n{problems}"
    # One query read the topics once, for both followers, each counted under its own name.
    assert len(re.findall(r"started sync: followers=cache_sync,search_sync ", log)) == 1, log
    assert "started cache_sync" not in log and "started search_sync" not in log
    # Spark's adaptive execution is off from the start: no WARN that it was turned off.
    assert "ResolveWriteToStream" not in log, log[:6000]
    for job in (CACHE_JOB, SEARCH_JOB):
        assert re.search(rf"batch \d+: {job} applied=[1-9]", log), log[-3000:]


def test_a_follower_that_stays_down_falls_behind_then_catches_up(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    url = urlsplit(pipeline.endpoints.search_url)
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 9200)
    p = replace(
        pipeline,
        settings_env=(
            *pipeline.settings_env,
            ("CDC_SEARCH__URL", proxy.url("http")),
            ("CDC_SPARK__FOLLOWER_BEHIND_AFTER_S", "2"),
            ("CDC_SPARK__TRIGGER_INTERVAL", "300 milliseconds"),
        ),
    )
    log = tmp_path / "sync.log"
    proxy.cut()
    # A running reader, as in production: its heartbeats (one a second) make batches even
    # when nothing changes, and a follower that answers again catches up at the next one.
    reader = start_reader(p, tmp_path / "reader.log")
    job: subprocess.Popen[bytes] | None = None
    try:
        # Batches of 150 records at most: the catch-up (400 records) goes in steps too.
        job = start_job(p, "sync", *FOLLOWERS, "--max-offsets-per-trigger", "150", log=log)
        mark = search_watermark(pipeline, SEARCH_JOB)
        # Search is cut: the cache still converges, and search falls behind.
        _write(p, 1, read=False)
        wait_until(
            lambda: _equal(p, cache_state), timeout=120, interval=0.5, what="the cache, wave 1"
        )
        wait_until(
            lambda: f"{SEARCH_JOB} is behind" in log.read_text(errors="replace"),
            timeout=60,
            interval=0.5,
            what="the log to say search is behind",
        )
        # The cache goes on alone in later batches; search keeps its watermark.
        _write(p, 2, read=False)
        wait_until(
            lambda: _equal(p, cache_state), timeout=60, interval=0.5, what="the cache, wave 2"
        )
        assert not _equal(p, search_state)
        wait_until(
            lambda: (cache_watermark(pipeline, CACHE_JOB) or 0) > (mark or 0),
            timeout=60,
            interval=0.5,
            what="the cache watermark past search's",
        )
        assert search_watermark(pipeline, SEARCH_JOB) == mark
        assert proxy.refused, "the job never tried the search follower"
        assert job.poll() is None, tail(log)
        # A restart (kill -9) while search is behind: the checkpoint says since where.
        kill_group(job)
        job = start_job(p, "sync", *FOLLOWERS, "--max-offsets-per-trigger", "150", log=log)
        wait_until(
            lambda: log.read_text(errors="replace").count("started sync: ") == 2,
            timeout=60,
            interval=0.5,
            what="the job to start again",
        )
        # Search answers again: with no new change, at the next batches (the heartbeats')
        # it replays what it missed, in steps, then rejoins.
        proxy.restore()
        wait_until(
            lambda: _equal(p, search_state), timeout=120, interval=0.5, what="search, caught up"
        )
        # Equal may come before the catch-up's last step says so (its last records were
        # already held): the line is waited for.
        caught_up = re.compile(rf"{SEARCH_JOB} caught up on batches \d+ to \d+ \(")
        wait_until(
            lambda: caught_up.search(log.read_text(errors="replace")),
            timeout=120,
            interval=0.5,
            what="the log to say search caught up",
        )
        text = log.read_text(errors="replace")
        assert f"{SEARCH_JOB} catching up: replayed" in text, text[-3000:]
        assert _equal(p, cache_state)
        wait_until(
            lambda: (search_watermark(pipeline, SEARCH_JOB) or 0) > (mark or 0),
            timeout=60,
            interval=0.5,
            what="the search watermark to advance again",
        )
        assert job.poll() is None, tail(log)
    finally:
        if job is not None:
            kill_group(job)
        kill_group(reader, signal.SIGTERM)
        proxy.close()


def test_both_followers_from_a_transactional_readers_topics_by_either_read(
    endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """``kafka.exactly_once`` (docs/exactly-once.md): readers killed after a commit (the slot
    not yet confirmed) and before one leave aborted transactions and commit markers in the
    topic; the shared job, by the direct read (planned to the last stable offset, read
    committed) and by Spark's Kafka source (``kafka.isolation.level=read_committed``), each
    into followers of its own, makes both followers equal the table."""
    p = new_pipeline(endpoints, "eos", SCHEMA, tmp_path_factory.mktemp("ckpt-eos"))
    p = replace(p, settings_env=(("CDC_KAFKA__EXACTLY_ONCE", "true"),))
    try:
        _write(p, 0)
        for wave, point in enumerate(("after_commit:3", "before_commit:3"), start=1):
            log = tmp_path / f"reader{wave}.log"
            killing = replace(
                p,
                settings_env=(
                    *p.settings_env,
                    ("PGCDC_KILL_AT", point),
                    ("PYTHONPATH", str(KILLER)),
                ),
            )
            proc = start_reader(killing, log)
            _write(p, wave, read=False)
            assert proc.wait(120) == -signal.SIGKILL, tail(log)
            assert f"injected kill: {point.partition(':')[0]}" in tail(log), tail(log)
            wait_until(
                lambda: not _slot_active(p), timeout=30, what="the killed reader's slot released"
            )
        run_reader_until_current(p)
        for read in ("direct", "spark"):
            q = p.with_follower(read)
            q = replace(q, settings_env=(*q.settings_env, ("CDC_SPARK__READ", read)))
            logs = tmp_path / read
            logs.mkdir()
            run_jobs_available_now(q, ("sync",), logs, *FOLLOWERS)
            for state in (cache_state, search_state):
                problems = diff(leader_state(p.dsn, TABLE), state(q, TABLE))
                assert not problems, f"{read}: {state.__name__} differs:\n{problems}"
    finally:
        cleanup(p)


def _slot_active(p: Pipeline) -> bool:
    row = slot_row(p.dsn, p.name)
    return row is not None and row[0]
