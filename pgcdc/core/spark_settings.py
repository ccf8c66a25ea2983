"""The ``spark`` section of :class:`pgcdc.core.settings.Settings`, with the choices only it
takes: how the sync jobs run, read Kafka and parse its records, and when ``cdc status`` finds
a follower behind or stale."""

from __future__ import annotations

import os
from enum import StrEnum
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ParsePath(StrEnum):
    """Where the sync jobs parse the Debezium JSON: Spark SQL's ``from_json`` in the JVM, or
    orjson in the Python task that applies it (:mod:`spark_jobs.parse`)."""

    JVM = "jvm"
    PYTHON = "python"


class CheckpointFiles(StrEnum):
    """How a job writes its checkpoint's files: Hadoop's ``FileContext`` (Spark's default,
    an atomic rename that never overwrites) or its ``FileSystem`` API (on a local path the
    raw local file system, without the checksum files and the forks of ``readlink`` and
    ``chmod`` that the default costs each micro-batch; a lock file keeps a second job off
    the same checkpoint instead of the no-overwrite rename); ``auto``: ``filesystem`` on a
    local path, ``filecontext`` elsewhere (``hdfs://``, ``s3a://``)."""

    AUTO = "auto"
    FILECONTEXT = "filecontext"
    FILESYSTEM = "filesystem"


class ReadPath(StrEnum):
    """How the sync jobs read Kafka: Spark's Kafka source (every record through the JVM), or
    each task its own offset range with librdkafka (:mod:`spark_jobs.kafka_direct`)."""

    SPARK = "spark"
    DIRECT = "direct"


class DirectPlanner(StrEnum):
    """What plans the direct read's batches (``spark.direct_planner``): the Python data
    source (:mod:`spark_jobs.kafka_direct`), or Spark's Kafka source in the JVM, whose
    offsets the tasks then read themselves all the same; ``auto``: the Kafka source where
    the checkpoint is a local directory (``spark_jobs.source.direct_planner``)."""

    AUTO = "auto"
    PYTHON = "python"
    KAFKA = "kafka"


class ApplyPath(StrEnum):
    """How the direct read's tasks take their records to changes (``spark.apply``)."""

    PYTHON = "python"
    NATIVE = "native"


class SparkSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = "local[2]"
    # Each job checkpoints to <checkpoint_dir>/<job>. A relative path is made absolute against
    # the current directory when the settings are loaded, so the driver and the executors
    # (which receive the loaded settings) name the same folder; a URI (hdfs://…) is kept.
    checkpoint_dir: str = Field(default=".stack/checkpoints", validate_default=True)
    # How each micro-batch's checkpoint files are written (CheckpointFiles above): `filesystem`
    # costs the JVM less CPU a batch on a local checkpoint (docs/scale-out.md).
    checkpoint_files: CheckpointFiles = CheckpointFiles.AUTO
    trigger_interval: str = "500 milliseconds"
    max_offsets_per_trigger: int | None = Field(default=None, ge=1)
    # Tasks per micro-batch when more than the topics' partitions: the Kafka source splits
    # offset ranges and the jobs spread the batch by (topic, key) hash (one shuffle). Unset:
    # one task per Kafka partition and no shuffle (one key lives in one partition).
    min_partitions: int | None = Field(default=None, ge=1)
    # How long a job keeps running a batch again while its follower is unreachable (the
    # sink's own retries exhausted) before it stops with one line; a restart resumes there.
    follower_retry_s: float = Field(default=600.0, ge=0)
    # With `read = direct`: how long the job asks Kafka again for the offsets it plans a
    # batch from while the brokers do not answer (a restart, a leader election) before it
    # stops with one line; a job started again resumes from its checkpoint.
    kafka_unavailable_s: float = Field(default=300.0, gt=0)
    # The shared job (spark_jobs/sync.py, several followers): how long one follower may stay
    # unreachable within a batch while another follower applies it before the job goes on
    # without it; it is then *behind* and catches up from Kafka when it answers again.
    follower_behind_after_s: float = Field(default=30.0, ge=0)
    # The shared job: each task writes a chunk of changes to its followers at the same time,
    # a thread each (each follower's chunks in order, one in flight), and builds the next
    # chunk meanwhile; false: one follower after the other.
    concurrent_followers: bool = True
    # `cdc status` is unhealthy (exit 3) when a follower's watermark has not advanced for
    # this long while the reader has acknowledged changes past it (a stopped or stuck job;
    # an idle database is not). A rate-limited catch-up longer than this counts too: its
    # watermark waits until the job reaches the end of the topics.
    watermark_stale_s: float = Field(default=60.0, gt=0)
    # Where `cdc status` finds each running job's /metrics: job name -> the URL of its
    # --health-port, e.g. {cache_sync = "http://127.0.0.1:9411"}.
    job_endpoints: dict[str, str] = Field(default_factory=dict)
    starting_offsets: str = "earliest"
    # Where the jobs parse each record with `read = spark`: `jvm` (Spark SQL's from_json) or
    # `python` (orjson in the task that applies it, one parse per record: spark_jobs/parse.py).
    parse: ParsePath = ParsePath.JVM
    # How the jobs read Kafka: `direct` (each task reads its offset range itself with
    # librdkafka and parses it in Python, whatever `parse` says; a task per Kafka partition
    # or per core, `ranges_at_once`: spark_jobs/kafka_direct.py) or `spark` (Spark's Kafka source; every record crosses the
    # JVM). With `min_partitions` (which splits partitions) and no `read` given: `spark`.
    read: ReadPath = ReadPath.DIRECT
    # With `read = direct`: `native` (the default) takes a range of one table's common
    # records (one schema, version headers, no unchanged columns, plain values) from their
    # bytes to changes in pgcdc's native module (spark_jobs/fast_changes.py); any other
    # range, or no module, goes the `python` way (spark_jobs/parse.py, reduce.py,
    # changes.py), as every range does with `python`.
    apply: ApplyPath = ApplyPath.NATIVE
    # With `read = direct`: what plans each batch's offsets. `python`: the Python data source
    # (spark_jobs/kafka_direct.py), in Python processes of the driver's own. `kafka`: Spark's
    # Kafka source, in the JVM (no Python process plans: a job's first batch starts about
    # 0.5 s sooner); the tasks read each range themselves either way, with `kafka` the ranges
    # its offsets log says, so the checkpoint must be a local (or mounted) directory. `auto`:
    # `kafka` on a local checkpoint, `python` on `hdfs://`, `s3a://` and the like.
    direct_planner: DirectPlanner = DirectPlanner.AUTO
    # With `read = direct`: how many of a batch's offset ranges (Kafka partitions) a task
    # applies at once, each in a thread with follower connections of its own. Above 1, a
    # batch's ranges are spread over a task a core (the most records first, to the task with
    # the fewest), so that a task waiting on its followers leaves its core to another range
    # (with Spark's dynamic allocation, a task a range still: it asks for executors by the
    # tasks waiting); 1: a task a range, one at a time.
    ranges_at_once: int = Field(default=2, ge=1, le=16)

    @model_validator(mode="before")
    @classmethod
    def _min_partitions_reads_with_spark(cls, data: object) -> object:
        if isinstance(data, dict) and "read" not in data and data.get("min_partitions"):
            return {**data, "read": ReadPath.SPARK}
        return data

    @model_validator(mode="after")
    def _direct_is_a_task_per_partition(self) -> SparkSettings:
        if self.read is ReadPath.DIRECT and self.min_partitions:
            raise ValueError(
                "spark.min_partitions splits partitions, which spark.read = direct does not "
                "(a task per Kafka partition): leave one of them out"
            )
        return self

    @field_validator("checkpoint_dir")
    @classmethod
    def _absolute_checkpoint_dir(cls, v: str) -> str:
        return v if urlsplit(v).scheme else os.path.abspath(v)
