"""Pure parts of the reader: snapshot markers, the snapshot's row estimate and progress line,
acknowledgment order, TOAST filling, names."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.publisher import AckQueue, TxnTracker
from cdc.snapshot import snapshot_marker
from cdc.snapshot_progress import COUNT_MAX_PAGES, estimate_rows, progress_line
from cdc.toast import fill_from_old, unchanged_columns
from pgcdc.core.contract import heartbeat_topic
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import KafkaSettings
from pgcdc.core.values import UNCHANGED_TOAST

# --- the snapshot's row estimate and progress line ------------------------------------------


def _estimate(reltuples: float, pages: int) -> tuple[int | None, int]:
    """The estimate and how many times the table was counted (each count finds 42 rows)."""
    counts: list[int] = []

    def count() -> int:
        counts.append(42)
        return 42

    return estimate_rows(reltuples, pages, count), len(counts)


def test_a_table_never_analyzed_is_counted_if_small_else_of_unknown_size() -> None:
    assert _estimate(1234.0, 10) == (1234, 0)  # ANALYZE ran: the catalog's estimate
    # Never analyzed: reltuples is -1 (PostgreSQL 14+) or 0 (before), never the answer.
    assert _estimate(-1.0, 0) == (0, 0)  # an empty file holds no row: nothing to count
    assert _estimate(-1.0, 3) == (42, 1)
    assert _estimate(0.0, COUNT_MAX_PAGES) == (42, 1)
    assert _estimate(-1.0, COUNT_MAX_PAGES + 1) == (None, 0)  # too large to count at once
    assert _estimate(0.0, 100_000) == (None, 0)


def test_the_progress_line_shows_an_eta_only_for_a_known_size() -> None:
    assert progress_line("public.t", 1000, 5000, 100.0) == (
        "public.t 1000 rows (~5000), 100 rows/s, ETA 40s"
    )
    assert progress_line("public.t", 1000, None, 100.0) == (
        "public.t 1000 rows (size unknown), 100 rows/s"
    )
    # Past a low estimate, or no rate yet: no made-up ETA of 0 s.
    assert progress_line("public.t", 6000, 5000, 100.0).endswith("ETA ?")
    assert progress_line("public.t", 0, 5000, 0.0).endswith("ETA ?")


# --- snapshot markers (Debezium's source.snapshot values) -----------------------------------


def markers(tables: list[int]) -> list[str]:
    """Markers for consecutive tables with ``tables[i]`` rows each, as the snapshotter emits."""
    rows = [(t, i) for t, n in enumerate(tables) for i in range(n)]
    out = []
    for k, (t, i) in enumerate(rows):
        out.append(snapshot_marker(k == 0, k == len(rows) - 1, i == 0, i == tables[t] - 1))
    return out


def test_snapshot_markers_over_tables() -> None:
    assert markers([3, 2, 3]) == [
        "first",
        "true",
        "last_in_data_collection",
        "first_in_data_collection",
        "last_in_data_collection",
        "first_in_data_collection",
        "true",
        "last",
    ]


def test_snapshot_marker_of_a_single_row_is_last() -> None:
    assert markers([1]) == ["last"]
    assert markers([1, 1]) == ["first", "last"]


# --- acknowledgment -------------------------------------------------------------------------


def txn(commit: int, pending: int) -> TxnTracker:
    t = TxnTracker(publisher=None, commit_lsn=Lsn(commit))  # type: ignore[arg-type]
    t.pending = pending
    return t


def close(t: TxnTracker, end: int) -> None:
    t.end_lsn = Lsn(end)
    t.closed = True


def test_ack_waits_for_every_record_and_every_earlier_transaction() -> None:
    q = AckQueue()
    a, b = txn(100, 2), txn(200, 1)
    q.append(a)
    q.append(b)
    close(a, 110)
    close(b, 210)
    b.pending = 0  # the later transaction completes first
    assert q.advance() is None and len(q) == 2
    a.pending = 1
    assert q.advance() is None
    a.pending = 0
    assert q.advance() == Lsn(210) and len(q) == 0


def test_an_open_transaction_is_never_acknowledged() -> None:
    q = AckQueue()
    a = txn(100, 0)  # all delivered, but its Commit is not seen yet
    q.append(a)
    assert q.advance() is None
    close(a, 110)
    assert q.advance() == Lsn(110)


def test_the_acknowledged_lsn_stays_when_nothing_completes() -> None:
    q = AckQueue()
    a = txn(100, 0)
    close(a, 110)
    q.append(a)
    assert q.advance() == Lsn(110)
    q.append(txn(200, 5))
    assert q.advance() == Lsn(110)


# --- unchanged TOAST ------------------------------------------------------------------------


def test_fill_from_old_replaces_only_unchanged_values() -> None:
    new = ("2", UNCHANGED_TOAST, None, "x")
    old = ("1", "big", "was", "y")
    assert unchanged_columns(new) == [1]
    assert fill_from_old(new, old) == ("2", "big", None, "x")
    assert unchanged_columns(fill_from_old(new, old)) == []


def test_fill_from_old_rejects_rows_of_different_shapes() -> None:
    with pytest.raises(ValueError, match="columns"):
        fill_from_old(("1",), ("1", "2"))


# --- heartbeat topic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "topic"),
    [
        ({"topic_prefix": "shop"}, "__cdc-heartbeat.shop"),
        ({"topic_prefix": "shop", "heartbeat_topic": "beats"}, "beats"),
        ({"topic_prefix": "shop", "heartbeat_enabled": False}, None),
    ],
)
def test_heartbeat_topic(settings: dict[str, Any], topic: str | None) -> None:
    assert heartbeat_topic(KafkaSettings(**settings)) == topic
