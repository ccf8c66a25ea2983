"""The Spark session the jobs run in, and the Kafka source they read."""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import threading
from urllib.parse import urlsplit

from pyspark import SparkConf, SparkContext
from pyspark.sql import DataFrame, SparkSession

from pgcdc.core.kafka_config import client_config, spark_source_options
from pgcdc.core.settings import Settings
from pgcdc.core.spark_settings import CheckpointFiles, DirectPlanner, ReadPath
from spark_jobs.kafka_direct import SOURCE_NAME, Subscription, direct_source
from spark_jobs.options import JobOptions

# Spark's default is "(?i)url"; the Kafka source's options also carry a JAAS login
# (kafka.sasl.jaas.config) and maybe an inline private key (kafka.ssl.keystore.key).
REDACTED_OPTIONS = r"(?i)url|password|secret|token|jaas|keystore\.key"
FETCH_MAX_WAIT_MS = 10
# One attempt of Spark's Kafka source at the offsets waits this long at most for the brokers
# (the Java clients' default.api.timeout.ms), then it tries again after FETCH_RETRY_MS.
PLANNER_ATTEMPT_MS = 60_000
FETCH_RETRY_MS = 1_000
FILESYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
RAW_LOCAL_FS = "org.apache.hadoop.fs.RawLocalFileSystem"
WHOLE_STAGE = "spark.sql.codegen.wholeStage"
# PySpark's worker daemon, with the tasks' modules imported once before it forks.
DAEMON_MODULE = "spark_jobs.daemon"

# The job group of the job that starts the Python workers (start_python_workers).
WORKERS_GROUP = "pgcdc-start-python-workers"

log = logging.getLogger(__name__)


def submitted_conf() -> SparkConf:
    """spark-submit's configuration (``--master``, ``--conf``): the JVM it started is joined
    first, else a fresh SparkConf would not see those options and ``spark.master`` would be
    overridden by the settings' default."""
    SparkContext._ensure_initialized()
    return SparkConf()


def settings_env_from_conf(conf: SparkConf, environ: dict[str, str] | None = None) -> int:
    """Settings given as Spark configuration, ``spark.cdc.<section>.<name>=<value>``, become
    the ``CDC_<SECTION>__<NAME>`` variables the settings read (a variable already set wins);
    the count of those taken."""
    env = os.environ if environ is None else environ
    taken = 0
    for key, value in conf.getAll():
        if key.startswith("spark.cdc."):
            name = "CDC_" + "__".join(key[len("spark.cdc.") :].split(".")).upper()
            if name not in env:
                env[name] = value
                taken += 1
    return taken


def is_local_path(path: str) -> bool:
    """Whether a checkpoint path is on this machine's file system (no scheme, or file:)."""
    scheme = urlsplit(path).scheme
    return scheme in ("", "file")


def direct_planner(settings: Settings, checkpoint: str) -> DirectPlanner:
    """What plans the direct read of the job checkpointing at ``checkpoint``
    (``spark.direct_planner``; ``auto``: Spark's Kafka source where the checkpoint is local,
    since the tasks' ranges are then read from its offsets log)."""
    chosen = settings.spark.direct_planner
    if chosen is DirectPlanner.AUTO:
        return DirectPlanner.KAFKA if is_local_path(checkpoint) else DirectPlanner.PYTHON
    return chosen


def checkpoint_files(settings: Settings, checkpoint: str) -> CheckpointFiles:
    """How the job checkpointing at ``checkpoint`` writes its files (``auto`` resolved)."""
    chosen = settings.spark.checkpoint_files
    if chosen is CheckpointFiles.AUTO:
        local = is_local_path(checkpoint)
        return CheckpointFiles.FILESYSTEM if local else CheckpointFiles.FILECONTEXT
    return chosen


def daemon_module(master: str) -> str | None:
    """The Python worker daemon for a job on ``master``: :mod:`spark_jobs.daemon` (the
    workers fork from a daemon that imported their modules already: each worker imported
    them itself, 0.4-0.5 s of CPU each) when the master is local; None (PySpark's own) on a
    cluster, whose executors start their daemon before any task brings the job's code
    (``--py-files`` reaches a worker's path with its task), so they could not find it."""
    return DAEMON_MODULE if master.strip().startswith("local") else None


