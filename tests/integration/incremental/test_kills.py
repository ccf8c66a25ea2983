"""kill -9 of the reader during incremental snapshots (issue 11, case 3).

Each kill is timed on progress: the reader is killed once its log shows a few more chunks
done than when it started. After each restart the log says where the snapshot resumed; the
test checks that no chunk the log reported done is read again, that every resume starts at
or after the last chunk done, and that the result equals the table.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Endpoints, wait_until
from tests.integration.incremental.support import (
    CHUNK_DONE,
    RESUMED,
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

pytestmark = pytest.mark.integration

KILLS = 5
INITIAL_ROWS = 200_000


def _kill_on_progress(reader: Reader, table: str, chunks_between: int) -> None:
    """Start the reader, let it finish ``chunks_between`` more chunks of ``table``, kill -9."""
    before = len([c for c in chunks_done(reader.text()) if c[1] == table])
    reader.start()

    def progressed() -> bool:
        assert reader.proc is not None and reader.proc.poll() is None, reader.tail()
        done = [c for c in chunks_done(reader.text()) if c[1] == table]
        return len(done) >= before + chunks_between

    wait_until(progressed, timeout=240, interval=0.02, what=f"{chunks_between} chunks of {table}")
    reader.kill()


def assert_resumed_without_rereading(log: str, table: str, kills: int) -> list[int]:
    """Walk the log: chunk numbers done only grow, each resume is after the last chunk done.
    Returns the chunk each run resumed after."""
    last_done = 0
    resumed: list[int] = []
    pattern = re.compile(f"{CHUNK_DONE.pattern}|{RESUMED.pattern}")
    for m in pattern.finditer(log):
        if m.group(0).startswith("incremental snapshot chunk"):
            if m.group(2) != table:
                continue
            number = int(m.group(1))
            assert number > last_done, f"chunk {number} of {table} was done twice"
            last_done = number
        elif m.group(5) == table:
            after = int(m.group(6))
            assert after >= last_done, (
                f"resumed after chunk {after}, but chunk {last_done} was done already"
            )
            resumed.append(after)
    assert len(resumed) >= kills, f"{len(resumed)} resumes logged for {kills} kills"
    assert all(a > 0 for a in resumed)
    return resumed


def test_kill_9_during_an_incremental_snapshot_at_5_points(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "incr_kill") as p:
        wl = Workload(p.dsn, "public.orders", writers=3, ops_per_txn=3, seed=9, pause_s=0.003)
        wl.setup(30_000)
        reader = Reader(p, tmp_path / "reader.log", CDC_POSTGRES__INCREMENTAL_CHUNK_ROWS="500")
        reader.catch_up()
        wl.start()
        try:
            cdc(p, "snapshot", "public.orders")
            for _ in range(KILLS):
                _kill_on_progress(reader, "public.orders", chunks_between=6)
        finally:
            log = wl.stop()
        reader.catch_up()
        text = reader.text()
        assert "incremental snapshot of public.orders complete" in text
        resumed = assert_resumed_without_rereading(text, "public.orders", KILLS)
        print(f"resumed after chunks {resumed}")
        records = topic(p)
        assert_chunk_rows_not_stale(records)
        assert_topic_equals_table(records, p.dsn, "public.orders")
        assert_key_order(records)
        assert_no_change_missing(records, log)


@pytest.mark.slow
def test_kill_9_during_an_initial_snapshot_at_5_points(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "incr_kill_init") as p:
        wl = Workload(p.dsn, "public.orders", writers=2, ops_per_txn=3, seed=4, pause_s=0.005)
        # 50 chunks: five kills of six chunks each, and 20 more after the last (a million
        # rows in 20,000-row chunks took 116 s of CI for the same path).
        wl.setup(INITIAL_ROWS)
        reader = Reader(
            p,
            tmp_path / "reader.log",
            CDC_POSTGRES__INITIAL_SNAPSHOT="incremental",
            CDC_POSTGRES__INCREMENTAL_CHUNK_ROWS=str(INITIAL_ROWS // 50),
            # Without the schema in every value: the records read back stay small.
            CDC_SCHEMA__SCHEMAS_ENABLE="false",
        )
        wl.start()
        try:
            for _ in range(KILLS):
                _kill_on_progress(reader, "public.orders", chunks_between=6)
        finally:
            log = wl.stop()
        reader.catch_up(timeout=600)
        text = reader.text()
        assert "initial snapshot of 1 tables runs incrementally" in text
        assert "incremental snapshot of public.orders complete" in text
        resumed = assert_resumed_without_rereading(text, "public.orders", KILLS)
        print(f"resumed after chunks {resumed}")
        records = topic(p)
        assert_chunk_rows_not_stale(records)
        assert_topic_equals_table(records, p.dsn, "public.orders")
        assert_key_order(records)
        assert_no_change_missing(records, log)
