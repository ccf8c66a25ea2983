"""Followers that scale out (issue 12, e2e cases 1-3), on real clusters started for this module:

- a Kafka cluster of three KRaft brokers (topics: 6 partitions, replication factor 3,
  min.insync.replicas=2); one broker is stopped while the reader streams: no change is lost;
- a Spark standalone cluster (a master and two workers, from pyspark's spark-class); the
  cache job runs on it with ``--master spark://…`` and the packed executor virtualenv, and
  one worker is killed (its whole process group) mid-stream: the job goes on and the
  follower converges;
- a Redis Cluster of three masters: the cache follower converges on it, and a replay of every
  topic from offset 0 changes nothing.

The clusters run on their own ports (pgcdc.core.ports) beside the shared stack, with state in
a temporary STACK_DIR, and are stopped when the module ends. PostgreSQL is the shared one.
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import orjson
import psycopg
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from pgcdc.core.ports import HOST, REDIS_CLUSTER_PORTS
from pgcdc.stack import common
from pgcdc.stack.kafka_cluster import KafkaClusterService
from pgcdc.stack.redis_cluster import RedisClusterService
from pgcdc.stack.spark_cluster import SparkCluster, executor_env, native_archive
from tests.conftest import ROOT, Endpoints, unique, wait_until
from tests.e2e.pipeline import (
    SPARK_SUBMIT,
    Pipeline,
    cache_state,
    diff,
    kill_group,
    leader_state,
    run_reader_until_current,
    spark_paths,
    start_reader,
    tail,
)

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

TABLE = "public.items"
PARTITIONS = 6


@dataclass(frozen=True)
class Clusters:
    kafka: KafkaClusterService
    redis: RedisClusterService
    spark: SparkCluster


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    paths = common.Paths(stack=tmp_path_factory.mktemp("clusters"), cache=common.paths().cache)
    c = Clusters(KafkaClusterService(paths), RedisClusterService(paths), SparkCluster(paths))
    # Each cluster is stopped even when stopping another one failed: a node left running
    # keeps its fixed port from the next module that starts that cluster.
    with contextlib.ExitStack() as stops:
        stops.callback(c.kafka.stop)
        stops.callback(c.redis.stop)
        stops.callback(c.spark.stop)
        c.kafka.start()  # the brokers boot while the other clusters start
        c.redis.start()
        c.spark.start()
        # The packed executor env is built once per dependency set (minutes on a fresh
        # clone); built here, while the brokers boot, so that a job's deadlines cover the
        # executors' registration, not this build. spark-submit then finds it in the cache.
        executor_env(paths)
        c.kafka.wait_ready()
        c.redis.wait_ready()
        yield c


@dataclass(frozen=True)
class ClusterPipeline(Pipeline):
    """The shared PostgreSQL, the Kafka cluster, the Redis Cluster."""

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(
            CDC_KAFKA__PARTITIONS=str(PARTITIONS),
            CDC_KAFKA__REPLICATION_FACTOR="3",
            CDC_KAFKA__MIN_INSYNC_REPLICAS="2",
            **extra,
        )


@pytest.fixture(scope="module")
def pipeline(
    endpoints: Endpoints, clusters: Clusters, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterPipeline]:
    name = unique("scale")
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = endpoints.postgres_dsn_for(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, n int NOT NULL, note text)")
        conn.execute("INSERT INTO items SELECT i, 0, 'snapshot' FROM generate_series(1, 1000) i")
    ep = replace(
        endpoints, kafka_bootstrap=clusters.kafka.bootstrap_servers, redis_url=clusters.redis.url
    )
    p = ClusterPipeline(ep, dsn, name, name.lower(), name, tmp_path_factory.mktemp("ckpt"))
    try:
        yield p
    finally:
        # The clusters go away whole; only the shared PostgreSQL needs cleaning.
        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE database = %s AND active_pid IS NOT NULL",
                (name,),
            )
            wait_until(
                lambda: (
                    not conn.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE database = %s AND active", (name,)
                    ).fetchone()
                ),
                timeout=30,
                what="the slot to be released",
            )
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s",
                (name,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the workload and the reader ------------------------------------------------------------


class Workload(threading.Thread):
    """Inserts, updates and deletes on items, ~1,000 changes/s, until stopped."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rnd = dsn, random.Random(seed)
        self.changes = 0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn) as conn:
                next_id = conn.execute("SELECT max(id) FROM items").fetchone()[0] + 1  # type: ignore[index]
                conn.commit()
                while not self.stop_event.is_set():
                    with conn.transaction():
                        for _ in range(50):
                            op = self.rnd.choices("iud", weights=(3, 6, 1))[0]
                            if op == "i":
                                conn.execute("INSERT INTO items VALUES (%s, 0, 'new')", (next_id,))
                                next_id += 1
                            elif op == "u":
                                conn.execute(
                                    "UPDATE items SET n = n + 1, note = %s WHERE id = %s",
                                    (f"u{self.changes}", self.rnd.randrange(1, next_id)),
                                )
                            else:
                                conn.execute(
                                    "DELETE FROM items WHERE id = %s",
                                    (self.rnd.randrange(1, next_id),),
                                )
                            self.changes += 1
                    time.sleep(0.05)
        except BaseException as e:  # surfaced by finish()
            self.error = e

    def finish(self) -> int:
        self.stop_event.set()
        self.join(60)
        assert self.error is None, f"the workload failed: {self.error!r}"
        return self.changes


