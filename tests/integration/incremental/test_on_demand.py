"""``cdc snapshot public.orders`` while three writers change ``orders`` (issue 11, case 2).

Small chunks make rows change inside chunk windows; the test counts those cases from the
reader's log and fails if there were none. The reduced topic and both followers (the Spark
jobs, run once to the end) must equal the table, per-key order must hold, and every
incremental row must equal what its key held in the stream just before it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Endpoints, wait_until
from tests.e2e.pipeline import (
    cache_state,
    diff,
    leader_state,
    run_shared_available_now,
    search_state,
)
from tests.integration.incremental.support import (
    Reader,
    assert_chunk_rows_not_stale,
    cdc,
    chunks_done,
    pipeline,
    topic,
)
from tests.integration.reader_support import (
    Workload,
    assert_key_order,
    assert_no_change_missing,
    assert_topic_equals_table,
)

# slow: the two Spark jobs start once (most of the time here).
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

# 20 chunks of 400 rows: the rows the writers change fall inside chunk windows as often as
# over 50 chunks (the test counts them), with 60% less table to snapshot and sync.
ROWS = 8_000
CHUNK = 400
# How long each chunk's window is held open after its low watermark (chunk_pause/).
CHUNK_PAUSE = Path(__file__).resolve().parent / "chunk_pause"
PAUSE_S = 0.1


def test_cdc_snapshot_while_three_writers_change_the_table(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "incr_demand") as p:
        wl = Workload(p.dsn, "public.orders", writers=3, ops_per_txn=3, seed=5, pause_s=0.002)
        wl.setup(ROWS)
        reader = Reader(
            p,
            tmp_path / "reader.log",
            CDC_POSTGRES__INCREMENTAL_CHUNK_ROWS=str(CHUNK),
            # Each chunk's window held open a moment, so that the writers change rows in it.
            PYTHONPATH=str(CHUNK_PAUSE),
            PGCDC_CHUNK_PAUSE_S=str(PAUSE_S),
        )
        reader.catch_up()  # the initial snapshot
        reader.start()
        try:
            reader.wait_for("replication started")
            assert f"chunk pause: {PAUSE_S} s" in reader.text(), reader.text()[-2000:]
            wl.start()
            wait_until(lambda: len(wl.log) >= 50, timeout=60, what="the writers' first commits")
            out = cdc(p, "snapshot", "public.orders")
            assert "execute-snapshot signal" in out.stdout
            reader.wait_for("incremental snapshot of public.orders complete", timeout=240)
        finally:
            log = wl.stop()
            reader.stop()
        reader.catch_up()  # what the writers committed last
        done = [c for c in chunks_done(reader.text()) if c[1] == "public.orders"]
        assert [c[0] for c in done] == list(range(1, len(done) + 1))
        assert len(done) >= ROWS // CHUNK
        dropped = sum(c[3] for c in done)
        # The case this test exists for: rows changed inside a chunk's window were dropped
        # from the chunk in favour of the streamed change.
        assert dropped > 0, "no row changed inside a chunk's window: the rule went untested"
        print(f"{len(done)} chunks, {dropped} chunk rows dropped for a streamed change")
        records = topic(p)
        incremental = assert_chunk_rows_not_stale(records)
        assert incremental == sum(c[2] for c in done)
        assert_topic_equals_table(records, p.dsn, "public.orders")
        assert_key_order(records)
        assert_no_change_missing(records, log)
        run_shared_available_now(p, tmp_path)
        leader = leader_state(p.dsn, "public.orders")
        assert not diff(leader, cache_state(p, "public.orders")), "Redis differs"
        assert not diff(leader, search_state(p, "public.orders")), "OpenSearch differs"
