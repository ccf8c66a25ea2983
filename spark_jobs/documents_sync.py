"""Keep the declared joined documents (``[[search.documents]]``) in OpenSearch: one index
per document, ``<search.index_prefix>-<name>``, maintained from the change topics of every
table a document joins (docs/documents.md).

scripts/spark-submit spark_jobs/documents_sync.py [--available-now] [--help]

Spark's Kafka source reads the topics; each micro-batch is joined in the driver
(:mod:`spark_jobs.documents`), whose state is kept beside the checkpoint
(:mod:`spark_jobs.document_state`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace

from pgcdc.core.contract import DOCUMENTS_JOB, table_topic
from pgcdc.core.errors import ConfigError
from pgcdc.core.health import HealthServer
from pgcdc.core.logs import configure_logging
from pgcdc.core.qualified_names import split_qualified
from pgcdc.core.settings import Settings, ValueFormat
from pgcdc.core.spark_settings import ReadPath
from sinks.search_documents import DocumentWriter
from spark_jobs import behind, dead_letter
from spark_jobs.checkpoint_lock import CheckpointInUse, checkpoint_lock
from spark_jobs.document_specs import document_specs
from spark_jobs.document_state import SNAPSHOT_EVERY, DocumentStateStore
from spark_jobs.documents import DocumentsBatch, RecordChanges
from spark_jobs.interrupt import await_stop
from spark_jobs.interrupt import install as install_interrupt
from spark_jobs.job import query_ready, quiet_per_batch_loggers, split_health_port
from spark_jobs.options import JobOptions, parse_args, parser
from spark_jobs.parse import Transcode
from spark_jobs.progress import ProgressLog
from spark_jobs.source import (
    is_local_path,
    settings_env_from_conf,
    source_options,
    spark_session,
    submitted_conf,
)

log = logging.getLogger(__name__)

# Records per batch when none is asked: a batch is collected into the driver whole.
DEFAULT_MAX_OFFSETS = 50_000


def document_topics(settings: Settings) -> tuple[str, ...]:
    """The change topics of every table a declared document joins, each once."""
    names = []
    for doc in settings.search.documents:
        names += [doc.table, *(lk.table for lk in doc.lookups), *(n.table for n in doc.nested)]
    prefix = settings.kafka.topic_prefix
    return tuple(dict.fromkeys(table_topic(prefix, *split_qualified(n)) for n in names))


def job_options(settings: Settings, opts: JobOptions, asked_limit: bool = False) -> JobOptions:
    """The command line's options, reading the documents' topics (no heartbeats: the job
    keeps no watermark yet), batches of :data:`DEFAULT_MAX_OFFSETS` records unless a limit
    was ``asked_limit`` (the sync jobs' default for ``--available-now`` is larger: their
    batches are not gathered into the driver). ConfigError for what this job does not
    do."""
    if not settings.search.documents:
        raise ConfigError(
            "no document is declared ([[search.documents]] in the config file, or "
            "CDC_SEARCH__DOCUMENTS): docs/documents.md says how"
        )
    return replace(
        opts,
        topics=document_topics(settings),
        topic_pattern=None,
        heartbeat_topic=None,
        max_offsets_per_trigger=opts.max_offsets_per_trigger
        if asked_limit
        else DEFAULT_MAX_OFFSETS,
        min_partitions=None,
    )


# The sync jobs' options this job does not take: refused, never silently ignored.
NOT_TAKEN = ("--topics", "--topic-pattern", "--min-partitions")


def refuse_not_taken(argv: Sequence[str]) -> None:
    """ConfigError naming an option of the sync jobs that this job does not take."""
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name in NOT_TAKEN:
            raise ConfigError(
                f"{name}: the documents' job does not take it (it reads the topics of the "
                "declared documents' tables, a task per Kafka partition)"
            )


def split_snapshot_every(argv: Sequence[str]) -> tuple[int, list[str]]:
    """``--snapshot-every N`` (batches between two snapshots of the state) taken out of the
    job's arguments (the rest go to parse_args)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--snapshot-every", type=int, default=SNAPSHOT_EVERY)
    known, rest = p.parse_known_args(list(argv))
    if known.snapshot_every < 1:
        raise ConfigError("--snapshot-every must be at least 1")
    return known.snapshot_every, rest


