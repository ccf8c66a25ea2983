"""Signals (Debezium's execute-snapshot / stop-snapshot), their signatures, the filters they
may carry, the incremental snapshots' state record, and the merge: pure code, no servers."""

from __future__ import annotations

import hashlib
import hmac
import logging

import orjson
import pytest

from cdc.incremental.auth import MAGIC, SIGNAL_MAX_AGE_S, Verifier, sign
from cdc.incremental.channels import SignalIntake
from cdc.incremental.filters import FilterRefused, check_expression
from cdc.incremental.merge import ReadSnapshot, Unconfirmed, Window, key_identity, merge_chunk
from cdc.incremental.queue import KeyRange, SnapshotsState, TableSnapshot, join_tables
from cdc.incremental.signals import (
    SnapshotRequest,
    StopRequest,
    execute_document,
    parse_document,
    parse_signal,
    quote_table,
    split_name,
    split_table,
)

pytestmark = pytest.mark.unit

KEY = b"k" * 32
DB, SLOT = "cdc", "cdc_slot"  # the reader a signal is signed for


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
    sig = parse_document(None, {"type": "stop-snapshot", "data": {}})
    assert isinstance(sig, StopRequest) and sig.tables == ()


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("execute-snapshot", "{not json"),
        ("execute-snapshot", '{"data-collections": []}'),
        ("execute-snapshot", '{"data-collections": ["a.b"], "type": "blocking"}'),
        ("execute-snapshot", '{"data-collections": ["a.b.c"]}'),
        ("execute-snapshot", "[1, 2]"),
        ("log", '{"message": "hi"}'),
        (None, None),
    ],
)
def test_a_signal_that_cannot_be_carried_out_is_ignored(kind: str | None, data: str | None) -> None:
    assert parse_signal("x", kind, data) is None


def test_quoted_names_round_trip() -> None:
    assert split_name('"my.schema"."Or""ders"') == ["my.schema", 'Or"ders']
    assert split_table("orders") == ("public", "orders")
    assert split_table(quote_table(("a.b", 'c"d'))) == ("a.b", 'c"d')
    with pytest.raises(ValueError):
        split_table('"unterminated')


def test_a_document_with_key_ranges_round_trips() -> None:
    ranges = [KeyRange(["1"], ["9"]), KeyRange(None, ["20"]), KeyRange(["30"], None)]
    doc = execute_document([split_table("orders"), split_table("s.t")], "a = 1", ranges)
    sig = parse_document(doc["id"], orjson.loads(orjson.dumps(doc)))
    assert isinstance(sig, SnapshotRequest)
    assert sig.id == doc["id"]
    assert sig.tables == (("public", "orders"), ("s", "t"))
    assert sig.where(("s", "t")) == "a = 1"
    assert sig.key_ranges(("s", "t")) == ranges


def test_state_record_round_trips() -> None:
    state = SnapshotsState(
        captured=[("public", "a")],
        queue=[
            TableSnapshot("id1", "public", "a", "x > 1", "wal", ["7"], 3, 300, 1000),
            TableSnapshot("id2", "public", "a", ranges=[KeyRange(["1"], None)], range_index=0),
        ],
        seen={"sig-1": 1_700_000_000.0},
    )
    back = SnapshotsState.from_json(state.to_json())
    assert back == state
    assert SnapshotsState.from_json(None) == SnapshotsState()
    # A record written before signals were remembered still reads.
    assert SnapshotsState.from_json(b'{"captured": null, "queue": []}') == SnapshotsState()
    assert join_tables(back, [("public", "a"), ("public", "b")]) == [("public", "b")]
    assert join_tables(SnapshotsState(), [("public", "a")]) == [("public", "a")]


def test_remembered_signals_are_forgotten_once_too_old_to_run() -> None:
    state = SnapshotsState()
    state.remember("old", 100.0, oldest=0.0)
    state.remember("new", 1_000.0, oldest=500.0)
    assert state.seen == {"new": 1_000.0}


# --- signatures -----------------------------------------------------------------------


