"""The Redis follower's stored versions: exact, fixed width, ordered like positions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.core.contract import VersionOrder
from sinks.cache_script import parse_version, version_string

pytestmark = pytest.mark.unit

positions = st.tuples(
    st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=0, max_value=10**10 - 1)
)


@given(positions, positions)
def test_stored_versions_order_like_positions(a: tuple[int, int], b: tuple[int, int]) -> None:
    sa, sb = version_string(VersionOrder(*a)), version_string(VersionOrder(*b))
    assert len(sa) == len(sb) == 30 and sa.isdigit()
    assert (sa < sb) == (a < b)
    # The script compares 15-digit chunks as doubles: each chunk is exact below 2**53.
    chunks_a = [int(sa[i : i + 15]) for i in range(0, 30, 15)]
    chunks_b = [int(sb[i : i + 15]) for i in range(0, 30, 15)]
    assert all(c < 2**53 for c in chunks_a + chunks_b)
    assert (chunks_a < chunks_b) == (a < b)


@given(positions)
def test_stored_version_round_trips(p: tuple[int, int]) -> None:
    assert parse_version(version_string(VersionOrder(*p))) == p
    assert parse_version(version_string(VersionOrder(*p)).encode()) == p


def test_stored_version_refuses_out_of_range() -> None:
    with pytest.raises(ValueError):
        version_string(VersionOrder(2**64, 0))
    with pytest.raises(ValueError):
        version_string(VersionOrder(0, 10**10))
