"""What one sync task costs in Python CPU per change, stage by stage, with no Spark around it.

    .venv/bin/python -m benchmarks.task_cost [--rows 50000] [--repeats 3] [--profile both]

The direct read's task (:func:`spark_jobs.apply_loop.apply_ranges`) cut into its stages, each
timed as the process's CPU seconds over the changes it handled, against the real servers of
the local stack (``scripts/stack``):

* ``read``: the records of one Kafka range (:func:`spark_jobs.kafka_direct.read_range`);
* ``parse``: :class:`spark_jobs.parse.RecordParser` over them;
* ``reduce``: :func:`spark_jobs.reduce.latest_per_key`;
* ``cache``, ``search``, ``both``: :func:`spark_jobs.apply_loop.apply_partition` of the
  reduced rows into Redis, OpenSearch, and both (the change built once for both);
* ``ranges``: the task itself, :func:`spark_jobs.apply_loop.apply_ranges` of the whole range
  into both followers, end to end (the stages chained as a job's task runs them; what the
  task does around them, such as its garbage collection, counted too); with ``--apply
  native``, ``spark.apply = "native"`` (:mod:`spark_jobs.fast_changes`) in place of the
  read's parse, reduce and change building.

The records are the envelope benchmark's 10-column table, encoded by the reader's own
:class:`schemas.envelope.EventEncoder` with its version headers (as ``benchmarks.transfer``
makes them), produced once to a topic of their own. The servers' CPU is not counted (other
processes); what is printed is what a job's Python worker spends. ``--profile STAGE`` prints
that stage's cProfile, sorted by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.env import unlink_matching
from benchmarks.transfer import records
from pgcdc.core.settings import Settings

STAGES = ("read", "parse", "reduce", "cache", "search", "both", "ranges")


def _produce(bootstrap: str, recs: list[tuple[Any, ...]], topic: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for key, value, _t, _p, _o, _ts, headers in recs:
        while True:
            try:
                producer.produce(topic, value, key, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)


def _timed(profile: bool, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` and the CPU seconds it took (with its cProfile printed if asked)."""
    from spark_jobs.gc_pause import gc_paused

    prof = cProfile.Profile(time.process_time) if profile else None
    c0 = time.process_time()
    if prof is not None:
        prof.enable()
    with gc_paused():  # as the task runs each stage (spark_jobs.apply_loop.apply_ranges)
        out = fn(*args)
    if prof is not None:
        prof.disable()
    cpu = time.process_time() - c0
    if prof is not None:
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return out, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.task_cost", description=__doc__)
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=3, help="the best of this many runs a stage")
    p.add_argument("--profile", choices=STAGES, help="print this stage's cProfile (last run)")
    p.add_argument(
        "--apply",
        choices=("python", "native"),
        default="python",
        help="spark.apply of the ranges stage (native: spark_jobs.fast_changes)",
    )
    a = p.parse_args(argv)

    from pgcdc.core.kafka_config import client_config
    from spark_jobs.apply_loop import apply_partition, apply_ranges
    from spark_jobs.kafka_direct import Range, read_range
    from spark_jobs.parse import RecordParser
    from spark_jobs.reduce import latest_per_key
    from spark_jobs.sync import FOLLOWERS

    run_id = uuid.uuid4().hex[:8]
    prefix = f"taskcost{run_id}"
    settings = _settings(prefix, prefix)
    recs = records(a.rows, 1, 1)
    topic = f"{prefix}.{recs[0][2].split('.', 1)[1]}"
    bootstrap = settings.kafka.bootstrap_servers
    _produce(bootstrap, recs, topic)
    conf = client_config(settings.kafka)
    r = Range(topic, 0, 0, a.rows)
    value_bytes = sum(len(x[1]) for x in recs) / len(recs)
    print(f"{a.rows} changes of {value_bytes:.0f} B (JSON with schemas) on {topic}")

    best: dict[str, float] = {}
    try:
        for i in range(a.repeats):
            last = i == a.repeats - 1
            got, cpu = _timed(last and a.profile == "read", _list, read_range(conf, r))
            best["read"] = min(best.get("read", cpu), cpu)
            parser = RecordParser(prefix)
            rows, cpu = _timed(last and a.profile == "parse", _list, parser.rows(got))
            best["parse"] = min(best.get("parse", cpu), cpu)
            reduced, cpu = _timed(last and a.profile == "reduce", latest_per_key, rows)
            best["reduce"] = min(best.get("reduce", cpu), cpu)
            # Each apply into empty followers (a replay would be skipped: not the same work).
            for stage, followers in (
                ("cache", [FOLLOWERS["cache"]]),
                ("search", [FOLLOWERS["search"]]),
                ("both", [FOLLOWERS["cache"], FOLLOWERS["search"]]),
            ):
                into = _settings(prefix, f"{prefix}{stage}{i}")
                stats, cpu = _timed(
                    last and a.profile == stage, _list, apply_partition(into, followers, reduced)
                )
                assert all(s.applied + s.skipped == a.rows for s in stats), stats
                best[stage] = min(best.get(stage, cpu), cpu)
        # The task itself, after the stages: it starts from nothing held, as a job's does.
        del got, rows, reduced
        for i in range(a.repeats):
            into = _settings(prefix, f"{prefix}ranges{i}", a.apply)
            followers = [FOLLOWERS["cache"], FOLLOWERS["search"]]
            out, cpu = _timed(
                i == a.repeats - 1 and a.profile == "ranges",
                _list,
                apply_ranges(into, followers, None, [r], [0]),
            )
            stats = out
            assert len(stats) == 2 and all(s.applied == a.rows for s in stats), stats
            best["ranges"] = min(best.get("ranges", cpu), cpu)
    finally:
        _cleanup(settings, topic, prefix)
    print(f"{'stage':<8} {'µs/change (CPU, best of ' + str(a.repeats) + ')':>32}")
    for stage in STAGES[:-1]:
        print(f"{stage:<8} {best[stage] / a.rows * 1e6:>32.1f}")
    total = best["read"] + best["parse"] + best["reduce"] + best["both"]
    print(f"{'task':<8} {total / a.rows * 1e6:>32.1f}  (read + parse + reduce + both)")
    ranges = best["ranges"] / a.rows * 1e6
    print(f"{'ranges':<8} {ranges:>32.1f}  (apply_ranges into both, end to end)")
    return 0


def _list(items: Any) -> list[Any]:
    return list(items)


def _settings(topic_prefix: str, follower_prefix: str, apply: str = "python") -> Settings:
    return Settings(
        spark={"apply": apply},  # type: ignore[arg-type]
        kafka={"topic_prefix": topic_prefix},  # type: ignore[arg-type]
        redis={"key_prefix": follower_prefix},  # type: ignore[arg-type]
        search={"index_prefix": follower_prefix},  # type: ignore[arg-type]
    )


def _cleanup(settings: Settings, topic: str, prefix: str) -> None:
    from confluent_kafka.admin import AdminClient
    from opensearchpy import OpenSearch

    AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers}).delete_topics([topic])
    unlink_matching(settings.redis.url.get_secret_value(), f"{prefix}*")
    os_ = OpenSearch(settings.search.url.get_secret_value())
    os_.indices.delete(index=f"{prefix}*", ignore_unavailable=True)


if __name__ == "__main__":
    raise SystemExit(main())
