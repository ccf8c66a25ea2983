"""plan_start: how a run begins, from the slot, the saved state and the snapshot mode."""

from __future__ import annotations

import pytest

from cdc.pipeline import last_commit_at_start
from cdc.slots import Action, SlotInfo, plan_start
from cdc.state import Phase, ReaderState
from pgcdc.core.errors import SlotError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import SnapshotMode

SLOT = "s1"


def slot(*, active: bool = False, plugin: str = "pgoutput") -> SlotInfo:
    return SlotInfo(SLOT, plugin, "db", active, 42 if active else None, Lsn(100), Lsn(90))


def state(phase: Phase) -> ReaderState:
    return ReaderState(SLOT, "db", phase, Lsn(50), Lsn(100), 1.0)


@pytest.mark.parametrize("mode", [SnapshotMode.INITIAL, SnapshotMode.WHEN_NEEDED])
def test_fresh_start_takes_a_snapshot(mode: SnapshotMode) -> None:
    plan = plan_start(mode, SLOT, None, None)
    assert plan.action is Action.SNAPSHOT and not plan.drop_existing_slot


def test_no_data_creates_a_slot_without_snapshot() -> None:
    assert plan_start(SnapshotMode.NO_DATA, SLOT, None, None).action is Action.NEW_SLOT


def test_a_streamed_slot_resumes() -> None:
    plan = plan_start(SnapshotMode.INITIAL, SLOT, slot(), state(Phase.STREAMING))
    assert plan.action is Action.STREAM


def test_an_interrupted_snapshot_starts_over_with_a_new_slot() -> None:
    # The record is written before the slot is created, then again with its consistent point.
    created = ReaderState(SLOT, "db", Phase.SNAPSHOT, Lsn(100))
    for saved in (ReaderState(SLOT, "db", Phase.SNAPSHOT), created):
        plan = plan_start(SnapshotMode.INITIAL, SLOT, slot(), saved)
        assert plan.action is Action.SNAPSHOT and plan.drop_existing_slot
        assert "did not complete" in plan.reason


@pytest.mark.parametrize("mode", [SnapshotMode.INITIAL, SnapshotMode.NO_DATA])
def test_a_slot_without_a_record_is_refused_and_left_alone(mode: SnapshotMode) -> None:
    for saved in (None, state(Phase.SNAPSHOT_ONLY_DONE)):
        with pytest.raises(SlotError) as caught:
            plan_start(mode, SLOT, slot(), saved, unowned=lambda info: f"{info.slot_name} not ours")
        assert str(caught.value) == "s1 not ours"
    with pytest.raises(SlotError) as caught:
        plan_start(mode, SLOT, slot(), None)
    text = str(caught.value)
    assert "\n" not in text
    for part in ("s1", "another tool", "not dropped, recreated or advanced", "--adopt-slot"):
        assert part in text


def test_a_slot_created_elsewhere_than_the_record_says_is_refused() -> None:
    other = ReaderState(SLOT, "db", Phase.SNAPSHOT, Lsn(50))  # ours stood at 0/32, this at 0/64
    with pytest.raises(SlotError, match=r"not the one this reader created \(at LSN 0/32"):
        plan_start(SnapshotMode.INITIAL, SLOT, slot(), other)


@pytest.mark.parametrize("mode", [SnapshotMode.INITIAL, SnapshotMode.NO_DATA])
def test_adopt_slot_takes_a_slot_over_without_dropping_it(mode: SnapshotMode) -> None:
    plan = plan_start(mode, SLOT, slot(), None, adopt=True)
    assert plan.action is Action.ADOPT and not plan.drop_existing_slot
    assert ("incrementally" in plan.reason) is (mode is SnapshotMode.INITIAL)
    lost = SlotInfo(SLOT, "pgoutput", "db", False, None, Lsn(100), None, "lost")
    with pytest.raises(SlotError, match="lost"):
        plan_start(mode, SLOT, lost, None, adopt=True)


def test_a_lost_slot_is_an_error_unless_when_needed() -> None:
    with pytest.raises(SlotError, match=r"no\s+longer exists"):
        plan_start(SnapshotMode.INITIAL, SLOT, None, state(Phase.STREAMING))
    plan = plan_start(SnapshotMode.WHEN_NEEDED, SLOT, None, state(Phase.STREAMING))
    assert plan.action is Action.SNAPSHOT and "gone" in plan.reason


def test_an_active_slot_or_another_plugin_is_refused() -> None:
    with pytest.raises(SlotError, match="in use by process 42"):
        plan_start(SnapshotMode.INITIAL, SLOT, slot(active=True), state(Phase.STREAMING))
    with pytest.raises(SlotError, match="test_decoding"):
        plan_start(SnapshotMode.INITIAL, SLOT, slot(plugin="test_decoding"), None)


def test_initial_only_runs_once() -> None:
    assert plan_start(SnapshotMode.INITIAL_ONLY, SLOT, None, None).action is Action.SNAPSHOT_ONLY
    done = plan_start(SnapshotMode.INITIAL_ONLY, SLOT, None, state(Phase.SNAPSHOT_ONLY_DONE))
    assert done.action is Action.NOTHING


def test_reader_state_round_trips_through_json() -> None:
    s = state(Phase.STREAMING)
    assert ReaderState.from_json(s.to_json()) == s
    with_commit = ReaderState(SLOT, "db", Phase.STREAMING, None, Lsn(100), 1.0, Lsn(90))
    assert ReaderState.from_json(with_commit.to_json()) == with_commit
    empty = ReaderState(SLOT, "db", Phase.SNAPSHOT)
    assert ReaderState.from_json(empty.to_json()) == empty


def test_the_last_commit_at_start_is_the_states_when_it_saw_that_position() -> None:
    # Debezium's source.sequence[0] of the first transaction after a restart.
    saved = ReaderState(SLOT, "db", Phase.STREAMING, None, Lsn(100), 1.0, Lsn(90))
    assert last_commit_at_start(Action.STREAM, saved, Lsn(100)) == Lsn(90)
    # The slot moved on after the state was written: its position, exact when it is a commit.
    assert last_commit_at_start(Action.STREAM, saved, Lsn(120)) == Lsn(120)
    assert last_commit_at_start(Action.STREAM, None, Lsn(120)) == Lsn(120)
    # Right after a snapshot (or a new slot) nothing was committed yet: null, like Debezium.
    after_snapshot = ReaderState(SLOT, "db", Phase.STREAMING, Lsn(100), Lsn(100), 1.0)
    assert last_commit_at_start(Action.STREAM, after_snapshot, Lsn(100)) is None
    for action in (Action.SNAPSHOT, Action.NEW_SLOT):
        assert last_commit_at_start(action, saved, Lsn(100)) is None
