"""The changes ChangeBuilder builds are marked ``split`` (spark_jobs/changes.py): the sinks then
write their ``doc`` as it is, so it must be exactly what the column-by-column split
(:func:`sinks.base.split_unchanged`) of the same change would write, placeholder never
included. Pure code: the reduction and the change builder, no Spark session."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER, encode_unchanged_header
from sinks.base import is_placeholder, split_unchanged
from spark_jobs.changes import ChangeBuilder
from spark_jobs.reduce import latest_per_key
from spark_jobs.transforms import CHANGE, SCHEMA
from tests.unit.test_spark_history_schemas import _decimal, _event

pytestmark = pytest.mark.unit


_PLACEHOLDER_FORMS = [
    UNAVAILABLE_VALUE_PLACEHOLDER,
    [UNAVAILABLE_VALUE_PLACEHOLDER],
    base64.b64encode(UNAVAILABLE_VALUE_PLACEHOLDER.encode()).decode(),
    [UNAVAILABLE_VALUE_PLACEHOLDER.encode().hex()],
    _decimal(1234),
    "eA==",  # text, and a decimal's bytes
    None,
    7,
]


@given(
    st.fixed_dictionaries(
        {"id": st.integers(0, 9)},
        optional={c: st.sampled_from(_PLACEHOLDER_FORMS) for c in ("body", "n", "s", "a")},
    ),
    st.lists(st.sampled_from(["body", "n", "s", "a", "zz"]), unique=True),
    st.booleans(),
)
def test_built_changes_are_split_as_the_sinks_would_split_them(
    after: dict[str, Any], header: list[str], with_history: bool
) -> None:
    held = encode_unchanged_header(header).decode() if header else None
    rows = [_event(6, 200, 2, after, held)]
    if with_history:
        rows.insert(0, _event(5, 100, 1, {"id": 1, "body": _decimal(1), "n": 1}, None))
    reduced = latest_per_key(rows)
    schemas = {r["schema_id"]: r["schema_json"] for r in reduced if r["kind"] == SCHEMA}
    [change_row] = [r for r in reduced if r["kind"] == CHANGE]
    built = ChangeBuilder(schemas)(change_row)
    assert built.split
    unmarked = dataclasses.replace(built, split=False)
    assert split_unchanged(built) == split_unchanged(unmarked)
    values, _ = split_unchanged(built)
    assert not any(is_placeholder(v) for v in values.values())
