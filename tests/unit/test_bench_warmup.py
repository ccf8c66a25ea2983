"""When ``make bench`` takes OpenSearch to be warm (:func:`benchmarks.warmup.warm`)."""

from __future__ import annotations

import pytest

from benchmarks.warmup import warm

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
        ([33.0, 37.0], True),  # dearer: noise, no longer falling
    ],
)
def test_warm_once_a_rounds_cost_stops_falling(per_doc: list[float], expected: bool) -> None:
    assert warm(per_doc) is expected
