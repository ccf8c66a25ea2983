"""How long the search follower takes to build the next version of a table's index after a
type change the serving index cannot take (issue 38), against snapshotting the same table.

    .venv/bin/python -m benchmarks.index_rebuild [--rows 1000000] [--read direct]

One table of the backlog's shape (10 columns, about 200 bytes a row), ``--rows`` rows, and
the shared job serving both followers, as users run it:

1. **snapshot**: ``cdc run --until current`` takes the table's initial snapshot into Kafka,
   then the job (``--available-now``) fills Redis and the index from the topic;
2. **rebuild**: ``ALTER COLUMN quantity TYPE text USING 'q-' || quantity`` (the index maps
   ``quantity`` as an integer); the reader snapshots the table again, incrementally
   (``cdc run --until current``), then the same job, from its checkpoint, builds version 2
   beside version 1 and switches the index's name to it.

Each phase's reader and job times (the job's from its first batch to its last, so the JVM's
start is left out, and with it), rows per second and the job's CPU per row. The run fails
unless the name reads version 2 holding every row, with the new type, and Redis too.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis
from opensearchpy import OpenSearch

from benchmarks.context import Bench
from benchmarks.env import BenchEnv, run_alone
from benchmarks.followers import SparkJobs
from benchmarks.followers_backlog import apply_window, cpu_at
from benchmarks.ours import OursReader
from benchmarks.results import Figure
from benchmarks.workload.orders import bulk_load, create_table
from pgcdc.core.settings import load_settings
from sinks import search_versions
from sinks.search_index import index_name

log = logging.getLogger("bench.index_rebuild")

TABLE = "public.orders_rebuild"
ALTER = "ALTER TABLE public.orders_rebuild ALTER COLUMN quantity TYPE text USING 'q-' || quantity"


@dataclass
class Phase:
    reader_s: float  # cdc run --until current, start to exit
    job_s: float  # spark-submit to exit
    apply_s: float  # the job's first batch to its last
    job_cpu_us_per_row: float  # the job's process tree over the apply window

    @property
    def total_s(self) -> float:
        return self.reader_s + self.job_s


def _job(jobs: SparkJobs) -> tuple[float, float, float]:
    """Run the job to its end: (wall s, apply window s, CPU s in the window)."""
    (name,) = jobs.jobs
    path = jobs.log_path(name)
    before = path.stat().st_size if path.exists() else 0  # the log is appended to
    jobs.start()
    st = jobs.procs[name].wait(7200)
    if st.returncode != 0:
        raise RuntimeError(f"{name} exited {st.returncode}: {jobs.first_error(name)}")
    with path.open("rb") as f:
        f.seek(before)
        start, end = apply_window(f.read().decode(errors="replace"))
    cpu = cpu_at(st, jobs.started, end) - cpu_at(st, jobs.started, start)
    return st.wall_s, end - start, cpu


def _reader(reader: OursReader, snapshot_mode: str) -> float:
    m = reader.launch(until_current=True, snapshot_mode=snapshot_mode)
    st = m.wait(7200)
    if st.returncode != 0:
        raise RuntimeError(f"the reader exited {st.returncode}: {reader.log_tail(5)}")
    return st.wall_s


def _held(redis_url: str, search_url: str, prefix: str, rows: int, version: int) -> None:
    """Raise unless the index's name reads ``version`` holding ``rows`` documents, and Redis
    holds ``rows`` rows (after the change: quantity as text, in both)."""
    client = OpenSearch(hosts=[search_url])
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        name = index_name(prefix, TABLE)
        serving = search_versions.serving(client, name)
        client.indices.refresh(index=name)
        count = int(client.count(index=name)["count"])
        if serving is None or serving.version != version or count != rows:
            raise RuntimeError(f"{name} reads {serving} holding {count} documents, not {rows}")
        keys = sum(1 for _ in r.scan_iter(match=f"{prefix}:{TABLE}:*", count=10_000))
        if keys != rows:
            raise RuntimeError(f"Redis holds {keys} rows of {TABLE}, not {rows}")
        if version > 1:
            doc = client.get(index=name, id="7")["_source"]
            cached = r.hget(f"{prefix}:{TABLE}:7", "quantity")
            if doc.get("quantity") != "q-8" or json.loads(cached or "null") != "q-8":
                raise RuntimeError(f"row 7 after the change: index {doc}, Redis {cached!r}")
    finally:
        client.close()
        r.close()


def shared_job_on(
    env: BenchEnv, table: str, rows: int, role: str, **job: Any
) -> tuple[OursReader, str, SparkJobs]:
    """A fresh database holding ``table`` with ``rows`` rows (the backlog's shape), our
    reader for it, and the shared job for both followers from the topic's start (``job``:
    more of :class:`SparkJobs`' options); (reader, the followers' prefix, jobs)."""
    env.create_database()
    with env.connect() as conn:
        create_table(conn, table)
        bulk_load(conn, table, rows)
    reader = OursReader(env, [table], role=role)
    prefix = env.name(role)
    jobs = SparkJobs(
        env, reader.prefix, reader.workdir, jobs=("sync:cache,search",), follower_prefix=prefix,
        starting_offsets="earliest", **job,
    )  # fmt: skip
    return reader, prefix, jobs


def run(env: BenchEnv, rows: int, read: str | None = None) -> dict[str, Any]:
    """Both phases on one table; every figure of the run."""
    settings = load_settings()
    redis_url = settings.redis.url.get_secret_value()
    search_url = settings.search.url.get_secret_value()
    reader, prefix, jobs = shared_job_on(
        env, TABLE, rows, "ix", read=read, extra_args=("--available-now",)
    )
    try:
        phases: dict[str, Phase] = {}
        for phase, snapshot_mode, version in (("snapshot", "initial", 1), ("rebuild", None, 2)):
            if snapshot_mode is None:
                with env.connect() as conn:
                    conn.execute(ALTER)
            reader_s = _reader(reader, snapshot_mode or "no_data")
            job_s, apply_s, cpu = _job(jobs)
            _held(redis_url, search_url, prefix, rows, version)
            phases[phase] = Phase(
                round(reader_s, 1), round(job_s, 1), round(apply_s, 1), round(cpu / rows * 1e6, 1)
            )
            log.info("%s of %d rows: reader %.1f s, job %.1f s (applying %.1f s, %.1f µs CPU a "
                     "row)", phase, rows, reader_s, job_s, apply_s,
                     phases[phase].job_cpu_us_per_row)  # fmt: skip
    finally:
        jobs.stop()
        if not env.keep:
            for problem in jobs.drop_follower_state(redis_url, search_url):  # versions too
                log.warning("cleanup: %s", problem)
    snap, rebuild = phases["snapshot"], phases["rebuild"]
    return {
        "rows": rows,
        "read": read or settings.spark.read,
        "snapshot": {**asdict(snap), "total_s": round(snap.total_s, 1)},
        "rebuild": {**asdict(rebuild), "total_s": round(rebuild.total_s, 1)},
        "rebuild_to_snapshot": round(rebuild.total_s / snap.total_s, 2),
    }


def index_rebuild(b: Bench) -> None:
    """The ``index_rebuild`` group: 1,000,000 rows (quick: 20,000); figures under
    ``followers``."""
    rows = 20_000 if b.env.quick else 1_000_000
    detail = (
        f"{rows:,}-row table (10 columns), both followers by the shared job, local[2]; "
        "reader: cdc run --until current; job: --available-now"
    )
    names = [
        "index rebuild after a type change, s",
        "snapshot into both followers, s",
        "index rebuild ÷ snapshot",
    ]
    with b.record.guarded("followers", names, detail):
        got = run(b.env, rows)
        for phase, what in (("snapshot", "snapshot into both followers"),
                            ("rebuild", "index rebuild after a type change")):  # fmt: skip
            p = got[phase]
            b.record.add(Figure("followers", f"{what}, s", p["total_s"], "s",
                                f"{detail}; reader {p['reader_s']:.1f} s + job {p['job_s']:.1f} s "
                                f"(applying {p['apply_s']:.1f} s, "
                                f"{p['job_cpu_us_per_row']:.0f} µs CPU a row)"))  # fmt: skip
        b.record.add(Figure("followers", "index rebuild ÷ snapshot", got["rebuild_to_snapshot"],
                            "×", detail))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.index_rebuild", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--read", choices=("spark", "direct"), help="spark.read (default: settings')")
    p.add_argument("--keep", action="store_true", help="keep the database, topics and keys")
    a = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("opensearch").setLevel(logging.WARNING)  # a line per request

    def measure(env: BenchEnv) -> dict[str, Any]:
        started = time.monotonic()
        result = run(env, a.rows, a.read)
        return {**result, "bench_s": round(time.monotonic() - started, 1)}

    return run_alone(a.keep, "index_rebuild", measure)


if __name__ == "__main__":
    sys.exit(main())
