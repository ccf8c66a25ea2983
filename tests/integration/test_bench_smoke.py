"""The bench harness's building blocks against the real stack (no reader needed).

Runs the workload generators and the PostgreSQL ceilings on a throwaway database, and
checks the numbers they report against what the server itself says.
"""

from __future__ import annotations

import secrets

import pytest

from benchmarks import ceilings, workload
from benchmarks.env import BenchEnv
from benchmarks.lag import LagSample, robust_slope, time_trend, trend
from tests.conftest import Endpoints

pytestmark = pytest.mark.integration


@pytest.fixture
def env():
    e = BenchEnv()
    e.create_database()  # the suite runs with the stack up: a failure here is the bench's
    yield e
    assert e.cleanup() == []


def test_backlog_decoded_by_postgres_and_recvlogical(env: BenchEnv) -> None:
    with env.connect() as conn:
        workload.create_table(conn, "public.orders")
        workload.bulk_load(conn, "public.orders", 2_000)
        assert 150 <= workload.avg_row_bytes(conn, "public.orders") <= 260
        conn.execute("CREATE PUBLICATION p FOR TABLE public.orders")
        slot = env.register_slot(env.name("ceil"))
        ceilings.create_slot(conn, slot)
        b = workload.write_backlog(
            conn, "public.orders", 1_000, 1, first_new_id=10**6, update_ids=2_000
        )
        assert (b.inserts, b.updates, b.deletes, b.txns) == (500, 400, 100, 1_000)
        end = ceilings.current_lsn(conn)
        d = ceilings.peek_decode(conn, slot, "p")
        # PostgreSQL decodes exactly the changes the backlog says it wrote.
        assert (d.rows, d.deletes) == (b.changes, b.deletes)
        assert d.rows_per_s > 0
    r = ceilings.recvlogical_decode(env.dsn, slot, "p", end, d.rows)
    assert r.rows == d.rows and r.seconds > 0
    with env.connect() as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (end, slot),
        ).fetchone()
        assert row == (True,)  # pg_recvlogical really consumed up to --endpos


def test_open_loop_load_commits_what_it_reports(env: BenchEnv) -> None:
    with env.connect() as conn:
        workload.create_table(conn, "public.orders")
        workload.bulk_load(conn, "public.orders", 1_000)
    res = workload.OpenLoopLoad(
        env.dsn, "public.orders", 400, 1, 2.0, id_base=10**9, workers=1
    ).run()
    assert not res.errors
    assert res.changes == res.txns == 800  # open loop: every scheduled txn was issued
    assert res.achieved_rate == pytest.approx(400, rel=0.5)
    with env.connect() as conn:
        row = conn.execute("SELECT count(*) FROM public.orders WHERE id >= 1000000000").fetchone()
    assert row is not None
    # About half the single-row changes are inserts of new ids (some later deleted).
    assert 0.2 * res.changes < row[0] < 0.8 * res.changes


def test_trend_flat_and_growing() -> None:
    flat = [LagSample(t, t * 1000, 5000 + (t % 2) * 100) for t in range(40)]
    grow = [LagSample(t, t * 1000, t * 400) for t in range(40)]
    assert trend(flat).flat
    assert not trend(grow).flat


def test_time_trend_holds_through_noise_and_catches_a_reader_falling_behind() -> None:
    """Kafka's lag in seconds at 4 samples/s over a 12 s step: a sawtooth (confirmation
    cadence), one 20 s stall sample and a level shift stay flat; 10 % short of the offered
    rate (0.1 s/s) and a stalled reader (1 s/s) do not."""
    ts = [i / 4 for i in range(48)]
    saw = [(t, 0.05 + 0.2 * (t % 1)) for t in ts]
    spike = [(t, 20.0 if i == 40 else lag) for i, (t, lag) in enumerate(saw)]
    shift = [(t, lag + (0.3 if t > 6 else 0)) for t, lag in saw]
    for flat in (saw, spike, shift):
        assert time_trend(flat).flat
    # The slot's byte judge (still recorded) calls 20 MB of another database's WAL near the
    # end of a 1,000/s step (300 kB/s of WAL) growth: why it no longer judges.
    other_db = [LagSample(t, int(t * 300e3), 100_000 + 20_000_000 * (t > 9.5)) for t in ts]
    assert not trend(other_db).flat
    behind = [(t, 0.05 + 0.1 * t + 0.2 * (t % 1)) for t in ts]
    stalled = [(t, 0.05 + t) for t in ts]
    for growing in (behind, stalled):
        tt = time_trend(growing)
        assert not tt.flat and tt.slope == pytest.approx(growing[-1][1] / 12, abs=0.05)
    assert robust_slope([(0, 1), (1, 3), (2, 5), (3, 7), (4, 9), (5, 100)]) == pytest.approx(2.0)


def test_snapshot_ratio_compares_equal_table_sizes() -> None:
    from benchmarks.report import comparisons
    from benchmarks.results import BenchRecord, Figure

    rec = BenchRecord("t", quick=True)
    rec.add(Figure("postgres", "COPY binary rows/s", 1_000_000.0, "rows/s", "1,000,000 rows"))
    rec.add(Figure("postgres", "COPY binary rows/s", 500_000.0, "rows/s", "100,000 rows"))
    rec.add(Figure("ours", "snapshot rows/s", 50_000.0, "rows/s", "100,000 rows"))
    (c,) = comparisons(rec)
    assert (c.against, c.ratio) == ("COPY binary", 0.1)  # against the 100k COPY, not the 1M


