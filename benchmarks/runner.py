"""The measurements, each a function that can run alone, and the order a full run uses.

Every function takes a :class:`Bench` (the run's environment, record and systems) and adds
figures to ``bench.record``. A system that is not available yields "not measured: <reason>".

Order of a full run (:func:`run_all`), chosen so every system reads the *same* WAL:

1. :func:`setup_tables` — snapshot tables (N and N/10 rows) and the streaming table;
2. :func:`snapshot_ours` / :func:`snapshot_debezium` — each on its own slot;
3. :func:`create_stream_slots` — our slot and Debezium's exist, both stopped;
4. :func:`catchup_phase` per transaction size — a ceiling slot, a backlog written with every
   reader stopped, then the ceilings (peek, pg_recvlogical), our catch-up and Debezium's;
5. :func:`streaming` per system — commit→Kafka latency at a fixed rate, then rate steps
   until the slot's lag is no longer flat;
6. :func:`benchmarks.incremental.incremental_snapshot` — ``cdc snapshot`` of the big table
   while the stream table takes 1,000 changes/s;
7. :func:`envelope`, :func:`hotpath` (instructions per change, callgrind) and
   :func:`followers`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import shutil
import time
from collections.abc import Callable

from benchmarks import hotpath as hotpath_mod
from benchmarks import workload
from benchmarks.catchup import catchup_phase, create_stream_slots
from benchmarks.context import BIG, SMALL, STREAM, Bench
from benchmarks.debezium import DebeziumServer
from benchmarks.documents_fanout import documents_fanout
from benchmarks.envelope import measure_envelope
from benchmarks.exactly_once import exactly_once
from benchmarks.follower_run import followers, start_followers
from benchmarks.followers_backlog import backlog
from benchmarks.incremental import incremental_large, incremental_snapshot
from benchmarks.index_rebuild import index_rebuild
from benchmarks.ours import OursReader
from benchmarks.results import Figure
from benchmarks.snapshots import snapshot_ceiling, snapshot_debezium, snapshot_ours
from benchmarks.streaming import streaming
from benchmarks.verify_speed import verify_speed
from benchmarks.warmup import warm_opensearch

log = logging.getLogger(__name__)


def setup_tables(b: Bench) -> None:
    """Create this run's database and tables, and load them."""
    b.env.create_database()
    p = b.params
    with b.env.connect() as conn:
        for table, rows in ((BIG, p.big_rows), (SMALL, p.small_rows), (STREAM, p.stream_rows)):
            workload.create_table(conn, table)
            secs = workload.bulk_load(conn, table, rows)
            log.info("loaded %s with %d rows in %.1fs", table, rows, secs)
        b.record.environment["row_bytes"] = workload.avg_row_bytes(conn, STREAM)
        b.record.environment["columns"] = 10


def probe_systems(b: Bench) -> None:
    """Find out which systems can run here (reasons go into the report)."""
    b.ours = OursReader(b.env, [STREAM])
    reason = b.ours.available()
    if reason:
        b.unavailable["ours"] = reason
    b.dbz = DebeziumServer(b.env, [STREAM])
    reason = b.dbz.available()
    if reason:
        b.unavailable["debezium"] = reason
    b.dbzt = DebeziumServer(b.env, [STREAM], role="dbzt", tuned=True)
    reason = b.dbzt.available()
    if reason:
        b.unavailable["debezium-tuned"] = reason
    for name, why in b.unavailable.items():
        b.record.notes.append(f"{name} not measured: {why}")


def warm_servers(b: Bench) -> None:
    """Warm OpenSearch up before anything is measured (:mod:`benchmarks.warmup`); what its
    rounds cost goes into the report's notes."""
    from pgcdc.core.settings import load_settings

    docs, rounds = (20_000, 4) if b.env.quick else (60_000, 12)
    try:
        per_doc = warm_opensearch(
            load_settings().search.url.get_secret_value(),
            b.env.name("warmup"),
            docs=docs,
            max_rounds=rounds,
        )
    except Exception as e:  # a run without OpenSearch still measures the rest
        b.record.notes.append(f"OpenSearch not warmed up: {type(e).__name__}: {e}"[:300])
        return
    if not per_doc:
        b.record.notes.append(
            f"OpenSearch warmed up first by one round of {docs:,} documents; its CPU is not "
            "read here (not the stack's), so whether it is warm is not known"
        )
        return
    said = ", ".join(f"{x:.0f}" for x in per_doc)
    b.record.notes.append(
        f"OpenSearch warmed up first: {len(per_doc)} rounds of {docs:,} documents through the "
        f"search follower, its CPU a document {said} µs"
    )


