"""The exactly-once restart rule (cdc.committed): what a run skips, and that the position it
commits never goes back, whatever it replays."""

from __future__ import annotations

import random

import pytest

from cdc.committed import Committed, Position, check_slot, transactional_id
from pgcdc.core.errors import SlotError
from pgcdc.core.lsn import Lsn


def test_the_record_round_trips() -> None:
    for c in (
        Committed(Lsn(100)),
        Committed(Lsn(200), Lsn(180), None, 5.0),
        Committed(Lsn(200), Lsn(250), 41, 6.0),
    ):
        assert Committed.from_json(c.to_json()) == c


def test_a_whole_transaction_skips_every_order_of_it_and_nothing_after() -> None:
    p = Position(Committed(Lsn(300), Lsn(280)), Lsn(100))
    assert p.replaying
    assert p.skips(280, 0) and p.skips(280, 10**9) and p.skips(120, 3)
    assert not p.skips(281, 0)


def test_a_split_transaction_skips_only_the_orders_it_committed() -> None:
    p = Position(Committed(Lsn(200), Lsn(500), 41), Lsn(200))
    assert p.skips(500, 41) and p.skips(499, 10**6)
    assert not p.skips(500, 42)


def test_nothing_is_skipped_without_a_committed_position() -> None:
    p = Position(None, Lsn(100))
    assert not p.replaying and not p.skips(50, 0)
    assert p.held == Committed(Lsn(100))


def test_replayed_transactions_never_move_the_position_back() -> None:
    # Kafka holds a split of the transaction committing at 500, up to its order 40 000; the
    # slot resumes at 200, so the run replays transactions 300 and 400 and then 500.
    committed = Committed(Lsn(450), Lsn(500), 40_000)
    p = Position(committed, Lsn(200))
    p.transaction_ended(Lsn(300), Lsn(310))
    assert p.held == committed
    p.split(Lsn(500), 30_000)  # a split while still skipping what Kafka holds
    assert p.held == committed
    assert p.replaying and p.skips(500, 39_999)
    p.split(Lsn(500), 45_000)
    assert p.held == Committed(Lsn(450), Lsn(500), 45_000)
    p.transaction_ended(Lsn(500), Lsn(510))
    assert p.held == Committed(Lsn(510), Lsn(500), None)
    assert not p.replaying and not p.skips(600, 0)


def test_an_idle_position_moves_only_forward() -> None:
    p = Position(Committed(Lsn(300), Lsn(280)), Lsn(300))
    assert not p.idle(Lsn(250)) and p.held.end_lsn == Lsn(300)
    assert p.idle(Lsn(400)) and p.held == Committed(Lsn(400), Lsn(280))


def test_random_replays_commit_each_version_once() -> None:
    """A model: transactions of random sizes streamed, each run killed at a random point
    after a random number of commits (whole or split), the next run resuming from a slot
    confirmed anywhere at or below the committed end. Every (commit LSN, order) reaches
    Kafka exactly once."""
    rnd = random.Random(5)
    for _ in range(200):
        txns = [(100 * (i + 1), rnd.randint(1, 30)) for i in range(rnd.randint(1, 12))]
        ends = {lsn: lsn + 10 for lsn, _ in txns}
        kafka: list[tuple[int, int]] = []
        committed: Committed | None = None
        confirmed = Lsn(0)
        for _run in range(200):
            p = Position(committed, confirmed)
            pending: list[tuple[int, int]] = []
            killed = False
            for lsn, size in txns:
                if ends[lsn] <= confirmed.value:
                    continue  # PostgreSQL sends nothing the slot confirmed
                for order in range(size):
                    if not p.skips(lsn, order):
                        pending.append((lsn, order))
                    if rnd.random() < 0.05:  # a split commit
                        p.split(Lsn(lsn), order)
                        kafka += pending
                        pending, committed = [], p.held
                    if rnd.random() < 0.01:
                        killed = True
                        break
                if killed:
                    break
                p.transaction_ended(Lsn(lsn), Lsn(ends[lsn]))
                if rnd.random() < 0.5:
                    kafka += pending
                    pending, committed = [], p.held
                    if rnd.random() < 0.5:  # the slot confirmed to it, or not yet
                        confirmed = committed.end_lsn
            if not killed:
                kafka += pending
                committed = p.held
                break
        assert sorted(kafka) == sorted(
            (lsn, order) for lsn, size in txns for order in range(size)
        ), "each version exactly once"


def test_a_slot_confirmed_past_the_committed_end_stops_with_one_line() -> None:
    tid = transactional_id("7", "db", "slot")
    check_slot("slot", Lsn(300), Committed(Lsn(300)), tid)
    with pytest.raises(SlotError) as e:
        check_slot("slot", Lsn(301), Committed(Lsn(300)), tid)
    assert "cdc reset-state" in str(e.value) and "\n" not in str(e.value)