def test_a_signed_signal_verifies_and_its_signature_covers_the_exact_bytes() -> None:
    doc = execute_document([("public", "t")])
    signed = sign(KEY, doc, database=DB, slot=SLOT, now=1_000.0)
    v = Verifier(KEY, DB, SLOT, clock=lambda: 1_000.0).verify(signed, "test")
    assert v is not None and v.id == doc["id"] and v.ts == 1_000.0
    payload = signed.split(b":", 2)[2]
    assert signed.split(b":", 2)[1] == hmac.new(KEY, payload, hashlib.sha256).hexdigest().encode()
    # One byte changed in the document, same signature: refused.
    tampered = signed.replace(b"public.t", b"public.u")
    assert Verifier(KEY, DB, SLOT, clock=lambda: 1_000.0).verify(tampered, "test") is None


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (orjson.dumps({"id": "x", "type": "execute-snapshot"}), "not signed"),
        (MAGIC + b"0" * 64 + b":{}", "bad signature"),
        (
            sign(b"another key", {"id": "x", "type": "t"}, database=DB, slot=SLOT, now=1_000.0),
            "bad signature",
        ),
        (
            sign(KEY, {"id": "x"}, database=DB, slot=SLOT, now=1_000.0 - SIGNAL_MAX_AGE_S - 1),
            "too old",
        ),
        (sign(KEY, {"id": "x"}, database=DB, slot=SLOT, now=1_000.0 + 3_600), "in the future"),
        (sign(KEY, {"type": "t"}, database=DB, slot=SLOT, now=1_000.0), "has no id"),
    ],
)
def test_an_unauthenticated_signal_is_refused_with_one_line(
    content: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert Verifier(KEY, DB, SLOT, clock=lambda: 1_000.0).verify(content, "wal@0/1") is None
    [line] = [r.getMessage() for r in caplog.records]
    assert "wal@0/1" in line and reason in line


def test_without_a_key_every_signed_channel_refuses() -> None:
    assert (
        Verifier(None, DB, SLOT).verify(sign(KEY, {"id": "x"}, database=DB, slot=SLOT), "kafka")
        is None
    )


def test_a_signal_carried_out_once_is_not_carried_out_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = SnapshotsState()
    intake = SignalIntake(
        Verifier(KEY, DB, SLOT, clock=lambda: 1_000.0), state, clock=lambda: 1_000.0
    )
    signed = sign(KEY, execute_document([("public", "t")]), database=DB, slot=SLOT, now=1_000.0)
    accepted = intake.wal(signed, "0/10")
    assert accepted is not None and accepted.via == "wal"
    intake.remember(accepted)
    with caplog.at_level(logging.INFO):
        assert intake.wal(signed, "0/20") is None  # replayed, or written again
    assert "already carried out" in caplog.text


# --- filters ----------------------------------------------------------------------------

COLUMNS = {"id", "region", "name", "ts", "tags"}


@pytest.mark.parametrize(
    ("text", "runs"),
    [
        ("region = 'eu'", "region = 'eu'"),
        ("id % 2 = 0 AND name LIKE 'a%'", "id % 2 = 0 AND name LIKE 'a%'"),
        ("lower(name) IN ('a', 'b') OR id BETWEEN 1 AND 5", None),
        ("ts > now() - interval '1 day'", "ts > now() - CAST('1 day' AS interval)"),
        ("(id, region) > (1, 'a') AND tags[1] IS NOT NULL", None),
        ("coalesce(region, 'x') <> 'y' AND CASE WHEN id > 1 THEN true ELSE false END", None),
    ],
)
def test_a_filter_over_the_tables_columns_is_checked_and_rewritten(
    text: str, runs: str | None
) -> None:
    checked = check_expression(text, COLUMNS)
    assert checked.sql == (runs or checked.sql)
    # What runs is the tree written again, and it reads back to the same tree.
    assert check_expression(checked.sql, COLUMNS).sql == checked.sql


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("id = 1; DROP TABLE t", "more than one statement"),
        ("id < (select count(*) from pg_authid)::int + 1000", "subquery"),
        ("EXISTS (SELECT 1 FROM pg_authid)", "subquery"),
        ("id IN (SELECT oid FROM pg_authid)", "subquery"),
        ("pg_authid.oid = 1", "own columns only"),
        ("t.* IS NOT NULL", "own columns only"),
        ("nosuch > 1", "not a column"),
        ("count(*) > 1", "aggregate"),
        ("row_number() OVER () > 1", "window"),
        ("public.f(id)", "not allowed"),
        ("id OPERATOR(public.=) 1", "schema-qualified operator"),
        ("id::public.mytype IS NULL", "schema-qualified type"),
        ("id = $1", "parameter"),
        ("id = 1 ORDER BY id", "more than an expression"),
        ("id = 1 LIMIT 0", "more than an expression"),
        ("id = 1 FOR UPDATE", "more than an expression"),
        ("id = 1 UNION SELECT 1", "not a boolean expression"),
        ("x) OR (1=1", "does not parse"),
        ("", "does not parse"),
    ],
)
def test_a_filter_that_is_more_than_an_expression_over_the_columns_is_refused(
    text: str, reason: str
) -> None:
    with pytest.raises(FilterRefused, match=reason):
        check_expression(text, COLUMNS)


