"""The workload generator's pure parts: live keys and the benchmark's transaction shapes."""

from __future__ import annotations

import random

import pytest

from benchmarks.workload import LiveKeys, txn_pattern

pytestmark = pytest.mark.unit


def test_live_keys_pick_remove_replace() -> None:
    keys = LiveKeys(range(10))
    rnd = random.Random(1)
    assert len(keys) == 10 and 3 in keys
    keys.discard(3)
    keys.discard(3)  # absent: no-op
    keys.replace(9, 90)
    taken = keys.take(rnd)
    assert taken not in keys
    left = set(keys)
    assert left == set(range(10)) - {3, 9, taken} | {90} - {taken}
    assert len(keys) == len(left) == 8
    assert {keys.pick(rnd) for _ in range(500)} == left  # every live key can be picked
    assert len(set(keys.sample(rnd, 5))) == 5 and len(keys) == 8


@pytest.mark.parametrize("txn_rows", [1, 2, 3, 7, 10, 100, 1000])
def test_txn_pattern_keeps_the_5_4_1_mix(txn_rows: int) -> None:
    pattern = txn_pattern(txn_rows)
    assert all(sum(p) == txn_rows for p in pattern)
    inserts, updates, deletes = (sum(p[i] for p in pattern) for i in range(3))
    total = inserts + updates + deletes
    assert (inserts * 10, updates * 10, deletes * 10) == (total * 5, total * 4, total * 1)
