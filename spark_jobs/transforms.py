"""Pure DataFrame → DataFrame steps of the sync jobs. Built-in functions only: no Python UDF.

Input: the Kafka source's columns (key, value, topic, partition, offset, timestamp, headers).
Output of :func:`parse_events`: one row per record with

    topic, partition, offset, kafka_ts, table, key_json, op, after_json, value_schema_json,
    schema_id, unchanged,
    commit_lsn, tx_order, source_ts_ms, raw_value, is_heartbeat, heartbeat_lsn, is_delete,
    parse_error

(``table`` is the table id the contract encodes in the topic name, ``unchanged`` the raw
``cdc.unchanged`` header: the columns an event left out, unchanged TOAST)

and :func:`classify` gives each its ``kind``. The reduction to the newest event per key
happens inside each task (:mod:`spark_jobs.reduce`), so a batch is one Spark stage with a
task per Kafka partition.
"""

from __future__ import annotations

import re

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pgcdc.core.contract import (
    HEADER_COMMIT_LSN,
    HEADER_ORDER,
    HEADER_UNCHANGED,
    HEARTBEAT_LSN_FIELD,
)
from spark_jobs.parse import (
    BAD_COMMIT_LSN,
    BAD_ORDER,
    CHANGE,
    DEAD,
    HEARTBEAT,
    KEYLESS,
    NOT_DEBEZIUM,
    SCHEMA,
    TRUNCATE,
)

__all__ = [
    "CHANGE",
    "DEAD",
    "HEARTBEAT",
    "KEYLESS",
    "NOT_DEBEZIUM",
    "SCHEMA",
    "TRUNCATE",
    "by_key",
    "classify",
    "parse_events",
]

# The Debezium envelope, with row images and the schema kept as raw JSON text: the sinks
# decode them per table, and Spark does not have to know every table's columns.
_ENVELOPE = StructType([StructField("schema", StringType()), StructField("payload", StringType())])
_SOURCE = StructType(
    [
        StructField("schema", StringType()),
        StructField("table", StringType()),
        StructField("lsn", LongType()),
        StructField("txId", LongType()),
        StructField("ts_ms", LongType()),
        StructField("snapshot", StringType()),
    ]
)
_PAYLOAD = StructType(
    [
        StructField("before", StringType()),
        StructField("after", StringType()),
        StructField("source", _SOURCE),
        StructField("op", StringType()),
        StructField("ts_ms", LongType()),
    ]
)


# NOT_DEBEZIUM: Spark's JSON reader refuses some values Python reads (e.g. a string over
# Jackson's length limit, tens of MB): such records get a second parse in the task
# (spark_jobs.reduce).


def _header(name: str) -> Column:
    matches = F.filter(F.col("headers"), lambda h: h["key"] == F.lit(name))
    return F.try_element_at(matches, F.lit(1))["value"].cast("string")


def _decimal_header(raw: str) -> Column:
    """A decimal header as a long: null if absent or beyond 2**63-1 (left for the change
    builder to stop on), and the reason when it is no decimal number at all."""
    return F.col(raw).try_cast("long")


def _bad_header(raw: str) -> Column:
    return F.col(raw).isNotNull() & ~F.col(raw).rlike("^[0-9]+$")


