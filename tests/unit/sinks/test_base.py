"""Pure parts of the sink contract: ids, batch reduction, unchanged TOAST. (The search
follower's external versions are tested in test_search_versions.py.)"""

from __future__ import annotations

import base64
import copy
import math
import pickle
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER, VersionOrder
from sinks.base import (
    ApplyResult,
    BatchOutcomes,
    Change,
    OnePerKey,
    Outcome,
    WholeDocument,
    fill_unchanged,
    is_placeholder,
    key_id,
    one_per_key,
    plain,
    reduce_batch,
    split_unchanged,
)

pytestmark = pytest.mark.unit

# One strategy per key column type a table can have: every value of one column has one type.
_COLUMN_VALUES: list[st.SearchStrategy[Any]] = [
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.binary(max_size=16),
    st.uuids().map(str),
]


@st.composite
def key_payload_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two key payloads of one table: same field names, same type per field."""
    n = draw(st.integers(min_value=1, max_value=4))
    names = draw(st.lists(st.text(min_size=1, max_size=5), min_size=n, max_size=n, unique=True))
    kinds = [draw(st.sampled_from(_COLUMN_VALUES)) for _ in names]
    a = {name: draw(kind) for name, kind in zip(names, kinds, strict=True)}
    b = {name: draw(kind) for name, kind in zip(names, kinds, strict=True)}
    return a, b


def _same_key(a: dict[str, Any], b: dict[str, Any]) -> bool:
    # Python says -0.0 == 0.0; their ids differ, as their text in PostgreSQL does.
    def norm(v: Any) -> Any:
        return (v, math.copysign(1.0, v)) if isinstance(v, float) else (type(v), v)

    return [norm(v) for v in a.values()] == [norm(v) for v in b.values()]


@given(key_payload_pairs())
def test_key_id_is_injective(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    a, b = pair
    if _same_key(a, b):
        assert key_id(a) == key_id(b)
    else:
        assert key_id(a) != key_id(b)


def test_key_id_single_column_is_the_value_as_text() -> None:
    assert key_id({"id": 42}) == "42"
    assert key_id({"code": "abc"}) == "abc"
    assert key_id({"flag": True}) == "true"
    assert key_id({"id": -7}) == "-7"


def test_key_id_composite_is_a_json_array() -> None:
    assert key_id({"a": 1, "b": "x"}) == '[1,"x"]'
    # A value containing the separator cannot be confused with two values.
    assert key_id({"a": "1,2", "b": "3"}) != key_id({"a": "1", "b": "2,3"})
    assert key_id({"a": 1, "b": 1.0}) == "[1,1.0]"


def test_key_id_refuses_empty_and_unknown() -> None:
    with pytest.raises(ValueError):
        key_id({})
    with pytest.raises(TypeError):
        key_id({"a": object()})


def test_change_refuses_negative_positions() -> None:
    with pytest.raises(ValueError):
        Change("public.t", "1", -1, 0, {})
    with pytest.raises(ValueError):
        Change("public.t", "1", 0, -1, {})
    # Any LSN and any order are exact: nothing is packed or clamped.
    big = Change("public.t", "1", 2**64 - 1, 2**40, {})
    assert big.version_order == VersionOrder(2**64 - 1, 2**40)


def test_placeholder_forms() -> None:
    raw = UNAVAILABLE_VALUE_PLACEHOLDER.encode()
    assert is_placeholder(UNAVAILABLE_VALUE_PLACEHOLDER)
    assert is_placeholder([UNAVAILABLE_VALUE_PLACEHOLDER])
    assert is_placeholder(base64.b64encode(raw).decode())
    # binary.handling.mode=hex, and arrays of binary values in either mode
    assert is_placeholder(raw.hex())
    assert is_placeholder(raw.hex().upper())
    assert is_placeholder([raw.hex()])
    assert is_placeholder([base64.b64encode(raw).decode()])
    assert not is_placeholder("x")
    assert not is_placeholder(None)
    assert not is_placeholder(float("nan"))
    assert not is_placeholder([UNAVAILABLE_VALUE_PLACEHOLDER, "x"])
    assert not is_placeholder([None])


def test_split_unchanged_never_keeps_the_placeholder() -> None:
    c = Change(
        "public.t",
        "1",
        10,
        0,
        {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "tags": [UNAVAILABLE_VALUE_PLACEHOLDER]},
        frozenset({"body"}),
    )
    values, held = split_unchanged(c)
    assert values == {"id": 1}
    assert held == {"body", "tags"}


_RAW_PLACEHOLDER = UNAVAILABLE_VALUE_PLACEHOLDER.encode()
VALUES = st.sampled_from(
    [
        UNAVAILABLE_VALUE_PLACEHOLDER,
        [UNAVAILABLE_VALUE_PLACEHOLDER],
        base64.b64encode(_RAW_PLACEHOLDER).decode(),
        [_RAW_PLACEHOLDER.hex()],
        [UNAVAILABLE_VALUE_PLACEHOLDER, "x"],
        "x",
        "",
        1,
        None,
        {"a": UNAVAILABLE_VALUE_PLACEHOLDER},
    ]
)


@given(
    st.dictionaries(st.sampled_from("abcdef"), VALUES),
    st.frozensets(st.sampled_from("abcdefg")),
)
def test_split_unchanged_is_a_column_by_column_split(
    doc: dict[str, Any], unchanged: frozenset[str]
) -> None:
    values, held = split_unchanged(Change("public.t", "1", 10, 0, doc, unchanged))
    assert held == unchanged | {c for c, v in doc.items() if is_placeholder(v)}
    assert values == {c: v for c, v in doc.items() if c not in held}
    assert isinstance(held, frozenset)


def test_reduce_keeps_the_newest_change_per_key() -> None:
    changes = [
        Change("public.t", "1", 20, 0, {"v": "new"}),
        Change("public.t", "1", 10, 5, {"v": "old"}),
        Change("public.t", "2", 10, 0, {"v": "two"}),
        Change("public.u", "1", 5, 0, None),
    ]
    r = reduce_batch(changes)
    assert [(c.table, c.key, c.doc) for c in r.winners] == [
        ("public.t", "1", {"v": "new"}),
        ("public.t", "2", {"v": "two"}),
        ("public.u", "1", None),
    ]
    assert r.index_of == [0, 2, 3]
    assert r.superseded == [1]


def test_reduce_fills_unchanged_columns_from_an_older_change_in_the_batch() -> None:
    big = "x" * 10
    changes = [
        Change("public.t", "1", 10, 0, {"id": 1, "body": big, "n": 1}),
        Change(
            "public.t",
            "1",
            11,
            0,
            {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "n": 2},
            frozenset({"body"}),
        ),
    ]
    (winner,) = reduce_batch(changes).winners
    assert winner.doc == {"id": 1, "body": big, "n": 2}
    assert winner.unchanged == frozenset()
    assert winner.version_order == (11, 0)


def test_reduce_keeps_columns_unchanged_when_the_batch_never_had_them() -> None:
    changes = [
        Change(
            "public.t",
            "1",
            10,
            0,
            {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER},
            frozenset({"body"}),
        ),
        Change(
            "public.t",
            "1",
            11,
            0,
            {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER},
            frozenset({"body"}),
        ),
    ]
    (winner,) = reduce_batch(changes).winners
    assert winner.doc == {"id": 1}
    assert winner.unchanged == {"body"}


def test_reduce_delete_wins_over_older_insert_and_loses_to_newer() -> None:
    ins, dele = Change("public.t", "1", 10, 0, {"id": 1}), Change("public.t", "1", 12, 0, None)
    assert reduce_batch([dele, ins]).winners[0].doc is None
    reinsert = Change("public.t", "1", 13, 0, {"id": 1})
    assert reduce_batch([reinsert, dele, ins]).winners[0].doc == {"id": 1}


def test_one_per_key_keeps_an_already_reduced_batch_as_it_is() -> None:
    changes = [
        Change("public.t", "1", 20, 0, {"v": "a"}),
        Change("public.t", "2", 10, 0, {"v": "b", "body": UNAVAILABLE_VALUE_PLACEHOLDER}),
        Change("public.u", "1", 5, 0, None),
    ]
    r = one_per_key(changes)
    assert r.winners == changes
    assert r.winners[1] is changes[1]  # not folded or copied: nothing to reduce
    assert r.index_of == [0, 1, 2]
    assert r.superseded == []


def test_one_per_key_reduces_a_batch_that_repeats_a_key() -> None:
    changes = [Change("public.t", "1", 20, 0, {"v": "new"}), Change("public.t", "1", 10, 0, {})]
    assert one_per_key(changes) == reduce_batch(changes)
    assert one_per_key(changes).superseded == [1]


def test_one_per_key_takes_a_one_per_key_batch_at_its_word() -> None:
    """A OnePerKey batch (a range the native path reduced: tests/unit/test_fast_changes.py
    holds that it repeats no key) is not checked again: its keys are not gathered. Were
    the check still made, this batch would be reduced."""
    changes = [Change("public.t", "1", 20, 0, {"v": "new"}), Change("public.t", "1", 10, 0, {})]
    r = one_per_key(OnePerKey(changes))
    assert r.winners == changes
    assert r.superseded == []


def test_fill_unchanged_fills_only_from_changes_after_the_last_delete() -> None:
    p = UNAVAILABLE_VALUE_PLACEHOLDER
    history = [
        Change("public.t", "1", 10, 0, {"id": 1, "body": "old", "n": 0}),
        Change("public.t", "1", 11, 0, None),
        Change("public.t", "1", 12, 0, {"id": 1, "body": p, "n": 1}, frozenset({"body"})),
    ]
    newest = fill_unchanged(history)
    assert newest is history[2]  # the value before the delete is not the row's any more
    assert newest.version_order == VersionOrder(12, 0)
    history[1] = Change("public.t", "1", 11, 0, {"id": 1, "body": "kept", "n": 9})
    assert fill_unchanged(history).doc == {"id": 1, "body": "kept", "n": 1}


def test_batch_outcomes_skip_superseded_and_flag_missing_results() -> None:
    changes = [
        Change("public.t", "1", 10, 0, {"v": "old"}),
        Change("public.t", "1", 20, 0, {"v": "new"}),
        Change("public.t", "2", 20, 1, {"v": "x"}),
    ]
    outcomes = BatchOutcomes(changes)
    todo = outcomes.one_per_key()
    assert [slot for slot, _ in todo] == [1, 2]
    assert outcomes.has(0) and not outcomes.has(1)
    outcomes.set(1, Outcome.APPLIED)
    results = outcomes.results()
    assert [r.outcome for r in results] == ["skipped", "applied", "failed"]
    assert results[0] == ApplyResult("1", "public.t", Outcome.SKIPPED, results[0].reason)
    assert results[0].reason and "superseded" in results[0].reason
    assert results[2].reason == "no outcome (bug)"


def test_a_whole_document_is_its_json_read_when_asked() -> None:
    values = {"id": 7, "name": "caf\u00e9", "price": 1.5, "tags": None, "big": 2**64 - 1}
    doc = WholeDocument(orjson.dumps(values), len(values))
    assert len(doc) == 5 and doc._values is None  # its length is known unread
    assert doc == values and values == doc and list(doc.items()) == list(values.items())
    assert doc["name"] == "caf\u00e9" and doc.get("nope") is None and "price" in doc
    assert {**doc} == values and dict(doc) == values
    for other in (pickle.loads(pickle.dumps(doc)), copy.deepcopy(doc)):
        assert type(other) is dict and other == values
    # Not a dict, so orjson needs the default that reads it (spark_jobs.dead_letter's).
    with pytest.raises(TypeError):
        orjson.dumps({"doc": WholeDocument(b"{}", 0)})
    assert orjson.loads(orjson.dumps({"doc": doc}, default=plain)) == {"doc": values}
