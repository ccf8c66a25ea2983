"""The followers converge to the database: real PostgreSQL, reader, Kafka, Spark, OpenSearch, Redis.

One module-scoped pipeline carries a workload of more than 50k changes over three tables,
with primary-key updates and 9 kB out-of-line TOASTed text that later updates leave untouched.
The tests then check convergence, a kill -9 of the jobs mid-batch plus a replay from offset 0,
a rebuild from the compacted topics, and read-your-writes through the followers' watermarks.
"""

from __future__ import annotations

import os
import random
import re
import string
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
import redis

from pgcdc.core.contract import JOBS, SYNC_JOB
from tests.conftest import Endpoints, unique, wait_until
from tests.e2e.pipeline import (
    SHARED_LOG,
    Pipeline,
    cache_state,
    cache_watermark,
    diff,
    kill_group,
    leader_state,
    new_pipeline,
    run_reader_until_current,
    run_shared_available_now,
    search_state,
    search_watermark,
    start_job,
    start_reader,
)
from tests.integration.reader_support import force_compaction
from tests.integration.real_databases.support import cleanup

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

TABLES = ("public.customers", "public.products", "public.orders")

SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text,
                        balance numeric(12,2), updated_at timestamptz DEFAULT now());
CREATE TABLE products (id int PRIMARY KEY, sku text NOT NULL, title text NOT NULL,
                       description text, price numeric(10,2), in_stock boolean);
-- EXTERNAL: stored out of line without compression, so updates that leave it alone send
-- pgoutput's "unchanged TOAST" marker instead of the value.
ALTER TABLE products ALTER COLUMN description SET STORAGE EXTERNAL;
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, total numeric(12,2),
                     status text, note text);
"""


def _text(rnd: random.Random, n: int) -> str:
    return "".join(rnd.choices(string.ascii_letters + " ", k=n))


def run_workload(dsn: str, seed: int, changes_wanted: int) -> int:
    """Inserts, updates, deletes and primary-key updates over three tables; returns the count."""
    rnd = random.Random(seed)
    done = 0
    with psycopg.connect(dsn) as conn:
        # Carry on from what is there: earlier workloads may have run on the same tables.
        live = {t: {r[0] for r in conn.execute(f"SELECT id FROM {t}")} for t in TABLES}
        next_id = {t: max(live[t], default=0) + 1_000_000 for t in TABLES}
        conn.commit()
        while done < changes_wanted:
            with conn.transaction(), conn.cursor() as cur:
                for _ in range(100):
                    table = rnd.choice(TABLES)
                    ids = live[table]
                    op = rnd.choices(("i", "u", "d", "k"), weights=(5, 4, 1, 1))[0] if ids else "i"
                    if op == "i":
                        i = next_id[table]
                        next_id[table] += 1
                        if table == "public.customers":
                            cur.execute(
                                "INSERT INTO customers (id, name, email, balance) "
                                "VALUES (%s, %s, %s, %s)",
                                (
                                    i,
                                    _text(rnd, 12),
                                    f"c{i}@example.com",
                                    rnd.randint(0, 10**6) / 100,
                                ),
                            )
                        elif table == "public.products":
                            cur.execute(
                                "INSERT INTO products VALUES (%s, %s, %s, %s, %s, %s)",
                                (
                                    i,
                                    f"SKU-{i}",
                                    _text(rnd, 20),
                                    _text(rnd, 9000) if i % 3 == 0 else _text(rnd, 50),
                                    rnd.randint(100, 99999) / 100,
                                    rnd.random() < 0.8,
                                ),
                            )
                        else:
                            cur.execute(
                                "INSERT INTO orders VALUES (%s, %s, %s, %s, %s)",
                                (
                                    i,
                                    rnd.randint(1, 1000),
                                    rnd.randint(100, 10**6) / 100,
                                    "new",
                                    _text(rnd, 30),
                                ),
                            )
                        ids.add(i)
                    else:
                        i = rnd.choice(tuple(ids))
                        if op == "u":
                            if table == "public.customers":
                                cur.execute(
                                    "UPDATE customers SET balance = balance + 1, updated_at = now() "
                                    "WHERE id = %s",
                                    (i,),
                                )
                            elif table == "public.products":
                                if rnd.random() < 0.2:  # a new large description
                                    cur.execute(
                                        "UPDATE products SET description = %s WHERE id = %s",
                                        (_text(rnd, 9000), i),
                                    )
                                else:  # leaves the TOASTed description untouched
                                    cur.execute(
                                        "UPDATE products SET price = price + 0.01, "
                                        "in_stock = NOT in_stock WHERE id = %s",
                                        (i,),
                                    )
                            else:
                                cur.execute(
                                    "UPDATE orders SET status = %s WHERE id = %s",
                                    (rnd.choice(("paid", "shipped", "done")), i),
                                )
                        elif op == "d":
                            cur.execute(f"DELETE FROM {table} WHERE id = %s", (i,))
                            ids.discard(i)
                        else:  # the primary key itself changes
                            new = next_id[table]
                            next_id[table] += 1
                            cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (new, i))
                            ids.discard(i)
                            ids.add(new)
                    done += 1
    return done


@pytest.fixture(scope="module")
def pipeline(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    p = new_pipeline(endpoints, "e2e", SCHEMA, tmp_path_factory.mktemp("ckpt"))
    try:
        yield p
    finally:
        _cleanup(p)


def _cleanup(p: Pipeline) -> None:
    """Drop the pipeline's slots, database, topics, indices and keys."""
    cleanup(p)


