"""A backlog applied into both followers, against the rate at which the reader produced it
(issue 30): ``python -m benchmarks.followers_backlog [--rows 100000] [--modes shared,separate]
[--paths direct:python,spark:jvm]``, and the ``backlog`` group of ``make bench``.

The run loads ``--rows`` rows of the benchmark's 10-column table into a database of its own,
snapshots them into Kafka with ``cdc run --until current`` (the reader's rate: rows over its
wall time, its start included; the faster of this snapshot and a second one taken after the
warm-up passes, by a reader of its own), then applies the topics into Redis and OpenSearch, once per
mode and read/parse path (``spark.read``, ``spark.parse``), each into follower prefixes of
its own from offset 0 with ``--available-now``, after the shared job applied it unmeasured
until OpenSearch's cost a document stopped falling (:func:`warm_passes`, ``--warm-passes``):

* ``shared``: ``spark_jobs/sync.py --followers cache,search``, one read for both;
* ``separate``: ``cache_sync.py`` and ``search_sync.py`` side by side, as users ran them.

A job's *apply window* runs from its ``started`` log line (the streaming query is running:
the JVM's start is behind it) to its last batch line; a mode's window from its first job's
start to its last job's end. The mode's rate is rows over that window, and its CPU is the
CPU seconds its process trees (JVM and Python workers) spent inside the window, over rows
(each row is one change, applied to both followers). Peak RSS is each job's process tree
over its whole run. Both followers must hold every row at the end, else the mode fails.
Every ratio compares figures of the same run.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import redis
from opensearchpy import OpenSearch

from benchmarks.context import Bench
from benchmarks.env import ROOT, BenchEnv, run_alone
from benchmarks.followers import SparkJobs
from benchmarks.ours import OursReader
from benchmarks.proc import ProcStats
from benchmarks.results import Figure, NotMeasured
from benchmarks.servers import Sampler
from benchmarks.warmup import warm
from benchmarks.workload.orders import bulk_load, create_table
from pgcdc.core.settings import load_settings

log = logging.getLogger("bench.backlog")

TABLE = "public.orders_backlog"
MODES: dict[str, tuple[str, ...]] = {
    "shared": ("sync:cache,search",),
    "separate": ("cache_sync", "search_sync"),
    # One follower each (not in make bench): what each follower's share of the cost is.
    "cache": ("sync:cache",),
    "search": ("sync:search",),
}
_HOLDS = {"cache": ("redis",), "search": ("search",)}
# The path whose batches after the first the backlog group measures (issue 30's CPU per
# change: what the job spends on a change once started, as a streaming job spends it).
STEADY_PATH = ("direct", "python")
# Unmeasured passes at most before the modes are measured (warm_passes).
WARM_PASSES = 3
STEADY_BATCH = 30_000
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass
class ModeResult:
    mode: str
    read: str
    parse: str
    rows_per_s: float
    ratio_to_reader: float
    cpu_us_per_change: float
    window_s: float
    peak_rss_mib: dict[str, float]
    held: dict[str, int]
    # After each job's first batch (no start-up in it: the JVM's JIT, the Python workers'
    # start): CPU µs per change and changes/s, when the run had more than one batch.
    steady_cpu_us_per_change: float | None = None
    steady_rows_per_s: float | None = None
    # Each job's peak PSS (MiB), and that peak by kind of process
    # (benchmarks.proc.Measured.peak_parts_text).
    peak_pss_mib: dict[str, float] | None = None
    peak_parts: dict[str, str] | None = None
    # Each job's CPU seconds by kind of process, its whole run (start-up included).
    cpu_parts: dict[str, str] | None = None
    # Cores kept busy inside the apply window: each server, the jobs (``jobs``) and the whole
    # machine (``machine``: every process, the helpers' and the system's too), of 2.
    cores: dict[str, float] | None = None
    # Each job's CPU seconds by kind of process inside the apply window.
    window_cpu_parts: dict[str, str] | None = None
    # Seconds from the jobs' spark-submit to their last batch: the window and the start-up
    # before it (the JVM's, the session's), which the window leaves out.
    submit_to_done_s: float | None = None


def _stamp(line: str) -> float | None:
    m = _STAMP.match(line)
    if m is None:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def apply_window(log_text: str) -> tuple[float, float]:
    """(start, end) wall times of a job's applying: its ``started`` line to its last batch
    line (``ValueError`` if either is missing: the job applied nothing)."""
    start = end = None
    for line in log_text.splitlines():
        if " spark_jobs.job: started " in line and start is None:
            start = _stamp(line)
        elif " spark_jobs.apply_loop: batch " in line and "applied=" in line:
            end = _stamp(line) or end
    if start is None or end is None:
        raise ValueError("no 'started' line or no batch line in the job's log")
    return start, end


_BATCH = re.compile(
    r" spark_jobs\.apply_loop: batch (\d+): (?:\S+ )?applied=(\d+) skipped=(\d+) "
    r"failed=(\d+) .*\((\d+) ms\)"
)


def batch_spans(log_text: str) -> list[tuple[int, float, float, int]]:
    """(batch id, start, end, changes) of each batch of a job's log (the shared job logs a
    line per follower: the batch spans them, its changes are the first line's)."""
    spans: dict[int, tuple[float, float, int]] = {}
    for line in log_text.splitlines():
        m = _BATCH.search(line)
        end = _stamp(line)
        if m is None or end is None:
            continue
        bid, changes = int(m.group(1)), sum(int(m.group(i)) for i in (2, 3, 4))
        start = end - int(m.group(5)) / 1e3
        if bid in spans:
            s0, e0, c0 = spans[bid]
            spans[bid] = (min(s0, start), max(e0, end), c0)
        else:
            spans[bid] = (start, end, changes)
    return [(b, *spans[b]) for b in sorted(spans)]