def test_an_allowed_qualified_function_is_named_for_the_server_check() -> None:
    checked = check_expression("public.tenant_of(id) = 3", COLUMNS, ["public.tenant_of"])
    assert ("public", "tenant_of") in checked.functions


# --- the merge ----------------------------------------------------------------------------


def test_unseen_transactions_are_the_running_ones_and_those_from_xmax_on() -> None:
    c = ReadSnapshot(frozenset({90, 95}), 100)
    assert c.unseen(90) and c.unseen(95) and c.unseen(100) and c.unseen(5_000)
    assert not c.unseen(89) and not c.unseen(99) and not c.unseen(None)


def test_unseen_across_xid_wraparound() -> None:
    c = ReadSnapshot(frozenset(), 0xFFFFFFF0)
    assert c.unseen(0xFFFFFFF5) and c.unseen(3)  # after xmax, past the wrap
    assert not c.unseen(0xFFFFFF00)


KEYS = [("k1",), ("k2",), ("k3",), ("k4",)]
SEEN = ReadSnapshot(frozenset({90}), 100)  # the SELECT saw neither 90 nor 100 and later


def _window(unconfirmed: frozenset[int] = frozenset()) -> Window:
    return Window(unconfirmed)


def test_merge_drops_keys_streamed_inside_the_window_whatever_their_transaction() -> None:
    w = _window()
    w.in_window = True
    w.note(("k2",), 80)
    w.note(("zz",), 90)
    assert merge_chunk(KEYS, SEEN, w) == [0, 2, 3]


def test_merge_drops_keys_streamed_before_the_low_mark_only_for_unseen_transactions() -> None:
    # 90 was running and 100 began after the SELECT's snapshot: their changes are not in the
    # rows, so the streamed ones win; 80 was visible: its change is in the rows already.
    w = _window()
    for key, xid in ((("k1",), 90), (("k4",), 100), (("k3",), 80), (("k2",), None)):
        w.note(key, xid)
    assert merge_chunk(KEYS, SEEN, w) == [1, 2]


def test_merge_asks_for_a_new_read_when_a_transaction_streamed_before_was_unseen() -> None:
    assert merge_chunk(KEYS, SEEN, _window(frozenset({90}))) is None
    assert merge_chunk(KEYS, SEEN, _window(frozenset({50, 99}))) == [0, 1, 2, 3]


def test_merge_of_a_truncated_window_keeps_nothing() -> None:
    w = _window()
    w.truncated = True
    assert merge_chunk(KEYS, SEEN, w) == []


def test_keys_are_compared_by_identity_not_by_their_record_bytes() -> None:
    # A key column changed from int to bigint: the record key's schema changed with it, the
    # key's identity (its text) did not. The streamed change of key 7 drops the chunk row.
    names = ["id", "v"]
    chunk_row = ("7", "old")
    streamed = (b"7", b"new")
    positions = [names.index("id")]
    w = _window()
    w.in_window = True
    w.note(key_identity(streamed, positions), 120)
    assert merge_chunk([key_identity(chunk_row, positions)], SEEN, w) == []


def test_unconfirmed_transactions_stay_until_a_snapshot_saw_them() -> None:
    u = Unconfirmed()
    for xid in (80, 90, 95, 120):
        u.add(xid)
    u.prune(SEEN)  # saw 80 and 95 (done before its xmax, not running); not 90 nor 120
    assert u.frozen() == frozenset({90, 120})
    u.prune(ReadSnapshot(frozenset(), 200))
    assert len(u) == 0