def spark_session(settings: Settings, app_name: str, checkpoint: str | None = None) -> SparkSession:
    """The active session: spark-submit's master if given, else the configured one. When
    the job's ``checkpoint`` is written through Hadoop's FileSystem API
    (:func:`checkpoint_files`), a local one is written through the raw local file system
    (:class:`pgcdc.core.spark_settings.CheckpointFiles`)."""
    conf = submitted_conf()
    builder = SparkSession.builder.appName(app_name)
    master = conf.get("spark.master", None) or settings.spark.master
    if not conf.contains("spark.master"):
        builder = builder.master(master)
    builder = builder.config(
        "spark.sql.shuffle.partitions", conf.get("spark.sql.shuffle.partitions", "2")
    )
    # Adaptive query execution is for batch queries: Spark turns it off for each streaming
    # query, with a WARN line (ResolveWriteToStream) at every job's start. The jobs run no
    # other query (their batches are the source's ranges and tasks of their own, no join
    # and no shuffle), so it is off from the start and says nothing.
    builder = builder.config(
        "spark.sql.adaptive.enabled", conf.get("spark.sql.adaptive.enabled", "false")
    )
    # A batch's task prefers the executor that read its Kafka partition before; with the
    # default 3 s wait a task whose executor is busy idles instead of running elsewhere,
    # adding seconds to a batch of tens of milliseconds.
    builder = builder.config("spark.locality.wait", conf.get("spark.locality.wait", "0"))
    daemon = daemon_module(master)
    if daemon is not None:
        builder = builder.config(
            "spark.python.daemon.module", conf.get("spark.python.daemon.module", daemon)
        )
    # Source options shown in plans and the UI: hide the Kafka login (JAAS) and keys too.
    builder = builder.config(
        "spark.sql.redaction.options.regex",
        conf.get("spark.sql.redaction.options.regex", REDACTED_OPTIONS),
    )
    if (
        checkpoint is not None
        and checkpoint_files(settings, checkpoint) is CheckpointFiles.FILESYSTEM
    ):
        builder = builder.config(
            "spark.sql.streaming.checkpointFileManagerClass",
            conf.get("spark.sql.streaming.checkpointFileManagerClass", FILESYSTEM_CHECKPOINTS),
        )
        if is_local_path(checkpoint):
            # No .crc files (ChecksumFileSystem's) and no readlink forks: the raw local file
            # system (it still runs chmod once per file it creates: no native Hadoop here).
            # Not cached, so that a local file system the JVM made before (spark-submit's)
            # is not the one the checkpoint gets.
            builder = builder.config(
                "spark.hadoop.fs.file.impl", conf.get("spark.hadoop.fs.file.impl", RAW_LOCAL_FS)
            ).config("spark.hadoop.fs.file.impl.disable.cache", "true")
    return builder.getOrCreate()


def plan_only(spark: SparkSession, conf: SparkConf) -> bool:
    """Turn whole-stage code generation off in ``spark``, whose query's frame is planned and
    never read (``spark.direct_planner = kafka``), unless ``conf`` (spark-submit's) sets it;
    whether it was turned off.

    Spark's foreachBatch sink makes each batch's frame an RDD before it calls the job
    (``ForeachBatchSink``: ``queryExecution.toRdd``), and whole-stage code generation then
    compiles the Kafka scan's projection with Janino on the driver, though no task runs it.
    Off, the projection is made in the tasks, of which there are none. Measured (a
    20,000-row backlog, the shared job, four runs each): the JVM's CPU from the query's start
    to its end 1.21 s against 1.43, and Janino's 330 classes (a signed jar, which no
    class-data-sharing archive holds) are not loaded."""
    if conf.contains(WHOLE_STAGE):
        return False
    spark.conf.set(WHOLE_STAGE, "false")
    return True


