"""Drive the whole pipeline from tests: the reader and the sync jobs as real processes.

Everything here talks to real servers; nothing is mocked. Each helper takes a `Pipeline`,
which names this test's own database, slot, topic prefix, index prefix and key prefix.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from demo import compare
from demo.compare import diff, leader_state
from tests.conftest import ROOT, Endpoints

__all__ = [
    "Pipeline",
    "cache_state",
    "cache_watermark",
    "diff",
    "kill_group",
    "leader_state",
    "new_pipeline",
    "run_jobs_available_now",
    "run_reader_until_current",
    "search_state",
    "search_watermark",
    "start_job",
    "start_reader",
    "tail",
]

SPARK_SUBMIT = ROOT / "scripts" / "spark-submit"
CDC = [sys.executable, "-m", "cdc"]


def spark_paths() -> dict[str, str]:
    """How the tests' jobs read, parse, apply and plan (``spark.read``, ``spark.parse``,
    ``spark.apply``, ``spark.direct_planner``): the test run's ``CDC_SPARK__READ``,
    ``CDC_SPARK__PARSE``, ``CDC_SPARK__APPLY`` and ``CDC_SPARK__DIRECT_PLANNER`` (default:
    the settings' defaults), so the same tests prove every path."""
    from pgcdc.core.spark_settings import SparkSettings

    default = SparkSettings(checkpoint_dir="unused")
    return {
        "read": os.environ.get("CDC_SPARK__READ", default.read.value),
        "parse": os.environ.get("CDC_SPARK__PARSE", default.parse.value),
        "apply": os.environ.get("CDC_SPARK__APPLY", default.apply.value),
        "direct_planner": os.environ.get("CDC_SPARK__DIRECT_PLANNER", default.direct_planner.value),
    }


@dataclass(frozen=True)
class Pipeline:
    endpoints: Endpoints
    dsn: str
    name: str  # slot, publication and topic prefix
    index_prefix: str
    key_prefix: str
    checkpoint_dir: Path
    # More settings for every process of this pipeline (e.g. the Avro format), as pairs.
    settings_env: tuple[tuple[str, str], ...] = ()

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
            CDC_SPARK__READ=spark_paths()["read"],
            CDC_SPARK__PARSE=spark_paths()["parse"],
            CDC_SPARK__APPLY=spark_paths()["apply"],
            CDC_SPARK__DIRECT_PLANNER=spark_paths()["direct_planner"],
        )
        env.update(self.settings_env)
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


def new_pipeline(
    endpoints: Endpoints, prefix: str, schema_sql: str, checkpoint_dir: Path
) -> Pipeline:
    """A database of its own holding ``schema_sql``, and the pipeline named after it."""
    import psycopg

    from tests.conftest import unique

    name = unique(prefix)
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = endpoints.postgres_dsn_for(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(schema_sql)
    return Pipeline(
        endpoints=endpoints,
        dsn=dsn,
        name=name,
        index_prefix=name.lower(),
        key_prefix=name,
        checkpoint_dir=checkpoint_dir,
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


def start_reader(p: Pipeline, log: Path) -> subprocess.Popen[bytes]:
    """Start ``cdc run`` (streaming until stopped, a heartbeat every second) in its own
    process group."""
    with log.open("ab") as f:
        return subprocess.Popen(
            [*CDC, "run"],
            env=p.env(),
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


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


SHARED_LOG = "sync.log"  # what run_shared_available_now's job logs, in its log_dir


def run_shared_available_now(p: Pipeline, log_dir: Path, *args: str, timeout: float = 900) -> None:
    """Both followers by the shared job (spark_jobs/sync.py) with --available-now: one JVM,
    one read, as compose and the demo run them (the separate jobs keep tests of their own).
    Each follower's batch lines name it (``batch 3: cache_sync applied=…``)."""
    run_jobs_available_now(
        p, ("sync",), log_dir, "--followers", "cache,search", *args, timeout=timeout
    )


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Kill the job's whole process group (spark-submit's JVM and its Python workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait(60)


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


# --- state of the leader and the followers, in one comparable form (demo.compare) ---------


def cache_state(p: Pipeline, table: str) -> dict[str, dict[str, Any]]:
    return compare.cache_state(p.dsn, p.endpoints.redis_url, p.key_prefix, table)


def search_state(p: Pipeline, table: str) -> dict[str, dict[str, Any]]:
    return compare.search_state(p.dsn, p.endpoints.search_url, p.index_prefix, table)


def cache_watermark(p: Pipeline, job: str) -> int | None:
    """``job``'s watermark in Redis (None: never recorded)."""
    import redis

    from pgcdc.core.contract import redis_watermark_key

    r = redis.Redis.from_url(p.endpoints.redis_url)
    try:
        raw = r.get(redis_watermark_key(p.key_prefix, job))
    finally:
        r.close()
    return int(raw) if raw else None


def search_watermark(p: Pipeline, job: str) -> int | None:
    """``job``'s watermark in OpenSearch (None: never recorded)."""
    from sinks.search import SearchSink

    sink = SearchSink(p.endpoints.search_url, p.index_prefix)
    try:
        return sink.read_watermark(job)
    finally:
        sink.close()


def run_jobs_in_session(spark: Any, p: Pipeline, timeout: float = 600) -> None:
    """Both jobs with ``--available-now`` as queries of this process's Spark session (the
    session fixture, shared by the tests): what ``run_jobs_available_now`` runs through
    spark-submit, without a JVM started per job."""
    from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB, heartbeat_topic, table_topic_pattern
    from pgcdc.core.settings import Settings
    from spark_jobs.apply_loop import ApplyBatch
    from spark_jobs.cache_sync import cache_sink
    from spark_jobs.options import JobOptions
    from spark_jobs.search_sync import search_sink
    from spark_jobs.source import kafka_stream

    ep = p.endpoints
    settings = Settings(
        kafka={  # type: ignore[arg-type]
            "bootstrap_servers": ep.kafka_bootstrap,
            "topic_prefix": p.name,
            "dead_letter_topic": f"{p.name}.dlq",
        },
        redis={"url": ep.redis_url, "key_prefix": p.key_prefix},  # type: ignore[arg-type]
        search={"url": ep.search_url, "index_prefix": p.index_prefix},  # type: ignore[arg-type]
        spark={"checkpoint_dir": str(p.checkpoint_dir), **spark_paths()},  # type: ignore[arg-type]
    )
    queries = []
    for job, make_sink in ((CACHE_JOB, cache_sink), (SEARCH_JOB, search_sink)):
        opts = JobOptions(
            name=job,
            heartbeat_topic=heartbeat_topic(settings.kafka),
            topics=(),
            topic_pattern=table_topic_pattern(p.name),
            starting_offsets="earliest",
            checkpoint=f"{p.checkpoint_dir}/{job}",
            available_now=True,
            trigger_interval=settings.spark.trigger_interval,
            max_offsets_per_trigger=None,
        )
        batch = ApplyBatch(settings, opts, make_sink)
        query = (
            batch.events(kafka_stream(spark, settings, opts))
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", opts.checkpoint)
            .trigger(availableNow=True)
            .queryName(f"{job}_{p.name}")
            .start()
        )
        batch.last_progress = lambda q=query: q.lastProgress
        queries.append((job, query))
    for job, query in queries:
        assert query.awaitTermination(timeout), f"{job} did not finish in {timeout}s"
        assert query.exception() is None, f"{job} failed: {query.exception()}"