def steady(
    stats: ProcStats, started: float, spans: list[tuple[int, float, float, int]]
) -> tuple[float, float] | None:
    """(CPU µs per change, changes/s) over a job's batches after its first, or None when
    they are too few to say: under a tenth of the changes, or under two seconds (a tree's
    CPU is sampled about once a second: a trailing batch of three changes once read as
    -146,667 µs a change)."""
    later = spans[1:]
    changes = sum(c for *_, c in later)
    if not later or changes * 10 < sum(c for *_, c in spans):
        return None
    start, end = later[0][1], later[-1][2]
    if end - start < 2.0:
        return None
    cpu = cpu_at(stats, started, end) - cpu_at(stats, started, start)
    return cpu / changes * 1e6, changes / max(end - start, 1e-3)


def cpu_at(stats: ProcStats, started_wall: float, at: float) -> float:
    """CPU seconds of a measured tree at wall time ``at``: between the samples on either
    side of it, in proportion (a sample comes about once a second; the nearest one before
    ``at`` missed up to a second of the busiest part of a short window)."""
    before: tuple[float, float] | None = None
    for offset, cpu in stats.samples:
        t = started_wall + offset
        if t > at:
            if before is None:
                return 0.0
            return before[1] + (cpu - before[1]) * (at - before[0]) / (t - before[0])
        before = (t, cpu)
    return before[1] if before is not None else 0.0


def held_counts(redis_url: str, search_url: str, prefix: str, table: str = TABLE) -> dict[str, int]:
    """Rows of ``table`` each follower holds under ``prefix``."""
    r = redis.Redis.from_url(redis_url)
    try:
        in_redis = sum(1 for _ in r.scan_iter(match=f"{prefix}:{table}:*", count=10_000))
    finally:
        r.close()
    client = OpenSearch(hosts=[search_url])
    try:
        index = f"{prefix}-{table}"
        client.indices.refresh(index=index)
        in_search = int(client.count(index=index)["count"])
    except Exception:  # no index: nothing held
        in_search = 0
    finally:
        client.close()
    return {"redis": in_redis, "search": in_search}


def produce(env: BenchEnv, rows: int) -> tuple[OursReader, float, float]:
    """Load and snapshot ``rows`` rows; (reader, reader rows/s, reader CPU µs per change)."""
    env.create_database()
    with env.connect() as conn:
        create_table(conn, TABLE)
        bulk_load(conn, TABLE, rows)
    return snapshot(env, rows, "bl")


def snapshot(env: BenchEnv, rows: int, role: str) -> tuple[OursReader, float, float]:
    """Snapshot the loaded table with a reader of its own (``role``: its slot and topic
    prefix); (reader, rows/s, CPU µs per change)."""
    reader = OursReader(env, [TABLE], role=role)
    m = reader.launch(until_current=True, snapshot_mode="initial")
    st = m.wait(3600)
    if st.returncode != 0:
        raise RuntimeError(f"the reader exited {st.returncode}: {reader.log_tail(5)}")
    return reader, rows / st.wall_s, st.cpu_s / rows * 1e6


