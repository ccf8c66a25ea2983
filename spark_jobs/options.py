"""The sync jobs' command line: options over the shared settings."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from pgcdc.core.contract import heartbeat_topic, table_topic_pattern
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import Settings, load_settings
from pgcdc.core.spark_settings import ReadPath
from spark_jobs.progress import batch_limit


@dataclass(frozen=True)
class JobOptions:
    """What one run of a sync job reads, where it checkpoints, and how often it triggers."""

    name: str  # the job's name: its watermark and its checkpoint folder
    heartbeat_topic: str | None  # None: watermarks come from the applied commit LSNs
    topics: tuple[str, ...]
    topic_pattern: str | None  # used when no topics are named
    starting_offsets: str
    checkpoint: str
    available_now: bool
    trigger_interval: str
    max_offsets_per_trigger: int | None
    # More tasks than Kafka partitions: the source splits offset ranges, and the batch is
    # then hash-partitioned by (topic, key) into this many (None: a task per partition).
    min_partitions: int | None = None
    # The followers the shared job applies to (spark_jobs/sync.py --followers); () for a
    # job of one follower.
    followers: tuple[str, ...] = ()


def parse_args(
    job: str, argv: Sequence[str] | None = None, followers: Sequence[str] = ()
) -> tuple[Settings, JobOptions]:
    """Command-line options over the shared settings (``CDC_*`` env, ``--config`` file);
    ``followers``: the names ``--followers`` chooses from (the shared job)."""
    a = parser(job, followers).parse_args(argv)
    settings = load_settings(a.config)
    if a.min_partitions and settings.spark.read is ReadPath.DIRECT:
        if "read" in settings.spark.model_fields_set:
            raise ConfigError(
                "--min-partitions splits partitions, which spark.read = direct does not (a "
                "task per Kafka partition): leave one of them out"
            )
        # As spark.min_partitions does: the partitions are split by Spark's Kafka source.
        spark = settings.spark.model_copy(update={"read": ReadPath.SPARK})
        settings = settings.model_copy(update={"spark": spark})
    topics = tuple(t.strip() for t in (a.topics or "").split(",") if t.strip())
    opts = JobOptions(
        name=a.name,
        heartbeat_topic=None if a.no_heartbeats else heartbeat_topic(settings.kafka),
        topics=topics,
        topic_pattern=None
        if topics
        else (a.topic_pattern or table_topic_pattern(settings.kafka.topic_prefix)),
        starting_offsets=a.starting_offsets or settings.spark.starting_offsets,
        checkpoint=a.checkpoint or f"{settings.spark.checkpoint_dir.rstrip('/')}/{a.name}",
        available_now=a.available_now,
        trigger_interval=a.trigger_interval or settings.spark.trigger_interval,
        max_offsets_per_trigger=batch_limit(
            a.max_offsets_per_trigger or settings.spark.max_offsets_per_trigger,
            a.available_now,
        ),
        min_partitions=a.min_partitions or settings.spark.min_partitions,
        followers=chosen_followers(a.followers, followers) if followers else (),
    )
    return settings, opts


def chosen_followers(given: str | None, known: Sequence[str]) -> tuple[str, ...]:
    """The followers ``--followers`` names (comma-separated; default all of ``known``)."""
    names = tuple(dict.fromkeys(n.strip() for n in (given or ",".join(known)).split(",")))
    names = tuple(n for n in names if n)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(
            f"--followers {given!r}: name one or more of {', '.join(known)}, comma-separated"
        )
    return names


def parser(job: str, followers: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The job's options (``--help`` prints them without starting Spark); ``followers``:
    the names the shared job's ``--followers`` chooses from."""
    p = argparse.ArgumentParser(
        prog=f"spark_jobs/{job}.py",
        description=f"{job}: keep "
        + ("followers" if followers else "a follower")
        + " in sync with the CDC topics (Structured Streaming).",
    )
    if followers:
        p.add_argument(
            "--followers",
            help=f"comma-separated followers to keep in sync from one read of the topics: "
            f"{', '.join(followers)} (default: all)",
        )
    p.add_argument("--config", help="TOML settings file (else CDC_CONFIG, CDC_* env, defaults)")
    p.add_argument(
        "--name",
        default=job,
        help=(
            "job name, used for the checkpoint (each follower's watermark keeps its own name)"
            if followers
            else "job name, used for the watermark"
        )
        + " (default %(default)s)",
    )
    p.add_argument(
        "--topics", help="comma-separated topics (default: every table topic under the prefix)"
    )
    p.add_argument(
        "--topic-pattern", help="regex of topics to follow (whole names), instead of --topics"
    )
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
    p.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        help="rate limit per micro-batch (with --available-now, default 200000: a long "
        "backlog is several batches, each with a progress line)",
    )
    p.add_argument(
        "--min-partitions",
        type=int,
        help="tasks per micro-batch when above the topics' partition count (the batch is "
        "then spread by key hash, one shuffle); default: a task per Kafka partition",
    )
    p.add_argument(
        "--health-port",
        type=int,
        help="serve /healthz, /readyz and /metrics on this port (see docs/production.md)",
    )
    return p
