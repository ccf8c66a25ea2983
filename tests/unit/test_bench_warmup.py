"""When ``make bench`` takes OpenSearch to be warm (:func:`benchmarks.warmup.warm`), and what its
warm-up writes."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.warmup import SCHEMA, _doc, warm
from sinks.search_index import mapping_from_connect_schema

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("per_doc", "expected"),
    [
        ([], False),  # nothing measured
        ([155.0], False),  # one round says nothing of the next
        # Measured after a restart (2026-12-01): 11-45 % cheaper each round; then one 2 %
        # cheaper (not measured) is warm.
        ([155.0, 85.0], False),
        ([155.0, 85.0, 67.0, 56.0, 45.0, 37.0, 33.0], False),
        ([155.0, 85.0, 67.0, 56.0, 45.0, 37.0, 33.0, 32.5], True),
        ([33.0, 35.0], True),  # a little dearer: noise, no longer falling
        # A fresh server (make bench cef49a, 2026-12-04): the third round dearer by 44 %
        # is a pause, not a plateau (another fresh one fell to 68.5 after such spikes).
        ([321.0, 133.0, 192.0], False),
        ([321.0, 133.0, 192.0, 70.0, 52.0, 50.0], True),
    ],
)
def test_warm_once_a_rounds_cost_stops_falling(per_doc: list[float], expected: bool) -> None:
    assert warm(per_doc) is expected


def _captured() -> dict[str, Any]:
    return json.loads(
        (Path(__file__).parents[1] / "fixtures" / "orders_after_fields.json").read_text()
    )


def test_the_warm_up_maps_its_rows_as_the_search_follower_maps_the_benchmarks_rows() -> None:
    """The warm-up's rows are indexed with the mapping the reader's schema of the benchmarks'
    table gives (its amount a number read from the decimal's text, its timestamps dates): a
    warm-up of another mapping left OpenSearch to compile the benchmarks' own path."""
    captured = _captured()
    (after,) = (f for f in SCHEMA["fields"] if f["field"] == "after")
    assert mapping_from_connect_schema(after["fields"]) == mapping_from_connect_schema(
        captured["fields"]
    )
    assert [f["field"] for f in after["fields"]] == [f["field"] for f in captured["fields"]]


def test_the_warm_up_rows_carry_values_as_the_benchmarks_rows_do() -> None:
    """Each warm-up row holds the captured row's columns in its order, its decimal as text and
    its timestamps in the reader's form (UTC, ``Z``, microseconds), each row's its own."""
    captured = _captured()["after"]
    start = datetime.datetime(2026, 12, 1, 14, 50, 24, 452265, tzinfo=datetime.UTC)
    first, second = _doc(0, start), _doc(1, start)
    assert list(first) == list(captured)
    assert first["created_at"] == "2026-12-01T14:50:24.452265Z"
    pattern = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
    assert pattern.fullmatch(captured["created_at"])
    assert all(
        pattern.fullmatch(d[c]) for d in (first, second) for c in ("created_at", "updated_at")
    )
    assert second["updated_at"] != first["updated_at"]
    assert second["amount"] == "0.01"  # the text spark_jobs.convert makes of the decimal
