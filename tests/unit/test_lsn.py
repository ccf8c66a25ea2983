"""Lsn: parsing, formatting, ordering and arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.core.errors import DecodeError
from pgcdc.core.lsn import ZERO, Lsn

pytestmark = pytest.mark.unit

lsn_values = st.integers(min_value=0, max_value=2**64 - 1)


@given(lsn_values)
def test_format_parse_round_trip(v: int) -> None:
    lsn = Lsn(v)
    assert Lsn.parse(str(lsn)) == lsn


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_parse_reads_both_halves_in_any_case(hi: int, lo: int) -> None:
    expected = Lsn((hi << 32) | lo)
    assert Lsn.parse(f"{hi:x}/{lo:x}") == expected
    assert Lsn.parse(f"{hi:X}/{lo:08X}") == expected


@given(lsn_values, lsn_values)
def test_ordering_agrees_with_ints(a: int, b: int) -> None:
    assert (Lsn(a) < Lsn(b)) == (a < b)
    assert (Lsn(a) <= Lsn(b)) == (a <= b)
    assert (Lsn(a) == Lsn(b)) == (a == b)
    assert max(Lsn(a), Lsn(b)) == Lsn(max(a, b))


@given(lsn_values, lsn_values)
def test_difference_is_bytes_between(a: int, b: int) -> None:
    assert Lsn(a) - Lsn(b) == a - b


@given(lsn_values, st.integers(0, 2**40))
def test_add_then_subtract(a: int, n: int) -> None:
    if a + n < 2**64:
        assert (Lsn(a) + n) - Lsn(a) == n
    else:
        with pytest.raises(ValueError):
            Lsn(a) + n


def test_postgres_spelling() -> None:
    # The form PostgreSQL prints: upper-case hex, no zero padding.
    assert str(Lsn(0x16_B374D848)) == "16/B374D848"
    assert str(Lsn(0x1_00000000)) == "1/0"
    assert str(ZERO) == "0/0"
    assert Lsn.parse("16/B374D848").value == 0x16_B374D848
    assert Lsn.parse(" 0/1 ") == Lsn(1)


@pytest.mark.parametrize(
    "text", ["", "16", "16/", "/B3", "16/B374D8481", "123456789/0", "1/G", "-1/0", "1/ 2", "1/2/3"]
)
def test_parse_rejects_clearly(text: str) -> None:
    with pytest.raises(DecodeError, match="invalid LSN"):
        Lsn.parse(text)
    # It is a ValueError as well, for callers validating user input.
    with pytest.raises(ValueError):
        Lsn.parse(text)


@pytest.mark.parametrize("bad", [-1, 2**64])
def test_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        Lsn(bad)


def test_immutable_and_hashable() -> None:
    lsn = Lsn(5)
    with pytest.raises(AttributeError):
        lsn.value = 6  # type: ignore[misc]
    assert {Lsn(5), Lsn(5), Lsn(6)} == {Lsn(5), Lsn(6)}


@given(lsn_values, lsn_values)
def test_from_wire_is_the_same_value_as_the_constructor(v: int, w: int) -> None:
    fast = Lsn.from_wire(v)
    assert type(fast) is Lsn and fast == Lsn(v) and hash(fast) == hash(Lsn(v))
    assert (fast < Lsn(w)) == (v < w) and str(fast) == str(Lsn(v))
    with pytest.raises(AttributeError):
        fast.value = 0  # type: ignore[misc]