def apply_mode(
    env: BenchEnv,
    reader: OursReader,
    rows: int,
    mode: str,
    path: tuple[str, str],
    reader_rate: float,
    max_offsets: int | None = None,
    label: str = "",
) -> ModeResult:
    """Apply the backlog once with ``mode``'s jobs, reading and parsing by ``path`` (the
    settings ``spark.read`` and ``spark.parse``), into follower prefixes of their own
    (``label`` told apart from the others); its figures."""
    read, parse = path
    settings = load_settings()
    redis_url = settings.redis.url.get_secret_value()
    search_url = settings.search.url.get_secret_value()
    prefix = env.name(f"bl_{mode}_{read}_{parse}{label}")
    jobs = SparkJobs(
        env, reader.prefix, reader.workdir, jobs=MODES[mode], follower_prefix=prefix,
        starting_offsets="earliest", parse=parse, read=read,
        extra_args=("--available-now", *(("--max-offsets-per-trigger", str(max_offsets))
                                         if max_offsets else ())),
    )  # fmt: skip
    started = time.time()
    jobs.start()
    try:
        stats: dict[str, ProcStats] = {}
        with Sampler() as servers:
            for job, m in jobs.procs.items():
                st = m.wait(3600)
                if st.returncode != 0:
                    raise RuntimeError(f"{job} exited {st.returncode}: {jobs.first_error(job)}")
                stats[job] = st
        windows = {j: apply_window(jobs.log_path(j).read_text(errors="replace")) for j in stats}
        start = min(w[0] for w in windows.values())
        end = max(w[1] for w in windows.values())
        cpu = sum(cpu_at(st, started, end) - cpu_at(st, started, start) for st in stats.values())
        held = held_counts(redis_url, search_url, prefix)
        wanted = _HOLDS.get(mode, ("redis", "search"))
        if any(held[f] != rows for f in wanted):
            raise RuntimeError(f"{mode}: the followers hold {held}, not {rows} rows each")
        window = max(end - start, 1e-3)
        per_job = [
            steady(st, started, batch_spans(jobs.log_path(j).read_text(errors="replace")))
            for j, st in stats.items()
        ]
        known = [x for x in per_job if x is not None]
        return ModeResult(
            mode=mode,
            read=read,
            parse=parse,
            rows_per_s=rows / window,
            ratio_to_reader=rows / window / reader_rate,
            cpu_us_per_change=cpu / rows * 1e6,
            window_s=window,
            peak_rss_mib={j: round(st.peak_rss_mb) for j, st in stats.items()},
            peak_pss_mib={j: round(st.peak_pss_mb) for j, st in stats.items()},
            peak_parts={j: jobs.procs[j].peak_parts_text() for j in stats},
            cpu_parts={j: jobs.procs[j].cpu_parts_text() for j in stats},
            window_cpu_parts={j: jobs.procs[j].cpu_parts_between(start, end) for j in stats},
            submit_to_done_s=round(end - started, 2),
            cores={"jobs": round(cpu / window, 2), **servers.cores(start, end)},
            held=held,
            steady_cpu_us_per_change=sum(x[0] for x in known)
            if len(known) == len(per_job)
            else None,
            steady_rows_per_s=min(x[1] for x in known) if len(known) == len(per_job) else None,
        )
    finally:
        jobs.stop()
        if not env.keep:
            for problem in jobs.drop_follower_state(redis_url, search_url):
                log.warning("cleanup: %s", problem)


def warm_passes(
    env: BenchEnv, reader: OursReader, rows: int, reader_rate: float, max_passes: int
) -> list[dict[str, float]]:
    """Apply the backlog with the shared job on the direct read, unmeasured, until
    OpenSearch's CPU a document stops falling (:func:`benchmarks.warmup.warm`) or
    ``max_passes`` ran: what each pass cost OpenSearch a document (µs) and its rate.

    :mod:`benchmarks.warmup`'s rounds leave OpenSearch's JIT compiler work that only the
    jobs' own writes bring: after six or seven rounds (the last at 36-45 µs a document), the
    first backlog cost OpenSearch 65-70 µs a document, 2.0-2.5 s of it its C2 compiler's, the
    second 46-55 and the third 45-47 (measured 2026-12-01). The mode measured first then ran on a
    colder server than the next, and the ratios said so. Warming on the measured path makes
    the modes' figures those of a server in service, which stays warm."""
    passes: list[dict[str, float]] = []
    for n in range(max_passes):
        r = apply_mode(env, reader, rows, "shared", STEADY_PATH, reader_rate, label=f"_warm{n}")
        per_doc = (r.cores or {}).get("opensearch", 0.0) * r.window_s / rows * 1e6
        passes.append({"opensearch_cpu_us_per_doc": round(per_doc, 1),
                       "rows_per_s": round(r.rows_per_s)})  # fmt: skip
        log.info("warm-up pass %d (not measured): %.0f rows/s, OpenSearch %.1f µs of CPU a "
                 "document", n + 1, r.rows_per_s, per_doc)  # fmt: skip
        if warm([p["opensearch_cpu_us_per_doc"] for p in passes]):
            break
    return passes


