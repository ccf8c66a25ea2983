"""The bench harness's building blocks against the real stack (no reader needed).

Runs the workload generators and the PostgreSQL ceilings on a throwaway database, and
checks the numbers they report against what the server itself says.
"""

from __future__ import annotations

import pytest

from benchmarks import ceilings, workload
from benchmarks.env import BenchEnv
from benchmarks.lag import LagSample, trend

pytestmark = pytest.mark.integration


@pytest.fixture
def env():
    e = BenchEnv()
    try:
        e.create_database()
    except Exception as exc:  # the stack is not up: nothing to measure against
        pytest.skip(f"PostgreSQL not reachable: {exc}")
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
