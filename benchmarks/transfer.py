"""What it costs a sync job's task to get its rows into Python and reduce them.

    .venv/bin/python -m benchmarks.transfer [--path both|arrow|rdd|python|arrow,python]
        [--rows 60000] [--updates 1] [--partitions 2] [--repeats 3]

Real events (the envelope benchmark's 10-column table, encoded by the reader's own
:class:`~schemas.envelope.EventEncoder` as Connect JSON with schemas on, with the reader's
version headers) in a Kafka-shaped frame cached in a ``local[2]`` session, then, as a job's
batch does: parsed and classified (:mod:`spark_jobs.transforms`) and reduced per partition
(:func:`spark_jobs.reduce.latest_per_key`), with no sink. ``--path arrow`` is how the jobs
do it (``mapInArrow`` and :func:`spark_jobs.transfer.rows_from_arrow`); ``--path rdd`` is
how they did before (``DataFrame.rdd.mapPartitions`` over pickled Rows); ``--path python``
is ``spark.parse = "python"``: the raw records over Arrow, parsed in the task
(:mod:`spark_jobs.parse`), no JSON parse in the JVM. ``both`` runs all three. Each key is
written ``--updates`` times, so the reduction keeps ``rows / updates`` changes.

Prints, per path, the best of ``--repeats`` interleaved runs: wall time of the Spark job,
the JVM's CPU time and the Python tasks' CPU time, each per row, beside a run that only
parses and classifies (the JVM work both paths share). For the Python workers' peak
resident memory run one path per process (``--path arrow``): a worker's peak is its whole
life's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.envelope import rows as table_rows
from benchmarks.envelope import sources, table
from pgcdc.core.contract import VersionOrder
from pgcdc.core.settings import SchemaSettings
from schemas.envelope import EventEncoder

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "headers array<struct<key:string,value:binary>>"
)


def records(n: int, updates: int, partitions: int) -> list[tuple[Any, ...]]:
    """``n`` Kafka records of ``n // updates`` keys, as the Kafka source gives them."""
    import datetime as dt

    t = table()
    enc = EventEncoder(SchemaSettings(), "bench", "cdc")
    keys = max(1, n // updates)
    data = table_rows(keys)
    srcs = sources(n)
    topic = enc.topic(t)
    now = dt.datetime(2024, 1, 1)
    out = []
    for i in range(n):
        row = data[i % keys]
        op = "c" if i < keys else "u"
        src = srcs[i]
        key = enc.encode_key(t, row)
        value = enc.encode_value(t, op, None, row, src)
        headers = VersionOrder(src.lsn, i % 100).headers()
        part = i % keys % partitions
        out.append((key, value, topic, part, i, now, headers))
    return out


def _jvm_cpu_s(pid: int) -> float:
    """CPU seconds the JVM (driver and, in local mode, executor) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.transfer", description=__doc__)
    p.add_argument(
        "--path",
        default="both",
        help="arrow, rdd, python, or several with commas (arrow,python); both: all three",
    )
    p.add_argument("--rows", type=int, default=60_000)
    p.add_argument("--updates", type=int, default=1, help="events per key")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_jobs.parse import RecordParser
    from spark_jobs.reduce import latest_per_key
    from spark_jobs.transfer import RECORD_COLUMNS, records_from_arrow, rows_from_arrow
    from spark_jobs.transforms import classify, parse_events

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-transfer")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = int(spark._jvm.ProcessHandle.current().pid())  # type: ignore[attr-defined]
    recs = records(a.rows, a.updates, a.partitions)
    value_bytes = sum(len(r[1]) for r in recs) / len(recs)
    raw = spark.createDataFrame(recs, KAFKA_SCHEMA).repartition(a.partitions, "partition")
    raw = raw.cache()
    raw.count()
    events = classify(parse_events(raw, "bench"))

    def peak_rss_kib() -> int:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def by_rows(rows: Iterator[Any]) -> Iterator[tuple[int, int, float]]:
        c0 = time.process_time()
        n = len(latest_per_key(rows))
        yield (n, peak_rss_kib(), time.process_time() - c0)

    def by_arrow(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        c0 = time.process_time()
        n = len(latest_per_key(rows_from_arrow(batches)))
        cpu = time.process_time() - c0
        yield pa.RecordBatch.from_pylist([{"n": n, "rss": peak_rss_kib(), "cpu": cpu}])

    def by_python(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        c0 = time.process_time()
        rows = RecordParser("bench").rows(records_from_arrow(batches))
        n = len(latest_per_key(rows))
        cpu = time.process_time() - c0
        yield pa.RecordBatch.from_pylist([{"n": n, "rss": peak_rss_kib(), "cpu": cpu}])

    records_only = raw.select(*RECORD_COLUMNS)

    def parse_only() -> list[tuple[int, int, float]]:
        events.write.format("noop").mode("overwrite").save()
        return []

    runs: dict[str, Any] = {
        "parse only (JVM, no Python)": parse_only,
        "rdd (pickled Rows)": lambda: events.rdd.mapPartitions(by_rows).collect(),
        "arrow (mapInArrow)": lambda: [
            tuple(r) for r in events.mapInArrow(by_arrow, "n long, rss long, cpu double").collect()
        ],
        "python (parse in the task)": lambda: [
            tuple(r)
            for r in records_only.mapInArrow(by_python, "n long, rss long, cpu double").collect()
        ],
    }
    if a.path != "both":
        paths = set(a.path.split(","))
        unknown = paths - {"arrow", "rdd", "python"}
        if unknown:
            p.error(f"unknown --path {', '.join(sorted(unknown))}")
        runs = {k: v for k, v in runs.items() if k.split()[0] in paths}
    best: dict[str, tuple[float, float, float]] = {k: (1e9, 1e9, 1e9) for k in runs}
    kept: dict[str, int] = {}
    peak = dict.fromkeys(runs, 0)
    for _ in range(a.repeats):  # interleaved: the machine's load hits every path alike
        for label, run in runs.items():
            j0, t0 = _jvm_cpu_s(jvm_pid), time.perf_counter()
            got = run()
            wall, jvm = time.perf_counter() - t0, _jvm_cpu_s(jvm_pid) - j0
            py = sum(cpu for _, _, cpu in got)
            best[label] = tuple(map(min, best[label], (wall, jvm, py)))  # type: ignore[assignment]
            kept[label] = sum(n for n, _, _ in got)
            peak[label] = max(peak[label], *(rss for _, rss, _ in got), 0)
    spark.stop()
    print(
        f"{a.rows:,} rows ({value_bytes:,.0f}-byte values, {a.updates} per key) in "
        f"{a.partitions} partitions, local[2], best of {a.repeats} (per row: wall, JVM CPU, "
        f"Python task CPU):"
    )
    for label, (wall, jvm, py) in best.items():
        us = 1e6 / a.rows
        rss = f", Python worker peak RSS {peak[label] / 1024:,.0f} MiB" if peak[label] else ""
        print(
            f"  {label:28s} {wall * us:6.1f} us wall, {jvm * us:6.1f} us JVM, "
            f"{py * us:6.1f} us Python; {kept[label]:,} rows after the reduction{rss}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