def parse_events(df: DataFrame, topic_prefix: str, heartbeat_topic: str | None = None) -> DataFrame:
    """Parse Kafka records holding Debezium JSON events (schemas on or off) and tombstones.

    Records of ``heartbeat_topic`` are the reader's progress marks, not events: they get
    ``heartbeat_lsn`` (the reader's acknowledged LSN) and are left out of everything else.
    """
    value = F.col("value").cast("string")
    is_heartbeat = F.col("topic") == F.lit(heartbeat_topic) if heartbeat_topic else F.lit(False)
    env = F.from_json(value, _ENVELOPE)
    # With schemas on, the event is {"schema", "payload"}; with schemas off it is the payload.
    payload_json = F.when(env["payload"].isNotNull(), env["payload"]).otherwise(value)
    key = F.col("key").cast("string")
    key_env = F.from_json(key, _ENVELOPE)
    key_json = F.when(key_env["payload"].isNotNull(), key_env["payload"]).otherwise(key)

    parsed = df.select(
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_ts"),
        F.regexp_replace("topic", "^" + re.escape(topic_prefix) + r"\.", "").alias("table"),
        key_json.alias("key_json"),
        F.from_json(payload_json, _PAYLOAD).alias("p"),
        env["schema"].alias("value_schema_json"),
        F.col("value").isNull().alias("is_tombstone"),
        value.alias("raw_value"),
        is_heartbeat.alias("is_heartbeat"),
        _header(HEADER_COMMIT_LSN).alias("h_commit_lsn_raw"),
        _header(HEADER_ORDER).alias("h_order_raw"),
        _header(HEADER_UNCHANGED).alias("unchanged"),
        # Why an Avro record could not be read (spark_jobs.avro_input); none for JSON input.
        (
            F.col("decode_error") if "decode_error" in df.columns else F.lit(None).cast("string")
        ).alias("decode_error"),
    )
    return parsed.select(
        "topic",
        "partition",
        "offset",
        "kafka_ts",
        "table",
        "key_json",
        F.col("p.op").alias("op"),
        F.col("p.after").alias("after_json"),
        "value_schema_json",
        # Every event of a table repeats the same few-kB schema: rows carry a hash of it,
        # and the schemas themselves travel once per batch (distinct_schemas).
        F.xxhash64("value_schema_json").alias("schema_id"),
        "unchanged",
        # Our reader puts the transaction's commit LSN and the change's position in headers.
        # Events from elsewhere fall back to the change's own LSN. A header too large for a
        # long gives null: the change builder stops on it (no later change could be ordered).
        F.when(F.col("h_commit_lsn_raw").isNull(), F.coalesce(F.col("p.source.lsn"), F.lit(0)))
        .otherwise(_decimal_header("h_commit_lsn_raw"))
        .alias("commit_lsn"),
        F.coalesce(_decimal_header("h_order_raw"), F.lit(0)).alias("tx_order"),
        F.col("p.source.ts_ms").alias("source_ts_ms"),
        "raw_value",
        "is_heartbeat",
        F.when(
            F.col("is_heartbeat"),
            F.get_json_object("raw_value", f"$.{HEARTBEAT_LSN_FIELD}").try_cast("long"),
        ).alias("heartbeat_lsn"),
        (F.col("is_tombstone") | (F.col("p.op") == "d")).alias("is_delete"),
        F.when(F.col("is_heartbeat"), F.lit(None))
        .when(F.col("decode_error").isNotNull(), F.col("decode_error"))
        .when(_bad_header("h_commit_lsn_raw"), F.lit(BAD_COMMIT_LSN))
        .when(_bad_header("h_order_raw"), F.lit(BAD_ORDER))
        .when(F.col("is_tombstone"), F.lit(None))
        .when(F.col("p").isNull() | F.col("p.op").isNull(), F.lit(NOT_DEBEZIUM))
        .alias("parse_error"),
    )


def classify(events: DataFrame) -> DataFrame:
    """The parsed events with their ``kind``, narrowed to what the apply loop reads.

    Kinds: ``change``; ``dead`` (cannot be parsed; ``parse_error`` says why, ``raw_value``
    holds the record, kept for these only); ``heartbeat`` (the reader's progress);
    ``truncate`` (Debezium's ``t`` event: the reader also wrote a delete for every row it
    removed); ``keyless`` (a null key: an event of a table without a key).

    No reduction and no shuffle here: :func:`spark_jobs.reduce.latest_per_key` reduces
    inside each task (see :func:`by_key` for when the frame is spread first).
    """
    kind = (
        F.when(F.col("is_heartbeat"), F.lit(HEARTBEAT))
        .when(F.col("parse_error").isNotNull(), F.lit(DEAD))
        .when(F.col("op") == "t", F.lit(TRUNCATE))
        .when(F.col("key_json").isNull(), F.lit(KEYLESS))
        .otherwise(F.lit(CHANGE))
    )
    return events.select(
        kind.alias("kind"),
        "topic",
        "table",
        "partition",
        "offset",
        "key_json",
        "is_delete",
        "op",
        "after_json",
        "unchanged",
        "schema_id",
        "value_schema_json",
        "commit_lsn",
        "tx_order",
        "source_ts_ms",
        "heartbeat_lsn",
        "parse_error",
        F.when(F.col("parse_error").isNotNull(), F.col("raw_value")).alias("raw_value"),
    )


def by_key(events: DataFrame, partitions: int | None, key: str = "key_json") -> DataFrame:
    """The frame as the tasks apply it: every event of one (topic, key) in one partition.

    Without ``partitions`` it is the Kafka source's own partitioning, one Spark partition
    per Kafka partition, which already holds every event of its keys: no shuffle. With
    ``partitions`` (``--min-partitions``: the source then splits a Kafka partition's offset
    range across tasks) the frame is hash-partitioned by (topic, ``key``) into that many:
    the parsed ``key_json``, or the raw ``key`` bytes of the Kafka records the ``python``
    parse reads in the task. (By bytes, one key written with two key schemas in one batch,
    e.g. across a change of its column's type, may be reduced in two tasks: each write
    still carries its version, so the follower keeps the newer; only the folding of
    unchanged TOAST across the two is lost.)
    """
    if not partitions:
        return events
    return events.repartition(partitions, "topic", key)