def envelope(b: Bench) -> None:
    """Envelope build + JSON encode rate on one core (:mod:`benchmarks.envelope`): the
    combined ``encode_change``, the call the reader makes."""
    metric = "envelope build+encode events/s"
    with b.record.guarded("envelope", [metric], "one core"):
        events, repeats = (30_000, 1) if b.env.quick else (200_000, 3)
        rate = measure_envelope(events, repeats)[-1]
        b.record.add(Figure("envelope", metric, rate.wall_per_s, "events/s", rate.summary()))


def stop_background(b: Bench) -> None:
    """Stop what a run left running after a failure (Spark jobs, a kept Debezium)."""
    if b.fol_jobs is not None:
        b.fol_jobs.stop()
        b.fol_jobs = None
    if b.dbz_live is not None and b.dbz is not None:
        b.dbz.finish(b.dbz_live)
        b.dbz_live = None


def rss_scaling(b: Bench) -> None:
    """How our peak RSS changes when the table or the transaction grows tenfold."""
    p = b.params
    pairs = [
        ("snapshot peak RSS", f"{p.small_rows:,} rows", f"{p.big_rows:,} rows",
         "peak RSS ×10 table rows"),
    ]  # fmt: skip
    sizes = b.params.catchup_txn_rows
    for small, big in itertools.pairwise(sizes):
        if big == small * 10:
            d = f"{p.backlog_changes:,} changes, {{}}-row txns"
            pairs.append(("catch-up peak RSS", d.format(small), d.format(big),
                          f"peak RSS ×10 txn rows ({small}→{big})"))  # fmt: skip
    for metric, d_small, d_big, label in pairs:
        a = b.record.find("ours", metric, d_small)
        c = b.record.find("ours", metric, d_big)
        if a is None or c is None or not a.value or c.value is None:
            b.record.not_measured("ours", label, "one of the two sizes was not measured")
            continue
        b.record.add(Figure("ours", label, c.value / a.value, "×",
                            f"{a.value:.0f} → {c.value:.0f} MiB ({d_small} → {d_big})"))  # fmt: skip


def hotpath(b: Bench) -> None:
    """Instructions per change of decode + encode + produce (callgrind), per transaction
    size, over a stream captured from this run's server (:mod:`benchmarks.hotpath`); and
    the same replay's CPU time per change without valgrind."""
    sizes = b.params.catchup_txn_rows
    events = 500 if b.env.quick else 2_000
    for txn_rows in sizes:
        detail = f"{txn_rows}-row txns, replay of {events:,} vs {3 * events:,} changes"
        metric = "hot path instructions per change"
        with b.record.guarded("ours", [metric, "hot path CPU µs per change"], detail):
            path = hotpath_mod.frames_path(txn_rows)
            hotpath_mod.capture(b.env, txn_rows, 4 * events, path, table=f"public.hot{txn_rows}")
            prefix = b.env.register_prefix(b.env.name(f"hot{txn_rows}"))
            r = hotpath_mod.replay(b.env, path, None, prefix)
            b.record.add(Figure("ours", "hot path CPU µs per change", r.cpu_s / r.changes * 1e6,
                                "µs", f"{txn_rows}-row txns, replay of {r.changes:,} changes "
                                "into Kafka (loaded machine)"))  # fmt: skip
            if shutil.which("valgrind") is None:
                b.record.not_measured("ours", metric, "valgrind is not installed", detail)
                continue
            ins = hotpath_mod.callgrind(txn_rows, events)
            b.record.add(Figure("ours", metric, ins.per_change, "instructions", detail,
                                extra=dataclasses.asdict(ins)))  # fmt: skip


# --- the whole run ------------------------------------------------------------------------


