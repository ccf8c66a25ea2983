"""What both sync jobs share: options, the Kafka source, and the micro-batch apply loop.

A micro-batch is applied in this order: parse; send unparseable records to the dead-letter
topic; reduce to the newest event per key; apply through the sink (every write carries an
LSN-derived version, so a replay can never go backwards); dead-letter what the sink refused
for good; and only then record the follower's watermark. Spark commits the batch's offsets to
the checkpoint after this function returns, so a crash anywhere replays the batch: the
versions make the replay harmless.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from pgcdc.core.contract import heartbeat_topic, table_topic_pattern
from pgcdc.core.settings import Settings, load_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobOptions:
    name: str
    heartbeat_topic: str | None
    topics: tuple[str, ...]
    topic_pattern: str | None
    starting_offsets: str
    checkpoint: str
    available_now: bool
    trigger_interval: str
    max_offsets_per_trigger: int | None


def parse_args(job: str, argv: Sequence[str] | None = None) -> tuple[Settings, JobOptions]:
    """Command-line options over the shared settings (``CDC_*`` env, ``--config`` file)."""
    p = argparse.ArgumentParser(
        prog=f"spark_jobs/{job}.py",
        description=f"{job}: keep a follower in sync with the CDC topics (Structured Streaming).",
    )
    p.add_argument("--config", help="TOML settings file (else CDC_CONFIG, CDC_* env, defaults)")
    p.add_argument(
        "--name", default=job, help="job name, used for the watermark (default %(default)s)"
    )
    p.add_argument(
        "--topics", help="comma-separated topics (default: every table topic under the prefix)"
    )
    p.add_argument("--topic-pattern", help="regex of topics to follow, instead of --topics")
    p.add_argument(
        "--no-heartbeats",
        action="store_true",
        help="do not follow the reader's heartbeat topic (watermarks then come from "
        "the applied events' commit LSNs, which is approximate)",
    )
    p.add_argument("--starting-offsets", help="earliest (a new follower) or latest")
    p.add_argument(
        "--checkpoint", help="checkpoint directory (default: <spark.checkpoint_dir>/<name>)"
    )
    p.add_argument(
        "--available-now", action="store_true", help="process everything present, then exit 0"
    )
    p.add_argument("--trigger-interval", help="processing-time trigger, e.g. '500 milliseconds'")
    p.add_argument("--max-offsets-per-trigger", type=int, help="rate limit per micro-batch")
    a = p.parse_args(argv)
    settings = load_settings(a.config)
    topics = tuple(t.strip() for t in (a.topics or "").split(",") if t.strip())
    hb = None if a.no_heartbeats else heartbeat_topic(settings.kafka)
    opts = JobOptions(
        name=a.name,
        heartbeat_topic=hb,
        topics=topics,
        topic_pattern=None
        if topics
        else (a.topic_pattern or table_topic_pattern(settings.kafka.topic_prefix)),
        starting_offsets=a.starting_offsets or settings.spark.starting_offsets,
        checkpoint=a.checkpoint or f"{settings.spark.checkpoint_dir.rstrip('/')}/{a.name}",
        available_now=a.available_now,
        trigger_interval=a.trigger_interval or settings.spark.trigger_interval,
        max_offsets_per_trigger=a.max_offsets_per_trigger or settings.spark.max_offsets_per_trigger,
    )
    return settings, opts


def spark_session(settings: Settings, app_name: str) -> Any:
    """The active session: spark-submit's master if given, else the configured one."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf()
    builder = SparkSession.builder.appName(app_name)
    if not conf.contains("spark.master"):
        builder = builder.master(settings.spark.master)
    builder = builder.config(
        "spark.sql.shuffle.partitions", conf.get("spark.sql.shuffle.partitions", "2")
    )
    return builder.getOrCreate()


def kafka_stream(spark: Any, settings: Settings, opts: JobOptions) -> Any:
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
        import re

        pattern = opts.topic_pattern or ""
        if opts.heartbeat_topic:
            pattern = f"(?:{pattern})|{re.escape(opts.heartbeat_topic)}"
        reader = reader.option("subscribePattern", pattern)
    if opts.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(opts.max_offsets_per_trigger))
    return reader.load()


# --- the apply step, run inside Spark partitions ---------------------------------------------


@dataclass
class BatchStats:
    applied: int = 0
    skipped: int = 0
    failed: int = 0
    dead_lettered: int = 0
    max_commit_lsn: int = 0
    heartbeat_lsn: int = 0

    def add(self, other: BatchStats) -> None:
        self.applied += other.applied
        self.skipped += other.skipped
        self.failed += other.failed
        self.dead_lettered += other.dead_lettered
        self.max_commit_lsn = max(self.max_commit_lsn, other.max_commit_lsn)
        self.heartbeat_lsn = max(self.heartbeat_lsn, other.heartbeat_lsn)