def documents_parser() -> argparse.ArgumentParser:
    """The job's options: the sync jobs' and ``--snapshot-every``."""
    p = parser(DOCUMENTS_JOB)
    p.description = (
        "documents_sync: keep the declared joined documents ([[search.documents]]) in "
        "OpenSearch from their tables' change topics (Structured Streaming). "
        f"Not taken: {', '.join(NOT_TAKEN)}."
    )
    p.add_argument(
        "--snapshot-every",
        type=int,
        default=SNAPSHOT_EVERY,
        help="batches between two snapshots of the documents' state (default %(default)s); "
        "a start applies the deltas since the last one",
    )
    return p


def record_transcoder(settings: Settings) -> Transcode | None:
    """How the records are read into Connect JSON first: Avro's transcoder (the key too),
    or None for JSON."""
    if settings.schema_.value_format is not ValueFormat.AVRO:
        return None
    from spark_jobs.avro_input import transcoder_for  # the Avro reader: only when used

    return transcoder_for(settings.schema_).transcode


def run(argv: Sequence[str] | None = None) -> int:
    """Run the documents' job; the exit status."""
    given = sys.argv[1:] if argv is None else list(argv)
    if "-h" in given or "--help" in given:
        documents_parser().parse_args(["--help"])  # prints the options, exits 0
    settings_env_from_conf(submitted_conf())
    try:
        refuse_not_taken(given)
        health_port, given = split_health_port(given)
        snapshot_every, given = split_snapshot_every(given)
        settings, opts = parse_args(DOCUMENTS_JOB, given)
        asked = settings.spark.max_offsets_per_trigger is not None or any(
            a.split("=", 1)[0] == "--max-offsets-per-trigger" for a in given
        )
        opts = job_options(settings, opts, asked)
        if not is_local_path(opts.checkpoint):
            raise ConfigError(
                f"the checkpoint {opts.checkpoint} is not a local directory: the documents' "
                "job keeps its state there from the driver (give --checkpoint a local or "
                "mounted path)"
            )
        checkpoint = behind.local_dir(opts.checkpoint)  # a file: URI as a path
        specs = document_specs(settings.search)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, json_logs=settings.log_json)
    quiet_per_batch_loggers(logging.getLogger().level)
    try:
        lock = checkpoint_lock(checkpoint)  # before the state's files are read or written
    except CheckpointInUse as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    store = DocumentStateStore(checkpoint, specs, snapshot_every)
    try:
        states = store.load()
    except ConfigError as e:
        lock.close()
        print(f"error: {e}", file=sys.stderr)
        return 2
    if settings.spark.read is ReadPath.DIRECT:
        log.info("the documents' job reads through Spark's Kafka source (spark.read=spark)")
    spark = spark_session(settings, f"cdc-{opts.name}", opts.checkpoint)
    spark.sparkContext.setLogLevel("WARN")
    interrupt = install_interrupt(spark, opts.name)
    writer = DocumentWriter.from_settings(settings.search)
    batch = DocumentsBatch(
        RecordChanges(settings.kafka.topic_prefix, specs.values(), record_transcoder(settings)),
        states,
        store,
        writer,
        lambda dead: dead_letter.publish(settings, opts.name, dead),
    )
    stream = (
        spark.readStream.format("kafka").options(**source_options(settings, opts)).load()
    ).select("topic", "partition", "offset", "key", "value", "headers")
    query_writer = stream.writeStream.foreachBatch(batch).option(
        "checkpointLocation", str(checkpoint)
    )
    query_writer = (
        query_writer.trigger(availableNow=True)
        if opts.available_now
        else query_writer.trigger(processingTime=opts.trigger_interval)
    )
    query = query_writer.start()
    log.info(
        "started %s: documents=%s topics=%s checkpoint=%s",
        opts.name,
        ",".join(specs),
        ",".join(opts.topics),
        checkpoint,
        extra={"job": opts.name},
    )
    health = None
    if health_port is not None:  # /healthz and /readyz as the sync jobs serve them; no metrics

        def ready() -> tuple[bool, str]:
            return query_ready(query, settings.health_ready_s)

        health = HealthServer(ready, health_port, settings.health_host).start()
    try:
        progress = ProgressLog(opts.name, direct=False) if opts.available_now else None
        await_stop(query, interrupt, spark.sparkContext._jvm, progress)
    finally:
        if health is not None:
            health.close()
        lock.close()
        writer.close()
    exc = query.exception()
    if exc is not None and not interrupt.stop.is_set():
        log.error("%s stopped: %s", opts.name, exc, extra={"job": opts.name})
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
