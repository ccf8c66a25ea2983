"""Signals (Debezium's execute-snapshot / stop-snapshot), the incremental snapshots' state
record, and which transactions a chunk's SELECT did not see: pure code, no servers."""

from __future__ import annotations

import orjson
import pytest

from cdc.incremental import SnapshotsState, TableSnapshot, _Chunk, join_tables
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


def _chunk(invisible: frozenset[int], xmax: int) -> _Chunk:
    table = None  # the check does not look at it
    return _Chunk(None, table, "t", 1, b"", b"", {}, None, False, invisible, xmax)  # type: ignore[arg-type]


def test_unseen_transactions_are_the_running_ones_and_those_from_xmax_on() -> None:
    c = _chunk(frozenset({90, 95}), 100)
    assert c.unseen(90) and c.unseen(95) and c.unseen(100) and c.unseen(5_000)
    assert not c.unseen(89) and not c.unseen(99) and not c.unseen(None)


def test_unseen_across_xid_wraparound() -> None:
    c = _chunk(frozenset(), 0xFFFFFFF0)
    assert c.unseen(0xFFFFFFF5) and c.unseen(3)  # after xmax, past the wrap
    assert not c.unseen(0xFFFFFF00)