class ChangeBuilder:
    """Reduced rows → sink Changes, decoding Debezium values with the events' own schema."""

    def __init__(
        self,
        schemas: Mapping[int, str] | None = None,
        on_new_schema: Callable[[str, Any], None] | None = None,
    ) -> None:
        self._schemas = schemas or {}
        self._converters: dict[int | None, Any] = {}
        self._on_new_schema = on_new_schema

    def _converter(self, table: str, schema_id: int | None) -> Any:
        from spark_jobs.convert import RowConverter, after_schema

        conv = self._converters.get(schema_id)
        if conv is None:
            schema_json = self._schemas.get(schema_id) if schema_id is not None else None
            schema = orjson.loads(schema_json) if schema_json else None
            conv = self._converters[schema_id] = RowConverter(after_schema(schema))
            if schema is not None and self._on_new_schema is not None:
                self._on_new_schema(table, schema)
        return conv

    def __call__(self, r: Any) -> Any:
        from sinks.base import Change, key_id, reduce_batch

        key = key_id(orjson.loads(r["key_json"]))
        table = r["table"]
        if r["is_delete"]:
            return Change(table, key, r["commit_lsn"], r["tx_order"], None)
        conv = self._converter(table, r["schema_id"])
        if not r["history"]:
            doc, unchanged = conv(orjson.loads(r["after_json"]))
            return Change(table, key, r["commit_lsn"], r["tx_order"], doc, unchanged)
        # The newest event left TOASTed columns out: fold the batch's older events in, so a
        # value written earlier in the same batch is not lost.
        changes = []
        for h in sorted(r["history"], key=lambda h: (h["commit_lsn"], h["tx_order"], h["offset"])):
            if h["is_delete"] or h["after_json"] is None:
                changes.append(Change(table, key, h["commit_lsn"], h["tx_order"], None))
            else:
                doc, unchanged = conv(orjson.loads(h["after_json"]))
                changes.append(Change(table, key, h["commit_lsn"], h["tx_order"], doc, unchanged))
        return reduce_batch(changes).winners[0]


_DLQ_READY: set[tuple[str, str]] = set()