def run(
    env: BenchEnv,
    rows: int,
    modes: list[str],
    paths: list[tuple[str, str]],
    max_offsets: int | None = None,
    steady_batch: int | None = None,
    warm_up: int = WARM_PASSES,
) -> dict[str, Any]:
    """Produce once, warm up (:func:`warm_passes`, at most ``warm_up`` passes), apply once
    per mode and (read, parse) path; every figure of the run. With ``steady_batch``, the
    shared job on the direct read applies the backlog once more in batches of that many
    records (``steady``: its figures after the first batch)."""
    reader, first_rate, reader_cpu = produce(env, rows)
    log.info("reader: %d rows at %.0f rows/s (%.1f µs CPU per change)", rows, first_rate,
             reader_cpu)  # fmt: skip
    warmed = warm_passes(env, reader, rows, first_rate, warm_up) if warm_up else []
    # The first snapshot ran on a server just started or idle (PostgreSQL's and Kafka's
    # caches cold, the reader the first process of the run); the modes run after the warm
    # passes. The reader's rate is the faster of that snapshot and a second, taken now, so
    # that the ratios do not gain from a cold denominator.
    _again, again_rate, again_cpu = snapshot(env, rows, "bl_again")
    log.info("reader, a second snapshot: %d rows at %.0f rows/s (%.1f µs CPU per change)",
             rows, again_rate, again_cpu)  # fmt: skip
    reader_rate, reader_cpu = max((first_rate, reader_cpu), (again_rate, again_cpu))
    results = []
    for path in paths:
        for mode in modes:
            r = apply_mode(env, reader, rows, mode, path, reader_rate, max_offsets)
            log.info("%s (read=%s parse=%s): %.0f rows/s = %.2f× the reader (%.2f s; %.2f s from spark-submit), %.1f µs CPU per change, "
                     "peak RSS %s MiB, PSS %s MiB (%s); CPU by process %s; after the first batch %s µs CPU per change, %s rows/s; "
                     "cores busy in the window %s; CPU by process in the window %s",
                     mode, *path, r.rows_per_s, r.ratio_to_reader, r.window_s, r.submit_to_done_s,
                     r.cpu_us_per_change, r.peak_rss_mib, r.peak_pss_mib, r.peak_parts, r.cpu_parts, _round(r.steady_cpu_us_per_change),
                     _round(r.steady_rows_per_s), r.cores, r.window_cpu_parts)  # fmt: skip
            results.append(asdict(r))
    steady_run = None
    if steady_batch:
        r = apply_mode(env, reader, rows, "shared", STEADY_PATH, reader_rate, steady_batch)
        log.info("shared (read=%s parse=%s), %d records a batch: after the first batch %s µs "
                 "CPU per change, %s rows/s", *STEADY_PATH, steady_batch,
                 _round(r.steady_cpu_us_per_change), _round(r.steady_rows_per_s))  # fmt: skip
        steady_run = asdict(r)
    return {
        "rows": rows,
        "reader_rows_per_s": round(reader_rate),
        "reader_snapshots_rows_per_s": [round(first_rate), round(again_rate)],
        "reader_cpu_us_per_change": round(reader_cpu, 1),
        "modes": results,
        "steady_batch": steady_batch,
        "steady": steady_run,
        "warm_passes": warmed,
    }


