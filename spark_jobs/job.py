"""What every sync job does: read the CDC topics as a stream and apply each micro-batch
through its sink until stopped (or, with ``--available-now``, until caught up).

``--health-port PORT`` serves ``/healthz`` (the driver is alive), ``/readyz`` (the query is
active and processing a micro-batch now, or its last progress report is at most
``health_ready_s`` seconds old; Spark reports progress at least every 10 s while idle) and
``/metrics`` (Prometheus: :mod:`spark_jobs.metrics`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pgcdc.core.errors import ConfigError
from pgcdc.core.health import HealthServer
from pgcdc.core.logs import configure_logging
from pgcdc.core.spark_settings import CheckpointFiles, DirectPlanner, ReadPath
from spark_jobs import behind
from spark_jobs.apply_loop import ApplyBatch, Follower, SinkFactory
from spark_jobs.checkpoint_lock import CheckpointInUse, checkpoint_lock
from spark_jobs.fast_changes import apply_said
from spark_jobs.interrupt import await_stop
from spark_jobs.interrupt import install as install_interrupt
from spark_jobs.options import parse_args, parser
from spark_jobs.progress import ProgressLog
from spark_jobs.source import (
    checkpoint_files,
    direct_planner,
    is_local_path,
    kafka_stream,
    plan_only,
    settings_env_from_conf,
    spark_session,
    start_python_workers,
    submitted_conf,
)

log = logging.getLogger(__name__)


def split_health_port(argv: Sequence[str] | None) -> tuple[int | None, list[str]]:
    """``--health-port`` taken out of the job's arguments (the rest go to parse_args)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--health-port", type=int)
    known, rest = p.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    return known.health_port, rest


def query_ready(
    query: Any, ready_s: float, clock: Callable[[], float] = time.time
) -> tuple[bool, str]:
    """``(ready, why)`` of a streaming query: active, and busy or reported lately."""
    if not query.isActive:
        return False, "the streaming query is not active"
    if query.status.get("isTriggerActive"):
        return True, "processing a micro-batch"
    progress = query.lastProgress
    if not progress:
        return False, "no micro-batch has completed yet"
    at = datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00"))
    age = clock() - at.timestamp()
    if age > ready_s:
        return False, f"no progress for {age:.0f}s (more than {ready_s:g}s)"
    return True, f"batch {progress.get('batchId')} {age:.1f}s ago"


# Libraries that log a line per batch at INFO: py4j each call from the JVM (the batch
# handler's "Received command c on object id p0"), opensearch-py each request (the
# watermark write). A healthy job prints no line per batch; DEBUG shows them again.
PER_BATCH_LOGGERS = ("py4j", "opensearch")


def quiet_per_batch_loggers(level: int) -> None:
    """Raise the per-batch loggers to WARNING unless the job logs at DEBUG."""
    for name in PER_BATCH_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.NOTSET if level <= logging.DEBUG else logging.WARNING
        )


def run(
    job: str,
    make_sink: SinkFactory | None = None,
    argv: Sequence[str] | None = None,
    followers: Mapping[str, Follower] | None = None,
) -> int:
    """Run the sync job ``job`` with the sink ``make_sink`` builds, or (the shared job)
    with the ``followers`` its ``--followers`` option names; the exit status."""
    given = sys.argv[1:] if argv is None else list(argv)
    names = tuple(followers or ())
    if "-h" in given or "--help" in given:
        parser(job, names).parse_args(["--help"])  # prints the options, exits 0: no JVM needed
    health_port, argv = split_health_port(argv)
    settings_env_from_conf(submitted_conf())  # --conf spark.cdc.redis.url=... and the like
    try:
        settings, opts = parse_args(job, argv, names)
        chosen = [followers[n] for n in opts.followers] if followers else []
        if len(chosen) > 1:
            behind.local_dir(opts.checkpoint)  # where it keeps who is behind
        direct = settings.spark.read is ReadPath.DIRECT
        planned_by_kafka = direct and settings.spark.direct_planner is DirectPlanner.KAFKA
        if planned_by_kafka and not is_local_path(opts.checkpoint):
            raise ConfigError(
                f"spark.direct_planner = kafka reads each batch's offsets from the "
                f"checkpoint's offsets log, and {opts.checkpoint} is not a local directory: "
                "give --checkpoint a local or mounted path, or set spark.direct_planner = "
                "python"
            )
    except ConfigError as e:  # one line, as the reader's: a variable no setting has, a value
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, json_logs=settings.log_json)
    quiet_per_batch_loggers(logging.getLogger().level)
    lock = None
    files = checkpoint_files(settings, opts.checkpoint)
    if files is CheckpointFiles.FILESYSTEM and is_local_path(opts.checkpoint):
        try:
            lock = checkpoint_lock(behind.local_dir(opts.checkpoint))
        except CheckpointInUse as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    spark = spark_session(settings, f"cdc-{opts.name}", opts.checkpoint)
    spark.sparkContext.setLogLevel("WARN")
    start_python_workers(spark)  # while the driver sets the query up and plans its first batch
    if direct and direct_planner(settings, opts.checkpoint) is DirectPlanner.KAFKA:
        plan_only(spark, submitted_conf())
    interrupt = install_interrupt(spark, opts.name)

    batch = ApplyBatch(settings, opts, make_sink, chosen)
    batch.stopping = interrupt.stop
    batch.stop_planners = True  # this process runs one query
    writer = (
        batch.events(kafka_stream(spark, settings, opts))
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", opts.checkpoint)
    )
    writer = (
        writer.trigger(availableNow=True)
        if opts.available_now
        else writer.trigger(processingTime=opts.trigger_interval)
    )
    query = writer.start()
    batch.last_progress = lambda: query.lastProgress
    health = None
    if health_port is not None:

        def ready() -> tuple[bool, str]:
            return query_ready(query, settings.health_ready_s)

        health = HealthServer(
            ready, health_port, settings.health_host, metrics=batch.metrics.render
        ).start()
    log.info(
        "started %s: %stopics=%s checkpoint=%s read=%s%s parse=%s%s",
        opts.name,
        f"followers={','.join(f.job for f in batch.followers)} " if followers else "",
        ",".join(opts.topics) or opts.topic_pattern,
        opts.checkpoint,
        settings.spark.read,
        f" planner={batch.planner}" if direct else "",
        "python" if direct else settings.spark.parse,
        apply_said(settings),
        extra={"job": opts.name},
    )
    try:
        progress = (
            ProgressLog(opts.name, direct=direct, spans=batch.spans) if opts.available_now else None
        )
        await_stop(query, interrupt, spark.sparkContext._jvm, progress)
    finally:
        if health is not None:
            health.close()
        if lock is not None:  # held while the query ran; the process's end frees it too
            lock.close()
    exc = query.exception()
    if exc is not None and not interrupt.stop.is_set():
        log.error("%s stopped: %s", opts.name, exc, extra={"job": opts.name})
        return 1
    left = [f.job for f in batch.followers if f.job in batch.behind]
    if opts.available_now and left:
        # The others got everything; these did not (the next run catches them up).
        log.error(
            "%s done, but %s stayed unreachable and is behind: the next run catches it up",
            opts.name,
            ", ".join(left),
            extra={"job": opts.name},
        )
        return 1
    return 0