def ensure_dead_letter_topic(settings: Settings) -> None:
    """Create the dead-letter topic if it is missing (brokers may not auto-create topics)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    k = settings.kafka
    if (k.bootstrap_servers, k.dead_letter_topic) in _DLQ_READY:
        return
    admin = AdminClient({"bootstrap.servers": k.bootstrap_servers})
    if k.dead_letter_topic not in admin.list_topics(timeout=30).topics:
        new = NewTopic(
            k.dead_letter_topic, num_partitions=1, replication_factor=k.replication_factor
        )
        try:
            admin.create_topics([new])[k.dead_letter_topic].result(timeout=30)
        except Exception as e:  # another job may have created it a moment ago
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
    _DLQ_READY.add((k.bootstrap_servers, k.dead_letter_topic))


def dead_letter(settings: Settings, job: str, records: Iterable[dict[str, Any]]) -> int:
    """Publish refused records with the reason; returns how many Kafka acknowledged.

    Raises PublishError unless every one was acknowledged: the batch then fails and is
    retried, so a poison message is never dropped silently.
    """
    from confluent_kafka import Producer

    from pgcdc.core.errors import PublishError

    ensure_dead_letter_topic(settings)
    producer = Producer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
        }
    )
    errors: list[str] = []
    sent = 0

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for rec in records:
        producer.produce(
            settings.kafka.dead_letter_topic,
            key=rec.get("key"),
            value=orjson.dumps({**rec, "job": job, "ts_ms": int(time.time() * 1000)}),
            on_delivery=delivered,
        )
        sent += 1
    left = producer.flush(60)
    if left or errors:
        raise PublishError(
            f"dead-letter topic {settings.kafka.dead_letter_topic}: "
            f"{left} not delivered, {len(errors)} refused ({errors[:1]})"
        )
    return sent


_SINKS: dict[tuple[str, str], Any] = {}


def cached_sink(settings: Settings, job: str, make_sink: Callable[[Settings], Any]) -> Any:
    """One sink per job in each Python worker: Spark reuses its workers across tasks and
    batches, so connections, loaded scripts and known indices outlive a micro-batch."""
    key = (job, settings.model_dump_json())
    sink = _SINKS.get(key)
    if sink is None:
        sink = _SINKS[key] = make_sink(settings)
    return sink


def apply_partition(
    settings: Settings,
    job: str,
    make_sink: Callable[[Settings], Any],
    rows: Iterable[Any],
    schemas: dict[int, str] | None = None,
) -> Iterator[BatchStats]:
    """Apply one partition of the reduced batch; yields its stats. Retryable failures raise.

    Changes go to the sink in chunks; records nobody can apply (unparseable, refused by the
    sink for good, truncates) go to the dead-letter topic with the reason; heartbeats only
    raise the partition's heartbeat LSN.
    """
    from pgcdc.core.errors import RetryableSinkError
    from spark_jobs.transforms import CHANGE, DEAD, HEARTBEAT, SCHEMA

    stats = BatchStats()
    # Schema rows may come after the changes that need them: read the partition first.
    rows = list(rows)
    schemas = dict(schemas or {})
    for row in rows:
        if row["kind"] == SCHEMA:
            schemas[row["schema_id"]] = row["schema_json"]
    sink = cached_sink(settings, job, make_sink)
    register = getattr(sink, "register_schema", None)
    build = ChangeBuilder(
        schemas,
        register,
    )
    try:
        chunk: list[Any] = []
        refused: list[dict[str, Any]] = []

        def flush() -> None:
            for change, res in zip(chunk, sink.apply(chunk), strict=True):
                if res.outcome == "applied":
                    stats.applied += 1
                elif res.outcome == "skipped":
                    stats.skipped += 1
                elif res.retryable:
                    raise RetryableSinkError(f"{job}: {res.table}/{res.key}: {res.reason}")
                else:
                    stats.failed += 1
                    refused.append(
                        {
                            "table": change.table,
                            "key": change.key,
                            "reason": res.reason,
                            "commit_lsn": change.commit_lsn,
                            "doc": change.doc,
                        }
                    )
                stats.max_commit_lsn = max(stats.max_commit_lsn, change.commit_lsn)
            chunk.clear()

        for row in rows:
            kind = row["kind"]
            if kind == CHANGE:
                chunk.append(build(row))
                if len(chunk) >= 2000:
                    flush()
            elif kind == SCHEMA:
                continue
            elif kind == HEARTBEAT:
                stats.heartbeat_lsn = max(stats.heartbeat_lsn, row["heartbeat_lsn"] or 0)
            else:
                reason = (
                    row["parse_error"]
                    if kind == DEAD
                    else "TRUNCATE is not applied by the followers; rebuild them after one"
                )
                refused.append(
                    {
                        "topic": row["topic"],
                        "partition": row["partition"],
                        "offset": row["offset"],
                        "key": row["key_json"],
                        "value": row["raw_value"],
                        "reason": reason,
                    }
                )
        if chunk:
            flush()
        if refused:
            stats.dead_lettered += dead_letter(settings, job, refused)
    except BaseException:
        # A sink in an unknown state is not reused: the retried batch gets a new one.
        _SINKS.pop((job, settings.model_dump_json()), None)
        sink.close()
        raise
    yield stats


def run(job: str, make_sink: Callable[[Settings], Any], argv: Sequence[str] | None = None) -> int:
    """Entry point shared by the sync jobs."""
    from spark_jobs.transforms import latest_per_key, parse_events

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings, opts = parse_args(job, argv)
    spark = spark_session(settings, f"cdc-{opts.name}")
    spark.sparkContext.setLogLevel("WARN")
    prefix = settings.kafka.topic_prefix

    # With a rate limit a batch may stop short in some partitions, so a heartbeat in it does
    # not prove that everything before its LSN was read: fall back to the events' own LSNs.
    exact = opts.heartbeat_topic is not None and not opts.max_offsets_per_trigger

    def process(batch_df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        reduced = latest_per_key(parse_events(batch_df, prefix, opts.heartbeat_topic))
        parts = reduced.rdd.mapPartitions(
            lambda rows: apply_partition(settings, opts.name, make_sink, rows)
        ).collect()
        total = BatchStats()
        for s in parts:
            total.add(s)
        # The watermark: every change committed before it is applied. A heartbeat carries the
        # reader's acknowledged LSN, and the reader sends it only after Kafka acknowledged
        # everything before it, so this batch (planned after the heartbeat was visible) holds
        # all of those changes, and they are applied by now.
        watermark = total.heartbeat_lsn if exact else total.max_commit_lsn
        if watermark:
            cached_sink(settings, opts.name, make_sink).record_watermark(opts.name, watermark)
        if total.applied or total.skipped or total.failed or total.dead_lettered:
            log.info(
                "batch %d: applied=%d skipped=%d failed=%d dead_lettered=%d watermark=%d (%.0f ms)",
                batch_id,
                total.applied,
                total.skipped,
                total.failed,
                total.dead_lettered,
                watermark,
                (time.monotonic() - t0) * 1e3,
            )

    writer = (
        kafka_stream(spark, settings, opts)
        .writeStream.foreachBatch(process)
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
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    exc = query.exception()
    if exc is not None:
        log.error("%s stopped: %s", opts.name, exc)
        return 1
    return 0