def source_options(settings: Settings, opts: JobOptions) -> dict[str, str]:
    """The Kafka source's options: brokers and credentials, where to start, what to read."""
    options = {
        # The consumer a task reuses keeps a prefetch in flight at the log's end, which the
        # broker holds for fetch.max.wait.ms (500 ms by default) before the next batch's
        # task can fetch: measured here, the first rows reached a task after ~400 ms (p50),
        # ~50 ms at 10. Settings may override it (kafka.spark_client).
        "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
        **spark_source_options(settings.kafka),
        "startingOffsets": opts.starting_offsets,
        "includeHeaders": "true",
    }
    wanted = subscription(opts)
    if wanted.topics:
        options["subscribe"] = ",".join(wanted.topics)
    else:
        options["subscribePattern"] = wanted.pattern or ""
    if opts.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(opts.max_offsets_per_trigger)
    if opts.min_partitions:
        options["minPartitions"] = str(opts.min_partitions)
    return options


def planner_options(settings: Settings, opts: JobOptions) -> dict[str, str]:
    """The options of Spark's Kafka source when it only plans the direct read's batches
    (``spark.direct_planner = kafka``): its frame is never read, the tasks read the ranges
    the checkpoint's offsets log says (:meth:`spark_jobs.apply_loop.ApplyBatch._tasks`).

    As the Python planner does (:class:`spark_jobs.kafka_direct.DirectReader`): the offsets
    are the last stable ones (``read_committed``, as the tasks' consumers read), a partition
    whose records are gone is no failure (the tasks read from its log start), and Kafka is
    asked again while it does not answer, for about ``spark.kafka_unavailable_s``."""
    attempts = -(
        -int(settings.spark.kafka_unavailable_s * 1000) // (PLANNER_ATTEMPT_MS + FETCH_RETRY_MS)
    )
    options = source_options(settings, opts)
    options.pop("kafka.fetch.max.wait.ms", None)  # for a consumer that reads: none does
    options.update(
        {
            "kafka.isolation.level": "read_committed",
            "kafka.default.api.timeout.ms": str(PLANNER_ATTEMPT_MS),
            "failOnDataLoss": "false",
            "fetchOffset.numRetries": str(max(1, attempts)),
            "fetchOffset.retryIntervalMs": str(FETCH_RETRY_MS),
        }
    )
    return options


def subscription(opts: JobOptions) -> Subscription:
    """The topics a job reads: those named, or those whose whole name matches the pattern;
    and the heartbeat topic (unless the job runs without heartbeats).

    The pattern is anchored at both ends. Spark's Kafka source subscribes to every topic the
    pattern is *found in* (``SubscribePatternStrategy``: Scala's ``findFirstIn``), where
    Kafka's consumers, and the direct read's Python planner, match the whole name: a job of
    the prefix ``cdc`` read ``mycdc.public.orders`` too, another database's rows, into the
    same documents and keys, and the heartbeats of the prefix ``cdc_staging``, another
    server's LSNs, into its watermark."""
    if opts.topics:
        beat = (opts.heartbeat_topic,) if opts.heartbeat_topic else ()
        return Subscription((*opts.topics, *beat), None)
    pattern = opts.topic_pattern or ""
    if opts.heartbeat_topic:
        pattern = f"(?:{pattern})|{re.escape(opts.heartbeat_topic)}"
    return Subscription((), f"^(?:{pattern})$")


log = logging.getLogger(__name__)

WORKER_PYTHON = "spark.sql.execution.pyspark.python"


def register_source(spark: SparkSession, source: type) -> None:
    """Register the direct read's Python data source so that its planner can start.

    Spark plans a Python data source (its offsets, its partitions) in Python workers the
    driver starts, with the interpreter the source was registered with: the session's
    ``spark.pyspark.python``. On a cluster that is the executors' packed environment,
    ``./environment/bin/python``, a path the driver does not have. There the source is
    registered with the driver's own interpreter instead, and the executors' is given to
    ``spark.sql.execution.pyspark.python``, which Spark's Arrow runners (the source's reads
    in the tasks) use before the source's own; the jobs' other Python (``foreachBatch``'s
    tasks) keeps ``spark.pyspark.python``."""
    sc = spark.sparkContext
    executors = sc.pythonExec
    if _runs_here(executors):
        spark.dataSource.register(source)
        return
    if not spark.conf.get(WORKER_PYTHON, None):
        spark.conf.set(WORKER_PYTHON, executors)
    sc.pythonExec = sys.executable
    try:
        spark.dataSource.register(source)
    finally:
        sc.pythonExec = executors
    log.info(
        "the direct read's planner runs on the driver's Python (%s), its reads on the "
        "executors' (%s, %s)",
        sys.executable,
        spark.conf.get(WORKER_PYTHON),
        WORKER_PYTHON,
    )