def stop_reader(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        kill_group(proc)


# --- what the topics and the followers hold -------------------------------------------------


def topic_end(bootstrap: str, topic: str) -> int:
    """Records written to ``topic`` so far (the sum of its partitions' end offsets)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("ends")})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return sum(
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions
        )
    finally:
        c.close()


def topic_view(bootstrap: str, topic: str) -> dict[str, int]:
    """The table as the topic tells it: each key's latest record (``n``), deletes removed."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("view"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        done = {p for p, end in ends.items() if end == 0}
        view: dict[str, int] = {}
        deadline = time.monotonic() + 120
        while len(done) < len(parts):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for m in c.consume(1000, timeout=1):
                if m.error() is not None:
                    continue
                key = str(orjson.loads(m.key())["payload"]["id"])
                value = orjson.loads(m.value()) if m.value() is not None else None
                after = value["payload"]["after"] if value is not None else None
                if after is None:
                    view.pop(key, None)
                else:
                    view[key] = after["n"]
                if m.offset() + 1 >= ends[m.partition()]:
                    done.add(m.partition())
        return view
    finally:
        c.close()


def leader_n(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {str(i): n for i, n in conn.execute("SELECT id, n FROM items")}


def cache_equals_leader(p: Pipeline) -> str:
    """'' when the Redis Cluster follower equals the table, else how they differ."""
    return diff(leader_state(p.dsn, TABLE), cache_state(p, TABLE))


def start_cluster_job(
    p: Pipeline,
    master: str,
    log: Path,
    *args: str,
    checkpoint: Path | None = None,
    read: str | None = None,
) -> subprocess.Popen[bytes]:
    """cache_sync on the standalone cluster: spark-submit's options, then the job's
    (``read``: spark.read, else the suite's)."""
    job_args = [*args, *(["--checkpoint", str(checkpoint)] if checkpoint else [])]
    with log.open("ab") as f:
        return subprocess.Popen(
            [
                str(SPARK_SUBMIT),
                "--master",
                master,
                "--driver-memory",
                "512m",
                "--executor-memory",
                "512m",
                "--total-executor-cores",
                "2",
                "spark_jobs/cache_sync.py",
                *job_args,
            ],
            env=p.env(**({"CDC_SPARK__READ": read} if read else {})),
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def batch_counts(log: Path) -> tuple[int, int]:
    """(applied, skipped) summed over the job's 'batch N: applied=… skipped=…' lines."""
    text = log.read_text(errors="replace")
    pairs = re.findall(r"applied=(\d+) skipped=(\d+)", text)
    return sum(int(a) for a, _ in pairs), sum(int(s) for _, s in pairs)


# --- the cases --------------------------------------------------------------------------------


def test_topics_are_replicated_and_partitioned(pipeline: ClusterPipeline) -> None:
    run_reader_until_current(pipeline)  # the snapshot creates the table topic
    topic = f"{pipeline.name}.{TABLE}"
    admin = AdminClient({"bootstrap.servers": pipeline.endpoints.kafka_bootstrap})
    md = admin.list_topics(topic, timeout=10).topics[topic]
    assert len(md.partitions) == PARTITIONS
    assert all(len(pm.replicas) == 3 for pm in md.partitions.values())
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([res])[res].result(timeout=30)
    assert config["min.insync.replicas"].value == "2"
    assert config["cleanup.policy"].value == "compact"


def test_a_broker_stopped_mid_stream_loses_no_change(
    pipeline: ClusterPipeline, clusters: Clusters, tmp_path: Path
) -> None:
    topic = f"{pipeline.name}.{TABLE}"
    bootstrap = pipeline.endpoints.kafka_bootstrap
    before = topic_end(bootstrap, topic)
    reader = start_reader(pipeline, tmp_path / "reader.log")
    work = Workload(pipeline.dsn, seed=1)
    work.start()
    broker = clusters.kafka.nodes[1]
    try:
        # Mid-stream: the reader has published streamed changes and the workload goes on.
        wait_until(
            lambda: topic_end(bootstrap, topic) >= before + 1500,
            timeout=120,
            interval=0.5,
            what="streamed changes in the topic",
        )
        at_stop = work.changes
        assert reader.poll() is None, tail(tmp_path / "reader.log")
        clusters.kafka.stop_node(broker)
        assert broker.pid() is None
        # The reader goes on with two brokers: more changes reach the topic.
        after_stop = topic_end(bootstrap, topic)
        wait_until(
            lambda: topic_end(bootstrap, topic) >= after_stop + 1500,
            timeout=120,
            interval=0.5,
            what="changes published with one broker down",
        )
        total = work.finish()
        assert total > at_stop, "the broker was stopped after the workload had ended"
    finally:
        work.stop_event.set()
        stop_reader(reader)
    run_reader_until_current(pipeline)
    assert reader.returncode is not None
    view = topic_view(bootstrap, topic)
    leader = leader_n(pipeline.dsn)
    assert view == leader, diff(
        {k: {"n": v} for k, v in leader.items()}, {k: {"n": v} for k, v in view.items()}
    )
    # The broker comes back for the next cases (three brokers, as a cluster runs).
    clusters.kafka.start_node(broker)
    broker.wait_ready()


@pytest.mark.parametrize("read", ["spark", "direct"])
def test_the_cache_job_on_the_standalone_cluster_survives_a_lost_worker(
    pipeline: ClusterPipeline, clusters: Clusters, tmp_path: Path, read: str
) -> None:
    """Both reads: Spark's Kafka source, and the direct read, whose Python data source is
    planned on the driver with the driver's interpreter while its reads run in the
    executors' packed one (spark_jobs.source.register_source)."""
    spark = clusters.spark
    job_log = tmp_path / "cache_sync.log"
    job = start_cluster_job(
        pipeline,
        spark.master_url,
        job_log,
        "--max-offsets-per-trigger",
        "5000",
        "--trigger-interval",
        "500 milliseconds",
        read=read,
        # Each read from the topics' start: the second finds the first's rows applied
        # (skipped as repeats), then applies the workload's.
        checkpoint=tmp_path / "checkpoint",
    )
    reader = start_reader(pipeline, tmp_path / "reader.log")
    work = Workload(pipeline.dsn, seed=2)
    try:
        # Both workers run an executor of the job and it has applied batches.
        wait_until(
            lambda: spark.executors_of(1) >= 1 and spark.executors_of(2) >= 1,
            timeout=180,
            interval=1,
            what=f"an executor on each worker ({job_log})",
        )
        # The fixture built the packed env: this job found it (the deadline above was the
        # executors' registration only).
        assert "building the executors' virtualenv" not in job_log.read_text(errors="replace")
        wait_until(lambda: sum(batch_counts(job_log)) > 0, timeout=180, interval=1, what="batches")
        work.start()
        wait_until(lambda: work.changes >= 1500, timeout=60, interval=0.5, what="the workload")
        # Mid-stream: the job is running and the workload goes on.
        assert job.poll() is None, tail(job_log)
        applied_before_kill = batch_counts(job_log)[0]
        changes_at_kill = work.changes
        executors = spark.executor_pids(1)
        spark.kill_worker(1)
        # The worker and its executor are gone at once (no graceful hand-over).
        wait_until(
            lambda: not any(common.pid_alive(pid) for pid in executors),
            timeout=30,
            what="the killed worker's executor to be gone",
        )
        wait_until(
            lambda: "Lost executor" in job_log.read_text(errors="replace"),
            timeout=120,
            interval=1,
            what="the driver to notice the lost executor",
        )
        wait_until(lambda: work.changes >= 3000, timeout=120, interval=0.5, what="more changes")
        assert work.finish() > changes_at_kill
        stop_reader(reader)
        run_reader_until_current(pipeline)
        # The job goes on with the other worker and converges.
        wait_until(
            lambda: not cache_equals_leader(pipeline),
            timeout=300,
            interval=2,
            what=f"the Redis Cluster follower to converge ({job_log})",
        )
        assert job.poll() is None, f"the job stopped:\n{tail(job_log)}"
        assert batch_counts(job_log)[0] > applied_before_kill
        # The Python planner runs on the driver's Python, the reads on the executors'; with
        # Spark's Kafka source planning (spark.direct_planner: kafka, or auto on this local
        # checkpoint) no Python process plans.
        planned = "the direct read's planner runs on the driver's Python"
        python_planner = spark_paths()["direct_planner"] == "python"
        log_text = job_log.read_text(errors="replace")
        assert (planned in log_text) == (read == "direct" and python_planner)
        if read == "direct":
            assert f" planner={'python' if python_planner else 'kafka'} " in log_text
        if read == "direct" and spark_paths()["apply"] == "native" and native_archive():
            # The native module shipped beside the packed env: the executors took ranges
            # the native way (spark_jobs/fast_changes.py), not only the Python one.
            assert re.search(r" native=[1-9]", job_log.read_text(errors="replace")), tail(job_log)
    finally:
        work.stop_event.set()
        if reader.poll() is None:
            stop_reader(reader)
        kill_group(job)
        spark.start_worker(1)  # back to two workers for whoever comes next


def test_replay_into_the_redis_cluster_is_harmless(
    pipeline: ClusterPipeline, clusters: Clusters, tmp_path: Path
) -> None:
    assert not cache_equals_leader(pipeline)
    held = cache_state(pipeline, TABLE)
    # The rows really are spread over the three masters.
    for port in REDIS_CLUSTER_PORTS:
        node = redis.Redis(host=HOST, port=port)
        try:
            assert node.dbsize() > 0, f"no key on the master at {port}"
        finally:
            node.close()
    log = tmp_path / "replay.log"
    job = start_cluster_job(
        pipeline,
        "local[2]",
        log,
        "--available-now",
        checkpoint=tmp_path / "replay-ckpt",  # a new checkpoint: every topic from offset 0
    )
    assert job.wait(600) == 0, tail(log)
    applied, skipped = batch_counts(log)
    assert applied == 0, f"a replay applied {applied} changes"
    assert skipped >= len(held)
    assert cache_state(pipeline, TABLE) == held
    assert not cache_equals_leader(pipeline)