def _snapshots(b: Bench) -> None:
    snapshot_ceiling(b, BIG)
    snapshot_ceiling(b, SMALL)
    snapshot_ours(b, BIG)
    snapshot_ours(b, SMALL)
    snapshot_debezium(b, SMALL)


def _catchups(b: Bench) -> None:
    create_stream_slots(b)
    for txn_rows in b.params.catchup_txn_rows:
        catchup_phase(b, txn_rows)


def _streaming(b: Bench) -> None:
    create_stream_slots(b)
    for name in ("debezium", "debezium-tuned", "ours"):
        streaming(b, name)


# The groups a run may be limited to (BENCH_ONLY / --only); slots are created as needed.
GROUPS: dict[str, Callable[[Bench], None]] = {
    "snapshot": _snapshots,
    "catchup": _catchups,
    "streaming": _streaming,
    "envelope": envelope,
    "hotpath": hotpath,
    "followers": followers,
    "backlog": backlog,
    "index_rebuild": index_rebuild,
    "verify": verify_speed,
    "exactly_once": exactly_once,
    "documents": documents_fanout,
    "incremental": incremental_snapshot,
    # Not in the full run (15-20 min, gigabytes): --only incremental_large.
    "incremental_large": incremental_large,
}


def machine_pace(b: Bench, when: str) -> None:
    """Note the machine's pace: the CPU seconds of a Python loop of ten million empty
    iterations, at ``when``. The machine is shared: CPU per change moves with its pace (the
    same code's figures differ by a third between a quiet and a busy hour), and this says
    which hour a run had."""
    t0 = time.process_time()
    for _ in range(10_000_000):
        pass
    secs = time.process_time() - t0
    log.info("machine pace %s: %.2f CPU s for 10M loop iterations", when, secs)
    b.record.notes.append(f"machine pace {when}: a 10M-iteration Python loop took {secs:.2f} CPU s")


def run_groups(b: Bench, names: list[str]) -> None:
    """Set up the tables, then only the measurements of ``names`` (keys of GROUPS), the
    machine's pace noted before and after them."""
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        raise ValueError(f"the groups are {', '.join(GROUPS)}; not {', '.join(unknown)}")
    machine_pace(b, "at the start")
    setup_tables(b)
    probe_systems(b)
    warm_servers(b)
    for name in names:
        GROUPS[name](b)
    machine_pace(b, "at the end")


def run_all(b: Bench) -> None:
    """Every measurement, in the order that lets all systems read the same WAL."""
    machine_pace(b, "at the start")
    setup_tables(b)
    probe_systems(b)
    warm_servers(b)
    if b.env.quick:
        start_followers(b)
        b.record.notes.append(
            "quick run: the Spark jobs start at the beginning, so their JVM start overlaps "
            "(and slows) the other measurements"
        )
    snapshot_ceiling(b, BIG)
    snapshot_ceiling(b, SMALL)
    snapshot_ours(b, BIG, b.params.big_rows)
    snapshot_ours(b, SMALL, b.params.small_rows)
    # Debezium snapshots the small table (at its ~2k rows/s the big one would take minutes);
    # ratios only compare equal table sizes.
    snapshot_debezium(b, SMALL, b.params.small_rows)
    create_stream_slots(b)
    sizes = b.params.catchup_txn_rows
    for txn_rows in sizes:
        # Quick run: Debezium's last catch-up instance goes on to the latency run.
        catchup_phase(b, txn_rows, keep_peer=b.env.quick and txn_rows == sizes[-1])
    # Debezium streams first: a stopped slot replays everything written since, and ours
    # catches up on its load in seconds while Debezium took >300 s for ours' (full run).
    # A peer kept running from its catch-up must go first anyway (never beside ours).
    for name in ("debezium", "debezium-tuned", "ours"):
        streaming(b, name)
    rss_scaling(b)
    incremental_snapshot(b)
    envelope(b)
    hotpath(b)
    followers(b)
    if b.env.quick:
        b.record.notes.append(
            "quick run: the backlog group (both followers from a backlog, shared job vs "
            "separate jobs) is left out; BENCH_ONLY=backlog runs it"
        )
    else:
        backlog(b)
    index_rebuild(b)
    verify_speed(b)
    exactly_once(b)
    documents_fanout(b)
    machine_pace(b, "at the end")