def _runs_here(python: str) -> bool:
    """Whether the driver can start ``python``: a path that exists from its working
    directory (the JVM's too), or a bare name found on its PATH."""
    if os.sep not in python:
        return shutil.which(python) is not None
    return os.access(python, os.X_OK)


def kafka_stream(spark: SparkSession, settings: Settings, opts: JobOptions) -> DataFrame:
    """The streaming frame of the table topics (and the heartbeat topic), with headers; with
    ``spark.read = "direct"``, of the batches' offset ranges (:mod:`spark_jobs.kafka_direct`),
    which the tasks read themselves (planned by Spark's Kafka source with
    ``spark.direct_planner = kafka``: :func:`planner_options`)."""
    if settings.spark.read is ReadPath.DIRECT and (
        direct_planner(settings, opts.checkpoint) is DirectPlanner.KAFKA
    ):
        return spark.readStream.format("kafka").options(**planner_options(settings, opts)).load()
    if settings.spark.read is ReadPath.DIRECT:
        source = direct_source(
            client_config(settings.kafka),
            subscription(opts),
            opts.starting_offsets,
            opts.max_offsets_per_trigger,
            settings.spark.kafka_unavailable_s,
        )
        register_source(spark, source)
        return spark.readStream.format(SOURCE_NAME).load()
    return spark.readStream.format("kafka").options(**source_options(settings, opts)).load()


def catch_up_records(
    spark: SparkSession,
    settings: Settings,
    opts: JobOptions,
    starting: dict[str, dict[str, int]],
    ending: dict[str, dict[str, int]],
) -> DataFrame:
    """A batch read of the records from ``starting`` up to (not including) ``ending``, the
    same columns as the stream's: what a follower that fell behind missed
    (:mod:`spark_jobs.behind`). Records compacted away meanwhile are no loss (a newer one
    of their key is read) and do not fail the read."""
    import json

    options = source_options(settings, opts)
    for stream_only in ("subscribe", "subscribePattern", "maxOffsetsPerTrigger"):
        options.pop(stream_only, None)
    options.update(
        assign=json.dumps({t: sorted(int(p) for p in parts) for t, parts in ending.items()}),
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
        failOnDataLoss="false",
    )
    return spark.read.format("kafka").options(**options).load()


def _nothing(_: object) -> None:
    """A task that does nothing: it only brings its Python worker up."""


def start_python_workers(spark: SparkSession) -> threading.Thread:
    """Bring the executors' Python workers up now, in the background, by a job of one empty
    task a core (:func:`_nothing`, job group :data:`WORKERS_GROUP`); the thread that runs it.

    A job's first micro-batch otherwise starts them itself, once the query has planned it:
    on a local master PySpark then starts its worker daemon, which imports the tasks' modules
    (:mod:`spark_jobs.daemon`) and forks a worker a task, and only then does a follower get
    a change. Measured in the shared job over a 100,000-row backlog (local[2]): the daemon
    started 1.4 s after the query, and its first worker ran 0.85 s later, while the query's
    planning kept about one of the two cores busy. The jobs start them as soon as the session
    is up, so that the daemon's imports (about 0.6 s of CPU) run while the driver, on one
    core, sets the query up and plans its first batch: over that backlog the apply window
    went from 6.70/6.23 s to 5.59/5.69 s, and spark-submit to the last batch from 11.30/10.49
    s to 9.92/9.81 s (started with the query instead, two runs each, alternating). The
    workers stay up for the batches (``spark.python.worker.reuse``, PySpark's default). A
    failure here is only logged: the first batch starts the workers as before."""
    sc = spark.sparkContext

    def run() -> None:
        try:
            sc.setJobGroup(WORKERS_GROUP, "start the Python workers")
            n = max(1, sc.defaultParallelism)
            sc.parallelize(range(n), n).foreach(_nothing)
        except Exception as e:  # the first batch starts them, and reports what fails
            log.debug("the Python workers did not start early: %s", e)

    thread = threading.Thread(target=run, name="start-python-workers", daemon=True)
    thread.start()
    return thread