def backlog(b: Bench) -> None:
    """The ``backlog`` group: both modes on the direct read and on today's default (Spark's
    Kafka source, the JVM parse), 100,000 rows (quick: 10,000); figures under
    ``followers``."""
    rows = 10_000 if b.env.quick else 100_000
    paths = [("direct", "python"), ("spark", "jvm")]
    detail = f"{rows:,}-row backlog (10 columns), both followers, --available-now, local[2]"
    names = [
        f"backlog {what} ({m}, read={r} parse={p})"
        for m in ("shared", "separate")
        for r, p in paths
        for what in ("applied × the reader's rate", "CPU µs per change")
    ]
    names.append(
        "backlog CPU µs per change after the first batch (shared, read={} parse={})".format(
            *STEADY_PATH
        )
    )
    with b.record.guarded("followers", names, detail):
        if not (ROOT / "spark_jobs" / "sync.py").exists():
            raise NotMeasured("spark_jobs/sync.py (the shared job) is not in this checkout")
        batch = max(rows // 4, 1) if b.env.quick else STEADY_BATCH
        result = run(b.env, rows, ["shared", "separate"], paths, steady_batch=batch,
                     warm_up=1 if b.env.quick else WARM_PASSES)  # fmt: skip
        if result["warm_passes"]:
            said = ", ".join(f"{p['opensearch_cpu_us_per_doc']:.0f}" for p in result["warm_passes"])
            b.record.notes.append(
                f"backlog: the shared job applied the backlog {len(result['warm_passes'])} "
                f"time(s) unmeasured first (OpenSearch's CPU a document {said} µs), until its "
                "cost stopped falling"
            )
        first, again = result["reader_snapshots_rows_per_s"]
        b.record.add(Figure("followers", "backlog reader rows/s", result["reader_rows_per_s"],
                            "rows/s", f"{detail}; the faster of two snapshots, {first:,} "
                            f"rows/s (it produced the backlog) and {again:,} (after the "
                            "warm-up passes)"))  # fmt: skip
        steady_name = ("backlog CPU µs per change after the first batch (shared, read={} "
                       "parse={})").format(*STEADY_PATH)  # fmt: skip
        steady_cpu = (result["steady"] or {}).get("steady_cpu_us_per_change")
        steady_detail = (f"{detail}; {batch:,} records a batch; JVM + Python CPU of the job's "
                         "tree over the batches after its first (its start-up and first "
                         "batch's JIT left out)")  # fmt: skip
        if steady_cpu is None:
            b.record.not_measured("followers", steady_name, "under 2 s or a tenth of the "
                                  "changes after the first batch", steady_detail)  # fmt: skip
        else:
            b.record.add(Figure("followers", steady_name, steady_cpu, "µs", steady_detail))
        for r in result["modes"]:
            where = f"{r['mode']}, read={r['read']} parse={r['parse']}"
            b.record.add(Figure("followers", f"backlog applied × the reader's rate ({where})",
                                r["ratio_to_reader"], "×",
                                f"{detail}; {r['rows_per_s']:,.0f} rows/s, applied in "
                                f"{r['window_s']:.2f} s ({r['submit_to_done_s']:.2f} s "
                                "from spark-submit)"))  # fmt: skip
            b.record.add(Figure("followers", f"backlog CPU µs per change ({where})",
                                r["cpu_us_per_change"], "µs",
                                f"{detail}; JVM + Python CPU of the jobs' trees"))  # fmt: skip
            for job, mib in r["peak_rss_mib"].items():
                b.record.add(Figure("followers", f"backlog peak RSS {job} ({where})", mib, "MiB",
                                    "spark-submit process tree, sum of RSS, "
                                    "--driver-memory 512m"))  # fmt: skip
                pss = (r.get("peak_pss_mib") or {}).get(job)
                if pss is not None:
                    b.record.add(Figure("followers", f"backlog peak PSS {job} ({where})", pss,
                                        "MiB", "spark-submit process tree, sum of PSS (pages "
                                        "shared by forked workers counted once); at the peak: "
                                        f"{r['peak_parts'][job]}"))  # fmt: skip


def _round(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def _path(text: str) -> tuple[str, str]:
    read, _, parse = text.strip().partition(":")
    if read not in ("spark", "direct") or parse not in ("jvm", "python"):
        raise SystemExit(f"a path is read:parse, e.g. direct:python or spark:jvm; not {text!r}")
    return read, parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.followers_backlog", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--modes", default="shared,separate", help="shared, separate or both")
    p.add_argument(
        "--paths",
        default="direct:python,spark:jvm",
        help="read:parse pairs (spark.read: spark or direct; spark.parse: jvm or python)",
    )
    p.add_argument("--keep", action="store_true", help="keep the database, topics and keys")
    p.add_argument(
        "--max-offsets-per-trigger", type=int, help="records per batch (default: the jobs')"
    )
    p.add_argument("--warm-passes", type=int, default=WARM_PASSES,
                   help="unmeasured passes of the shared job first, at most (0: none)")  # fmt: skip
    a = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("opensearch").setLevel(logging.WARNING)  # a line per request
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    paths = [_path(x) for x in a.paths.split(",") if x.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown modes {unknown}; the modes are {', '.join(MODES)}")
    return run_alone(
        a.keep,
        "followers_backlog",
        lambda env: run(
            env, a.rows, modes, paths, a.max_offsets_per_trigger, warm_up=a.warm_passes
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