def assert_followers_equal_leader(p: Pipeline) -> None:
    for table in TABLES:
        leader = leader_state(p.dsn, table)
        assert leader, f"{table} is empty: the workload did nothing"
        problems = diff(leader, cache_state(p, table))
        assert not problems, f"Redis differs from {table}:\n{problems}"
        problems = diff(leader, search_state(p, table))
        assert not problems, f"OpenSearch differs from {table}:\n{problems}"


# The streamed workload's size (`make test-containers` may run these tests on testcontainers
# with less: there they show that the containers serve the pipeline).
STREAMED = int(os.environ.get("CDC_TEST_FOLLOWERS_CHANGES", "50000"))


@pytest.fixture(scope="module")
def converged(pipeline: Pipeline, tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    """Snapshot some rows, stream a 50k-change workload, run both jobs to the end."""
    run_workload(pipeline.dsn, seed=1, changes_wanted=5_000)  # present before the snapshot
    run_reader_until_current(pipeline)
    n = run_workload(pipeline.dsn, seed=2, changes_wanted=STREAMED)
    assert n >= STREAMED
    run_reader_until_current(pipeline)
    _produce_poison(pipeline)
    run_shared_available_now(pipeline, tmp_path_factory.mktemp("logs"))
    return pipeline


def _produce_poison(p: Pipeline) -> None:
    """A record in a table topic that is not a Debezium event: it must be dead-lettered."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": p.endpoints.kafka_bootstrap})
    producer.produce(f"{p.name}.public.orders", key=b'{"id": -1}', value=b"{not an event")
    assert producer.flush(30) == 0


def test_poison_message_goes_to_the_dead_letter_topic(converged: Pipeline) -> None:
    import orjson
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": converged.endpoints.kafka_bootstrap,
            "group.id": unique("dlq"),
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([f"{converged.name}.dlq"])
    letters: list[dict[str, object]] = []

    def both_jobs_reported() -> bool:
        for m in consumer.consume(100, timeout=1):
            if m.error() is None:
                letters.append(orjson.loads(m.value()))
        return {str(x["job"]) for x in letters} >= set(JOBS)

    try:
        wait_until(both_jobs_reported, timeout=120, interval=0, what="dead letters from both jobs")
    finally:
        consumer.close()
    for letter in letters:
        assert letter["value"] == "{not an event"
        assert letter["reason"] == "value is not a Debezium event"
        assert letter["topic"] == f"{converged.name}.public.orders"


def test_followers_converge_to_the_database(converged: Pipeline) -> None:
    # The workload really produced unchanged-TOAST events (else this test proves little).
    assert_followers_equal_leader(converged)
    big = leader_state(converged.dsn, "public.products")
    assert any(len(r["description"] or "") >= 8000 for r in big.values())


def test_kill_mid_batch_then_restart_and_replay_from_zero(
    converged: Pipeline, tmp_path: Path
) -> None:
    # Changes after the module's run; the topics' ~60,000 records from it give the killed job
    # six batches to be in the middle of (10,000 more changes added 20 s and proved no more).
    run_workload(converged.dsn, seed=3, changes_wanted=1_000)
    run_reader_until_current(converged)

    fresh = converged.with_follower("k")
    followers = ("--followers", "cache,search")
    killed_log = tmp_path / "killed" / SHARED_LOG
    killed_log.parent.mkdir()
    proc = start_job(
        fresh,
        SYNC_JOB,
        *followers,
        "--max-offsets-per-trigger",
        "10000",  # several batches (the topics hold about 60,000 records), few JVM round trips
        "--trigger-interval",
        "100 milliseconds",
        log=killed_log,
    )
    # Wait until a first batch is committed and the cache holds rows, then kill the job
    # mid-stream (rows, not the watermark: under a rate limit it waits for the end of the
    # topics).
    commits = fresh.checkpoint_dir / SYNC_JOB / "commits"

    def committed() -> list[int]:
        return sorted(int(f.name) for f in commits.glob("[0-9]*")) if commits.is_dir() else []

    wait_until(
        lambda: committed() and cache_state(fresh, "public.orders"),
        timeout=600,
        interval=0.5,
        what="a first committed batch",
    )
    kill_group(proc)
    partial = cache_state(fresh, "public.orders")
    last = committed()
    # Restart from the same checkpoint: the killed batch is replayed; versions make it
    # harmless. The restart numbers its batches on from the last committed one: it resumed.
    run_shared_available_now(fresh, tmp_path)
    assert partial is not None and last, (partial, last)
    restarted = [
        int(m.group(1))
        for m in re.finditer(
            r"batch (\d+): cache_sync applied=", (tmp_path / SHARED_LOG).read_text()
        )
    ]
    assert restarted and min(restarted) > last[-1], (last, restarted)
    assert_followers_equal_leader(fresh)

    # Replay everything from offset 0 into the same followers with new checkpoints.
    replay = Pipeline(
        fresh.endpoints,
        fresh.dsn,
        fresh.name,
        fresh.index_prefix,
        fresh.key_prefix,
        tmp_path / "replay-ckpt",
    )
    run_shared_available_now(replay, tmp_path)
    assert_followers_equal_leader(fresh)


def test_rebuild_from_compacted_topics(converged: Pipeline, tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    force_compaction(converged.endpoints.kafka_bootstrap, [f"{converged.name}.{t}" for t in TABLES])
    # New writes (more than segment.ms later) roll the active segment, which the cleaner
    # never touches, so the older segments become cleanable.
    run_workload(converged.dsn, seed=4, changes_wanted=300)
    run_reader_until_current(converged)
    consumer = Consumer(
        {
            "bootstrap.servers": converged.endpoints.kafka_bootstrap,
            "group.id": unique("c"),
            "enable.auto.commit": False,
        }
    )

    def compacted() -> bool:
        t = f"{converged.name}.public.orders"
        parts = consumer.list_topics(t, timeout=10).topics[t].partitions
        lo_hi = [consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10) for p in parts]
        lo, hi = sum(x[0] for x in lo_hi), sum(x[1] for x in lo_hi)
        # Count what is left by reading it (every partition): compaction removes records
        # below the end.
        consumer.assign([TopicPartition(t, p, x[0]) for p, x in zip(parts, lo_hi, strict=True)])
        seen = 0
        while True:
            msgs = consumer.consume(5000, timeout=2)
            if not msgs:
                break
            seen += len(msgs)
        live = len(leader_state(converged.dsn, "public.orders"))
        return seen < (hi - lo) or seen <= live * 1.5

    wait_until(compacted, timeout=300, interval=2, what="the cleaner to compact the orders topic")
    consumer.close()

    fresh = converged.with_follower("r")
    run_shared_available_now(fresh, tmp_path)
    assert_followers_equal_leader(fresh)


def test_read_your_writes_through_the_watermark(converged: Pipeline, tmp_path: Path) -> None:
    from opensearchpy import OpenSearch

    # The index never refreshes by itself: only the job's refresh after each batch, before
    # it records the batch's watermark (search.refresh_after_batch), makes the row searchable.
    fresh = converged.with_follower("w")
    fresh = replace(
        fresh, settings_env=(*fresh.settings_env, ("CDC_SEARCH__REFRESH_INTERVAL", "-1"))
    )
    reader = start_reader(fresh, tmp_path / "reader.log")
    # Both followers by the shared job, streaming; each records its own watermark.
    jobs = [
        start_job(
            fresh,
            SYNC_JOB,
            "--followers",
            "cache,search",
            "--trigger-interval",
            "200 milliseconds",
            log=tmp_path / SHARED_LOG,
        )
    ]
    try:
        marker = unique("ryw")
        with psycopg.connect(converged.dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO customers (id, name, email, balance) VALUES (%s, %s, %s, 1)",
                (10_000_000, marker, f"{marker}@example.com"),
            )
            # After COMMIT, the server's WAL position is past our commit record: once a
            # follower's watermark reaches it, our row must be there.
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        hi, lo = (int(x, 16) for x in row[0].split("/"))
        my_lsn = hi << 32 | lo

        def passed(job: str) -> bool:
            w = _watermark_any(fresh, job)
            return w is not None and w >= my_lsn

        wait_until(
            lambda: passed("cache_sync") and passed("search_sync"),
            timeout=600,
            interval=0.2,
            what="both watermarks to pass the commit LSN",
        )
        r = redis.Redis.from_url(fresh.endpoints.redis_url)
        assert (
            r.hget(f"{fresh.key_prefix}:public.customers:10000000", "name")
            == f'"{marker}"'.encode()
        )
        r.close()
        client = OpenSearch(fresh.endpoints.search_url)
        index = f"{fresh.index_prefix}-public.customers"
        hits = client.search(index=index, body={"query": {"match": {"name": marker}}})
        interval = client.indices.get_settings(index=index, name="index.refresh_interval")
        client.close()
        assert [h["_id"] for h in hits["hits"]["hits"]] == ["10000000"]
        assert [s["settings"]["index"]["refresh_interval"] for s in interval.values()] == ["-1"]
    finally:
        for j in jobs:
            kill_group(j)
        reader.terminate()
        reader.wait(60)


def _watermark_any(p: Pipeline, job: str) -> int | None:
    return cache_watermark(p, job) if job == "cache_sync" else search_watermark(p, job)
