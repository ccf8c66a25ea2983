"""Signals (Debezium's execute-snapshot / stop-snapshot), the incremental snapshots' state
record, and which transactions a chunk's SELECT did not see: pure code, no servers."""

from __future__ import annotations

import orjson
import pytest

from cdc.incremental import ReadSnapshot, SnapshotsState, TableSnapshot, join_tables, merge_chunk
from cdc.signals import (
    SnapshotRequest,
    StopRequest,
    execute_document,
    parse_envelope,
    parse_signal,
    split_table,
)

pytestmark = pytest.mark.unit


def test_execute_snapshot_with_debezium_fields() -> None:
    data = {
        "data-collections": ["public.orders", "inventory.items"],
        "type": "INCREMENTAL",
        "additional-conditions": [{"data-collection": "public.orders", "filter": "id > 5"}],
    }
    sig = parse_signal("s1", "execute-snapshot", orjson.dumps(data).decode())
    assert isinstance(sig, SnapshotRequest)
    assert sig.tables == (("public", "orders"), ("inventory", "items"))
    assert sig.where(("public", "orders")) == "id > 5"
    assert sig.where(("inventory", "items")) is None


def test_stop_snapshot_without_collections_stops_all() -> None:
    sig = parse_envelope(None, b'{"type": "stop-snapshot", "data": {}}')
    assert isinstance(sig, StopRequest) and sig.tables == ()


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("execute-snapshot", "{not json"),
        ("execute-snapshot", '{"data-collections": []}'),
        ("execute-snapshot", '{"data-collections": ["a.b"], "type": "blocking"}'),
        ("execute-snapshot", '{"data-collections": ["a.b.c"]}'),
        ("log", '{"message": "hi"}'),
        (None, None),
    ],
)
def test_a_signal_that_cannot_be_carried_out_is_ignored(kind: str | None, data: str | None) -> None:
    assert parse_signal("x", kind, data) is None


def test_envelope_that_is_not_an_object_is_ignored() -> None:
    assert parse_envelope("x", b"[1, 2]") is None
    assert parse_envelope("x", b"\xff") is None


def test_cli_document_round_trips() -> None:
    doc = execute_document([split_table("orders"), split_table("s.t")], "a = 1")
    sig = parse_envelope(None, orjson.dumps(doc))
    assert isinstance(sig, SnapshotRequest)
    assert sig.id == doc["id"]
    assert sig.tables == (("public", "orders"), ("s", "t"))
    assert sig.where(("s", "t")) == "a = 1"


def test_state_record_round_trips() -> None:
    state = SnapshotsState(
        captured=[("public", "a")],
        queue=[TableSnapshot("id1", "public", "a", "x > 1", "cli", ["7"], 3, 300, 1000)],
    )
    back = SnapshotsState.from_json(state.to_json())
    assert back == state
    assert SnapshotsState.from_json(None) == SnapshotsState()
    assert join_tables(back, [("public", "a"), ("public", "b")]) == [("public", "b")]
    assert join_tables(SnapshotsState(), [("public", "a")]) == [("public", "a")]


def _chunk(invisible: frozenset[int], xmax: int) -> ReadSnapshot:
    return ReadSnapshot(invisible, xmax)


def test_unseen_transactions_are_the_running_ones_and_those_from_xmax_on() -> None:
    c = _chunk(frozenset({90, 95}), 100)
    assert c.unseen(90) and c.unseen(95) and c.unseen(100) and c.unseen(5_000)
    assert not c.unseen(89) and not c.unseen(99) and not c.unseen(None)


def test_unseen_across_xid_wraparound() -> None:
    c = _chunk(frozenset(), 0xFFFFFFF0)
    assert c.unseen(0xFFFFFFF5) and c.unseen(3)  # after xmax, past the wrap
    assert not c.unseen(0xFFFFFF00)


KEYS = [b"k1", b"k2", b"k3", b"k4"]
SEEN = ReadSnapshot(frozenset({90}), 100)  # the SELECT saw neither 90 nor 100 and later


def test_merge_drops_keys_streamed_inside_the_window_whatever_their_transaction() -> None:
    kept = merge_chunk(KEYS, SEEN, window_keys={b"k2", b"zz"}, early={}, recent=frozenset())
    assert kept == [0, 2, 3]


def test_merge_drops_keys_streamed_before_the_low_mark_only_for_unseen_transactions() -> None:
    # 90 was running and 100 began after the SELECT's snapshot: their changes are not in the
    # rows, so the streamed ones win; 80 was visible: its change is in the rows already.
    early: dict[int | None, set[bytes]] = {90: {b"k1"}, 100: {b"k4"}, 80: {b"k3"}, None: {b"k2"}}
    kept = merge_chunk(KEYS, SEEN, window_keys=set(), early=early, recent=frozenset())
    assert kept == [1, 2]


def test_merge_asks_for_a_new_read_when_a_finished_transaction_was_unseen() -> None:
    # The stream finished 90 before the chunk was asked for: its keys were never noted.
    assert merge_chunk(KEYS, SEEN, window_keys=set(), early={}, recent=frozenset({90})) is None
    kept = merge_chunk(KEYS, SEEN, window_keys=set(), early={}, recent=frozenset({50, 99}))
    assert kept == [0, 1, 2, 3]


def test_merge_of_a_truncated_window_keeps_nothing() -> None:
    kept = merge_chunk(KEYS, SEEN, window_keys=set(), early={}, recent=frozenset(), truncated=True)
    assert kept == []