def test_follower_latency_trend() -> None:
    from benchmarks.followers import Probe, latency_of

    steady = [Probe(i, 100.0 + i, {"redis": 100.0 + i + 0.05}) for i in range(40)]
    lat = latency_of(steady, "redis")
    assert lat.flat() and lat.p50_ms == pytest.approx(50, abs=1)
    growing = [Probe(i, 100.0 + i, {"redis": 100.0 + i + 0.5 * i}) for i in range(40)]
    assert not latency_of(growing, "redis").flat()
    late = [*steady[:-1], Probe(99, 200.0)]  # one probe never arrived
    assert latency_of(late, "redis").missing == 1 and not latency_of(late, "redis").flat()


def test_prober_finds_rows_in_redis_and_search(env: BenchEnv) -> None:
    """The pollers see a probe once its key is in Redis and its document is searchable."""
    import time

    import redis
    from opensearchpy import OpenSearch

    from benchmarks.followers import PROBE, Prober, SparkJobs, create_probe_table, latency_of
    from pgcdc.core.settings import load_settings

    s = load_settings()
    redis_url, search_url = s.redis.url.get_secret_value(), s.search.url.get_secret_value()
    prefix = env.name("probetest")
    create_probe_table(env)
    prober = Prober(env, prefix, redis_url, search_url, hz=20)
    r = redis.Redis.from_url(redis_url)
    client = OpenSearch(hosts=[search_url])
    prober.start()
    try:
        prober.writing(True)
        deadline = time.time() + 30
        while len(prober.probes) < 3 and time.time() < deadline:
            time.sleep(0.05)
        prober.writing(False)
        probes = list(prober.probes)
        assert len(probes) >= 3
        with env.connect() as conn:  # the rows really are committed
            row = conn.execute(f"SELECT count(*) FROM {PROBE}").fetchone()
        assert row is not None and row[0] >= len(probes)
        assert not prober.wait_seen(probes, 0.5)  # nothing is in the followers yet
        for p in probes:
            r.hset(f"{prefix}:{PROBE}:{p.pid}", "id", str(p.pid))
            client.index(index=prober.index, id=str(p.pid), body={"id": p.pid}, refresh=True)
        assert prober.wait_seen(probes, 30)
        for follower in ("redis", "search"):
            lat = latency_of(probes, follower)
            assert lat.seen == len(probes) and lat.missing == 0
            assert all(p.seen[follower] >= p.committed for p in probes)
    finally:
        prober.stop()
        problems = SparkJobs(env, prefix, env.run_dir).drop_follower_state(redis_url, search_url)
    assert problems == []
    assert not list(r.scan_iter(match=f"{prefix}:*"))


def test_hot_path_replay_of_a_captured_stream_reaches_kafka(env: BenchEnv, tmp_path) -> None:
    """The callgrind harness's replay is the reader's own streamer over captured frames:
    every change and every delete's tombstone lands in Kafka, and a shorter replay stops
    at a transaction boundary after the changes asked for."""
    from benchmarks import hotpath
    from benchmarks.kafka import end_offsets

    path = tmp_path / "txn10.frames"
    frames = hotpath.capture(env, 10, 600, path, table="public.hot10")
    assert frames > 600  # Begin/Commit around every 10 changes, a Relation
    captured = list(hotpath.read_frames(path))
    short, n = hotpath.take_changes(captured, 200)
    assert n == 200 and short[-1].payload[:1] == b"C"
    prefix = env.register_prefix(env.name("hot"))
    r = hotpath.replay(env, path, None, prefix)
    assert r.changes == r.records == 600
    deletes = sum(1 for f in captured if f.payload[:1] == b"D")
    assert deletes > 0
    written = sum(end_offsets(env.bootstrap, [f"{prefix}.public.hot10"]).values())
    assert written == r.changes + deletes  # each delete is followed by its tombstone


def test_a_kept_run_keeps_its_database_and_topics_not_its_slots(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """``--keep`` (``run_alone``'s ``keep``) leaves the run's database to look at, but drops
    its slots: a kept slot held the server's WAL, and a few kept runs used up
    ``max_replication_slots`` (the suite then failed: "all replication slots are in use")."""
    import psycopg

    from benchmarks.env import run_alone

    monkeypatch.setenv("BENCH_OUT", str(tmp_path))
    made: list[BenchEnv] = []

    def measure(e: BenchEnv) -> dict[str, str]:
        made.append(e)
        e.create_database()
        with e.connect() as conn:
            ceilings.create_slot(conn, e.register_slot(e.name("kept")))
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (e.name("tool"),)
            )
        return {}

    assert run_alone(True, "kept", measure) == 0
    (e,) = made
    try:
        with psycopg.connect(e.admin_dsn, autocommit=True) as conn:
            slots = conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (e.database,)
            ).fetchall()
            kept = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (e.database,))
            assert slots == [] and kept.fetchone() == (1,)
    finally:
        e.keep = False
        assert e.cleanup() == []


def test_opensearch_is_warmed_through_the_search_follower_and_its_index_removed(
    endpoints: Endpoints,
) -> None:
    """``make bench`` warms OpenSearch up first (:mod:`benchmarks.warmup`): rounds of
    documents through the search follower, OpenSearch's CPU a document read for each, and the
    warm-up's index gone after."""
    from opensearchpy import OpenSearch

    from benchmarks.warmup import warm_opensearch

    prefix = f"bench_{secrets.token_hex(3)}_warmup"
    per_doc = warm_opensearch(endpoints.search_url, prefix, docs=2_000, max_rounds=2, chunk=500)
    if endpoints.via == "native":
        assert 1 <= len(per_doc) <= 2 and all(x > 0 for x in per_doc), per_doc
    else:  # a container's OpenSearch: its CPU is not read, so one round is all
        assert per_doc == []
    client = OpenSearch(endpoints.search_url)
    assert client.indices.get(index=f"{prefix}*", ignore_unavailable=True) == {}
