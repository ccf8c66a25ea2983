"""Commit→Redis and commit→searchable through the Spark followers.

A follower run has its own reader (slot, topic prefix ``bench_<id>_fol``), both Spark jobs
on that prefix (their own Redis key prefix, index prefix and checkpoints), a steady open-loop
load on the streaming table, and a :class:`Prober`: a few times a second it inserts a new row
into a small probe table (so no load ever touches it) and notes the time the commit
returned; pollers then look for each row in Redis (``EXISTS <prefix>:public.orders_probe:<id>``)
and in OpenSearch (an ``ids`` query through ``_search``, which only sees refreshed documents,
i.e. what is *searchable*), and record first-seen minus commit time.

Keeping up: during a rate step, the probes' latency must not trend upward (least-squares
slope ≤ :data:`FLAT_SLOPE` seconds per second after a warm-up quarter) and every probe must
arrive within a grace period after the step.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.env import ROOT, BenchEnv, dead_letter_topic, unlink_matching
from benchmarks.kafka import percentile
from benchmarks.lag import slope
from benchmarks.proc import Measured
from benchmarks.workload import ROW_EXPR, create_table, ident
from pgcdc.core.contract import JOBS
from pgcdc.stack import spark_cds

log = logging.getLogger(__name__)

PROBE = "public.orders_probe"
TRIGGER = "200 milliseconds"
FLAT_SLOPE = 0.05  # s of extra latency per s of load: the follower falls behind
REDIS_POLL_S = 0.01
SEARCH_POLL_S = 0.05


def followers_unavailable() -> str | None:
    """Why the follower latencies cannot be measured here (None when they can)."""
    missing = [
        p
        for p in ("scripts/spark-submit", "spark_jobs/cache_sync.py", "spark_jobs/search_sync.py")
        if not (ROOT / p).exists()
    ]
    if missing:
        return "missing " + ", ".join(missing)
    return None


def create_probe_table(env: BenchEnv) -> None:
    """The probe table: same row shape as the loaded one, written only by the prober."""
    with env.connect() as conn:
        create_table(conn, PROBE)


class SparkJobs:
    """Sync jobs (both by default) on one topic prefix, with their own follower prefix
    (default: the topic prefix) and checkpoints; ``master``: spark-submit's ``--master``
    (default: the settings', local[2]); ``starting_offsets``: where new checkpoints start;
    ``total_cores``: on a cluster, the cores each job may take (one-core executors)."""

    def __init__(
        self,
        env: BenchEnv,
        prefix: str,
        workdir: Path,
        jobs: tuple[str, ...] = tuple(JOBS),
        follower_prefix: str | None = None,
        master: str | None = None,
        starting_offsets: str | None = None,
        total_cores: int | None = None,
        extra_args: tuple[str, ...] = (),
        parse: str | None = None,
        read: str | None = None,
    ) -> None:
        # BENCH_SPARK_ROOT: run the jobs of another checkout (e.g. a known-good commit).
        self.root = Path(os.environ.get("BENCH_SPARK_ROOT") or ROOT)
        self.env = env
        self.prefix = prefix
        self.follower_prefix = follower_prefix or prefix
        self.jobs = jobs
        self.master = master
        self.starting_offsets = starting_offsets
        self.total_cores = total_cores
        self.extra_args = extra_args  # after each job's own options, e.g. --available-now
        self.parse = parse  # spark.parse (None: the settings')
        self.read = read  # spark.read (None: the settings')
        self.workdir = workdir
        self.checkpoints = workdir / f"checkpoints-{self.follower_prefix}"
        self.procs: dict[str, Measured] = {}
        # Per job, after stop(): its peak PSS (MiB), and that peak by kind of process.
        self.peak_pss: dict[str, float] = {}
        self.peak_parts: dict[str, str] = {}
        self.started = 0.0  # time.time() of spark-submit

    def environ(self) -> dict[str, str]:
        e = dict(os.environ)
        e.update({
            "CDC_KAFKA__BOOTSTRAP_SERVERS": self.env.bootstrap,
            "CDC_KAFKA__TOPIC_PREFIX": self.prefix,
            "CDC_KAFKA__DEAD_LETTER_TOPIC": dead_letter_topic(self.prefix),
            "CDC_REDIS__KEY_PREFIX": self.follower_prefix,
            "CDC_SEARCH__INDEX_PREFIX": self.follower_prefix,
            "CDC_SPARK__CHECKPOINT_DIR": str(self.checkpoints),
        })  # fmt: skip
        if self.starting_offsets:
            e["CDC_SPARK__STARTING_OFFSETS"] = self.starting_offsets
        if self.parse:
            e["CDC_SPARK__PARSE"] = self.parse
        if self.read:
            e["CDC_SPARK__READ"] = self.read
        return e

    def start(self) -> None:
        """spark-submit the jobs (small driver heaps: two JVMs share two cores)."""
        # Their JVMs map the archive of Spark's classes as `make bench` (through `make stack`)
        # writes it: a group run straight (python -m benchmarks.…) measured them without it
        # once, when a checkout's archive had gone (a job's JVM spent 2.5 s more starting).
        spark_cds.ensure()
        self.env.create_topics([dead_letter_topic(self.prefix)])
        env = self.environ()
        if self.root != ROOT:
            # The driver runs spark_jobs/<job>.py as a script, so its own folder is on its
            # path, not the checkout's: without this it imported the project's packages from
            # the editable install (this checkout), and only the tasks ran the other's code.
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(self.root), env.get("PYTHONPATH")])
            )
        self.started = time.time()
        master = ["--master", self.master] if self.master else []
        if self.total_cores:
            master += ["--total-executor-cores", str(self.total_cores), "--executor-cores", "1"]
        for job in self.jobs:
            # "sync:cache,search" is the shared job serving the followers it names.
            script, _, followers = job.partition(":")
            cmd = [
                str(self.root / "scripts" / "spark-submit"), *master, "--driver-memory", "512m",
                f"spark_jobs/{script}.py", "--trigger-interval", TRIGGER,
                *(["--followers", followers] if followers else []), *self.extra_args,
            ]  # fmt: skip
            self.procs[job] = Measured(cmd, env=env, cwd=self.root, log_path=self.log_path(job))

    def log_path(self, job: str) -> Path:
        return self.workdir / f"{job.replace(':', '-')}-{self.follower_prefix}.log"

    def alive(self) -> bool:
        return all(m.running() for m in self.procs.values())

    def dead(self) -> str | None:
        """The first job that exited, with the tail of its log."""
        for job, m in self.procs.items():
            if not m.running():
                return f"{job} exited: {self.first_error(job)}"
        return None

    def first_error(self, job: str) -> str:
        """The first Python exception line of a job's log (else its last line)."""
        lines = self.log_tail(job, 100_000).splitlines()
        for line in lines:
            s = line.strip()
            if (
                s
                and not s.startswith(("at ", "File "))
                and s.split(":")[0].endswith(("Error", "Exception"))
                and " " not in s.split(":")[0]
            ):
                return s[:300]
        return lines[-1][:300] if lines else "no output"

    def log_tail(self, job: str, lines: int = 10) -> str:
        p = self.log_path(job)
        if not p.exists():
            return ""
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> dict[str, float]:
        """Stop both jobs; returns their peak RSS (MiB, process tree)."""
        rss: dict[str, float] = {}
        for job, m in self.procs.items():
            st = m.stop(60)
            rss[job] = st.peak_rss_mb
            self.peak_parts[job] = m.peak_parts_text()
            self.peak_pss[job] = st.peak_pss_mb
        shutil.rmtree(self.checkpoints, ignore_errors=True)
        return rss

    def drop_follower_state(self, redis_url: str, search_url: str) -> list[str]:
        """Delete this run's Redis keys and indices; returns what could not be removed."""
        problems: list[str] = []
        try:
            unlink_matching(redis_url, f"{self.follower_prefix}:*")
        except Exception as e:  # reported, cleanup goes on
            problems.append(f"redis keys {self.follower_prefix}:*: {e}")
        try:
            from opensearchpy import OpenSearch

            OpenSearch(hosts=[search_url]).indices.delete(index=f"{self.follower_prefix}-*")
        except Exception as e:
            problems.append(f"indices {self.follower_prefix}-*: {e}")
        return problems


@dataclass
class Probe:
    """One marker row: when its commit returned, and when each follower first had it."""

    pid: int
    committed: float
    seen: dict[str, float] = field(default_factory=dict)


class Prober:
    """Writes probe rows at a fixed rate and polls Redis and OpenSearch for them."""

    def __init__(
        self, env: BenchEnv, prefix: str, redis_url: str, search_url: str, hz: float
    ) -> None:
        self.env = env
        self.hz = hz
        self.redis_key = f"{prefix}:{PROBE}:"
        self.index = f"{prefix}-{PROBE}".lower()
        self.redis_url = redis_url
        self.search_url = search_url
        self.probes: list[Probe] = []
        self._lock = threading.Lock()
        self._writing = threading.Event()
        self._stop = threading.Event()
        self._next = 1
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.wanted: tuple[str, ...] = ("redis", "search")  # the followers being measured
        self._from_pid = 1

    def retarget(self, prefix: str, wanted: tuple[str, ...]) -> None:
        """Look for probes under another follower prefix, in ``wanted`` followers only."""
        with self._lock:
            self.redis_key = f"{prefix}:{PROBE}:"
            self.index = f"{prefix}-{PROBE}".lower()
            self.wanted = wanted
            self._from_pid = self._next  # earlier probes belong to earlier followers

    # --- writing ---

    def write_one(self, conn: psycopg.Connection[Any]) -> Probe:
        """Insert the next probe row (autocommit: the commit has happened on return)."""
        pid = self._next
        self._next += 1
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT " + ROW_EXPR + " FROM (SELECT %s::bigint) s(g)").format(
                ident(PROBE)
            ),
            (pid,),
        )
        p = Probe(pid, time.time())
        with self._lock:
            self.probes.append(p)
        return p

    def _writer(self) -> None:
        try:
            with self.env.connect() as conn:
                t0 = time.time()
                j = 0
                while not self._stop.is_set():
                    due = t0 + j / self.hz
                    if self._stop.wait(max(0.0, due - time.time())):
                        return
                    if self._writing.is_set():
                        self.write_one(conn)
                    j += 1
        except Exception as e:  # surfaced by stop()
            self.errors.append(f"probe writer: {type(e).__name__}: {e}")

    # --- polling ---

    def _outstanding(self, follower: str) -> list[Probe]:
        with self._lock:
            if follower not in self.wanted:
                return []
            return [p for p in self.probes if p.pid >= self._from_pid and follower not in p.seen]

    def _redis_poller(self) -> None:
        import redis

        try:
            r = redis.Redis.from_url(self.redis_url)
            while not self._stop.wait(REDIS_POLL_S):
                todo = self._outstanding("redis")
                if not todo:
                    continue
                pipe = r.pipeline(transaction=False)
                for p in todo:
                    pipe.exists(self.redis_key + str(p.pid))
                found = pipe.execute()
                now = time.time()
                for p, n in zip(todo, found, strict=True):
                    if n:
                        p.seen["redis"] = now
        except Exception as e:
            self.errors.append(f"redis poller: {type(e).__name__}: {e}")

    def _search_poller(self) -> None:
        from opensearchpy import NotFoundError, OpenSearch, TransportError

        # opensearch-py logs every 404/503 at WARNING; those are expected while the job
        # creates the index.
        logging.getLogger("opensearch").setLevel(logging.ERROR)
        try:
            client = OpenSearch(hosts=[self.search_url], timeout=10)
            while not self._stop.wait(SEARCH_POLL_S):
                todo = self._outstanding("search")
                if not todo:
                    continue
                ids = [str(p.pid) for p in todo]
                try:
                    res = client.search(
                        index=self.index,
                        body={"query": {"ids": {"values": ids}}, "_source": False,
                              "size": len(ids)},
                    )  # fmt: skip
                except NotFoundError:
                    continue  # the job has not created the index yet
                except TransportError as e:
                    if e.status_code == 503:  # a new index whose shard is not started yet
                        continue
                    raise
                now = time.time()
                hits = {h["_id"] for h in res["hits"]["hits"]}
                for p in todo:
                    if str(p.pid) in hits:
                        p.seen["search"] = now
        except Exception as e:
            self.errors.append(f"search poller: {type(e).__name__}: {e}")

    # --- control ---

    def start(self) -> None:
        for target, name in ((self._writer, "probe-writer"), (self._redis_poller, "probe-redis"),
                             (self._search_poller, "probe-search")):  # fmt: skip
            t = threading.Thread(target=target, daemon=True, name=name)
            t.start()
            self._threads.append(t)

    def writing(self, on: bool) -> None:
        """Write probes at the fixed rate (on) or not at all (off)."""
        if on:
            self._writing.set()
        else:
            self._writing.clear()

    def check(self) -> None:
        if self.errors:
            raise RuntimeError(self.errors[0])

    def wait_seen(self, probes: list[Probe], timeout_s: float, alive: Any = None) -> bool:
        """Wait until both followers had every probe of ``probes``; False at the deadline."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            self.check()
            if all(all(f in p.seen for f in self.wanted) for p in probes):
                return True
            if alive is not None:
                why = alive()
                if why:
                    raise RuntimeError(why)
            time.sleep(0.1)
        return all(all(f in p.seen for f in self.wanted) for p in probes)

    def between(self, t0: float, t1: float) -> list[Probe]:
        with self._lock:
            return [p for p in self.probes if t0 <= p.committed < t1]

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


@dataclass(frozen=True)
class FollowerLatency:
    """Latency of one follower over a set of probes."""

    seen: int
    missing: int
    p50_ms: float | None
    p99_ms: float | None
    slope: float  # s of latency per s of commit time (after warm-up)

    def flat(self) -> bool:
        return self.missing == 0 and self.slope <= FLAT_SLOPE


def latency_of(probes: list[Probe], follower: str) -> FollowerLatency:
    """p50/p99 (ms) and trend of ``follower``'s first-seen minus commit time."""
    pts = [(p.committed, p.seen[follower] - p.committed) for p in probes if follower in p.seen]
    lats = [lat * 1000 for _t, lat in pts]
    missing = len(probes) - len(pts)
    if not lats:
        return FollowerLatency(0, missing, None, None, float("inf"))
    trend = slope(pts[len(pts) // 4 :])
    return FollowerLatency(len(lats), missing, percentile(lats, 50), percentile(lats, 99), trend)
