"""The Spark session the jobs run in, and the Kafka source they read."""

from __future__ import annotations

import re

from pyspark import SparkConf
from pyspark.sql import DataFrame, SparkSession

from pgcdc.core.settings import Settings
from spark_jobs.options import JobOptions


def spark_session(settings: Settings, app_name: str) -> SparkSession:
    """The active session: spark-submit's master if given, else the configured one."""
    conf = SparkConf()
    builder = SparkSession.builder.appName(app_name)
    if not conf.contains("spark.master"):
        builder = builder.master(settings.spark.master)
    builder = builder.config(
        "spark.sql.shuffle.partitions", conf.get("spark.sql.shuffle.partitions", "2")
    )
    return builder.getOrCreate()


def kafka_stream(spark: SparkSession, settings: Settings, opts: JobOptions) -> DataFrame:
    """The streaming frame of the table topics (and the heartbeat topic), with headers."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka.bootstrap_servers)
        .option("startingOffsets", opts.starting_offsets)
        .option("includeHeaders", "true")
    )
    if opts.topics:
        topics = [*opts.topics, *([opts.heartbeat_topic] if opts.heartbeat_topic else [])]
        reader = reader.option("subscribe", ",".join(topics))
    else:
        pattern = opts.topic_pattern or ""
        if opts.heartbeat_topic:
            pattern = f"(?:{pattern})|{re.escape(opts.heartbeat_topic)}"
        reader = reader.option("subscribePattern", pattern)
    if opts.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(opts.max_offsets_per_trigger))
    return reader.load()
