"""``verify.max_rows_per_second``: the token bucket's arithmetic, on a clock that only moves
when told (no test sleeps)."""

from __future__ import annotations

import pytest

from pgcdc.verify.pacing import RowPacer, paced

pytestmark = pytest.mark.unit


class Clock:
    """A monotonic clock that the pacer's sleeps move forward."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _pacer(rate: float, clock: Clock) -> RowPacer:
    return RowPacer(rate, clock=clock, sleep=clock.sleep)


def test_one_second_of_rows_goes_at_once_then_the_rate_holds() -> None:
    clock = Clock()
    pacer = _pacer(1000, clock)
    assert pacer.take(1000) == 0.0  # the bucket starts full: one second's burst
    assert pacer.take(500) == pytest.approx(0.5)  # in debt by 500 rows: half a second
    for _ in range(8):
        pacer.take(250)
    # 3,500 rows at 1,000/s: 2.5 s of waits after the first second's burst.
    assert clock.now - 100.0 == pytest.approx(2.5)
    assert pacer.rows == 3500 and pacer.waited_s == pytest.approx(2.5)


def test_over_a_long_run_the_rate_is_the_setting() -> None:
    clock = Clock()
    pacer = _pacer(20_000, clock)
    for _ in range(2000):
        pacer.take(500)  # a million rows
        clock.now += 0.001  # each read's own time counts toward the pace
    elapsed = clock.now - 100.0
    assert 1_000_000 / elapsed == pytest.approx(20_000, rel=0.03)


def test_time_spent_elsewhere_refills_the_bucket_up_to_one_second() -> None:
    clock = Clock()
    pacer = _pacer(100, clock)
    pacer.take(100)
    clock.now += 60.0  # a pause between passes: no more than one second is banked
    assert pacer.take(100) == 0.0
    assert pacer.take(50) == pytest.approx(0.5)


def test_a_read_larger_than_the_bucket_is_paid_for_afterwards() -> None:
    clock = Clock()
    pacer = _pacer(10, clock)
    assert pacer.take(40) == pytest.approx(3.0)  # 10 banked, 30 in debt
    assert pacer.take(10) == pytest.approx(1.0)  # the debt was paid by the wait


def test_zero_is_unbounded() -> None:
    clock = Clock()
    pacer = _pacer(0, clock)
    for _ in range(100):
        assert pacer.take(1_000_000) == 0.0
    assert clock.slept == [] and pacer.rows == 100_000_000
    with pytest.raises(ValueError):
        RowPacer(-1)


def test_paced_counts_every_item_in_steps() -> None:
    clock = Clock()
    pacer = _pacer(100, clock)
    items = list(paced(range(1050), pacer, every=500))
    assert items == list(range(1050))
    assert pacer.rows == 1050
    # Steps of at most one second of rows (100), so the waits come as the rows are read:
    # 100 banked, then 950 more rows at 100/s.
    assert clock.now - 100.0 == pytest.approx(9.5)
    assert max(clock.slept) <= 1.0 + 1e-9
    assert list(paced(range(3), None)) == [0, 1, 2]
