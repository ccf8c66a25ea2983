"""What every sync job does: read the CDC topics as a stream and apply each micro-batch
through its sink until stopped (or, with ``--available-now``, until caught up)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pgcdc.core.logs import configure_logging
from spark_jobs.apply_loop import ApplyBatch, SinkFactory
from spark_jobs.options import parse_args
from spark_jobs.source import kafka_stream, spark_session

log = logging.getLogger(__name__)


def run(job: str, make_sink: SinkFactory, argv: Sequence[str] | None = None) -> int:
    """Run the sync job ``job`` with the sink ``make_sink`` builds; the exit status."""
    settings, opts = parse_args(job, argv)
    configure_logging(settings.log_level, json_logs=settings.log_json)
    spark = spark_session(settings, f"cdc-{opts.name}")
    spark.sparkContext.setLogLevel("WARN")

    writer = (
        kafka_stream(spark, settings, opts)
        .writeStream.foreachBatch(ApplyBatch(settings, opts, make_sink))
        .option("checkpointLocation", opts.checkpoint)
    )
    writer = (
        writer.trigger(availableNow=True)
        if opts.available_now
        else writer.trigger(processingTime=opts.trigger_interval)
    )
    query = writer.start()
    log.info(
        "started %s: topics=%s checkpoint=%s",
        opts.name,
        ",".join(opts.topics) or opts.topic_pattern,
        opts.checkpoint,
        extra={"job": opts.name},
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    exc = query.exception()
    if exc is not None:
        log.error("%s stopped: %s", opts.name, exc, extra={"job": opts.name})
        return 1
    return 0
