"""The joined documents' state on disk (spark_jobs.document_state): a snapshot gives back the
state it was taken of, a start loads the newest snapshot at or below Spark's last commit and
the deltas after it, a batch whose delta exists is not computed or written again, and a torn
``.tmp`` file is ignored. Files only: no servers."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from pgcdc.core.errors import ConfigError
from spark_jobs.document_state import (
    DocumentStateStore,
    Event,
    apply_to,
    decode_event,
    encode_event,
    last_committed,
)
from spark_jobs.documents import DocumentsBatch, RecordChanges
from spark_jobs.join import DocumentSpec, JoinState
from tests.unit.test_join_model import SPEC, _deliveries, _workload

pytestmark = pytest.mark.unit

INDEX = "cdc-products"
SPECS = {INDEX: SPEC}


def _batches(seed: int, size: int = 7) -> list[list[Event]]:
    rng = random.Random(seed)
    log, _ = _workload(rng, 60)
    events = _deliveries(rng, log)
    return [events[i : i + size] for i in range(0, len(events), size)]


def _view(state: JoinState) -> dict[str, Any]:
    """Everything the state holds, the reverse indices without their empty entries."""
    ids = set(state.versions) | {k[0] for k in state.rows.get(SPEC.root, {})}
    return {
        "rows": {
            t: {k: (h.version, h.row) for k, h in rows.items()}
            for t, rows in state.rows.items()
            if rows
        },
        "truncated": dict(state.truncated),
        "versions": dict(state.versions),
        "referrers": {k: v for k, v in state.referrers.items() if v},
        "children": {k: v for k, v in state.children.items() if v},
        "documents": {d: state.document(d) for d in ids},
    }


def _commit_in_spark(checkpoint: Path, batch_id: int) -> None:
    """What Spark writes once a batch is done: ``commits/<id>``."""
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits" / str(batch_id)).write_text("v1\n{}\n")


@pytest.mark.parametrize("seed", range(20))
def test_a_snapshot_restores_the_state_and_it_goes_on_alike(seed: int) -> None:
    batches = _batches(seed)
    half = len(batches) // 2
    state = JoinState(SPEC)
    for batch in batches[:half]:
        for e in batch:
            state.apply(e)
    again = JoinState.restore(SPEC, state.snapshot())
    assert _view(again) == _view(state)
    for batch in batches[half:]:
        for e in batch:
            assert again.apply(e) == state.apply(e)
    assert _view(again) == _view(state)


def test_events_read_back_as_written() -> None:
    for batch in _batches(3):
        for e in batch:
            assert decode_event(encode_event(e)) == e


@pytest.mark.parametrize("every", [1, 3, 50])
def test_a_start_loads_the_state_of_the_last_committed_batch(tmp_path: Path, every: int) -> None:
    batches = _batches(7)
    store = DocumentStateStore(tmp_path, SPECS, snapshot_every=every)
    states = store.load()
    after: list[dict[str, Any]] = []
    for batch_id, batch in enumerate(batches):
        for e in batch:
            apply_to(states, e)
        store.commit(batch_id, batch, states)
        _commit_in_spark(tmp_path, batch_id)
        after.append(_view(states[INDEX]))
        # A start at any point gives the state after the last committed batch.
        loaded = DocumentStateStore(tmp_path, SPECS, snapshot_every=every).load()
        assert _view(loaded[INDEX]) == after[-1], batch_id
    assert last_committed(tmp_path) == len(batches) - 1
    files = sorted(p.name for p in (tmp_path / "documents-state").iterdir())
    if every == 3:  # old files go: two snapshots at most, deltas after the older one
        assert len([f for f in files if f.startswith("snapshot-")]) <= 2, files


def test_a_batch_whose_delta_exists_is_applied_not_written_again(tmp_path: Path) -> None:
    """Killed after the delta of batch 2, before Spark's commit: the start loads the state
    of batch 1, and Spark's replay of batch 2 applies the delta and writes nothing."""
    batches = _batches(11)
    # Every 3 batches: batch 2 also wrote a snapshot, of a batch Spark has not committed.
    store = DocumentStateStore(tmp_path, SPECS, snapshot_every=3)
    states = store.load()
    for batch_id in range(3):
        for e in batches[batch_id]:
            apply_to(states, e)
        store.commit(batch_id, batches[batch_id], states)
        if batch_id < 2:
            _commit_in_spark(tmp_path, batch_id)
    want = _view(states[INDEX])
    restarted = DocumentStateStore(tmp_path, SPECS, snapshot_every=3)
    loaded = restarted.load()
    assert (tmp_path / "documents-state" / "snapshot-2.json").exists()
    assert _view(loaded[INDEX]) != want  # batch 2 is not in it yet
    writer = _Writes()
    job = DocumentsBatch(
        RecordChanges("p", SPECS.values()),
        loaded,
        restarted,
        writer,  # type: ignore[arg-type]
        writer.calls.append,  # type: ignore[arg-type]
    )
    job.run([], 2)  # the records do not matter: the delta is there
    assert writer.calls == []
    assert _view(loaded[INDEX]) == want


class _Writes:
    """Records what the batch would write (no OpenSearch in a unit test)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def write(self, index: str, docs: Any) -> None:
        self.calls.append((index, docs))


def test_a_torn_tmp_file_is_ignored(tmp_path: Path) -> None:
    batches = _batches(5)
    store = DocumentStateStore(tmp_path, SPECS, snapshot_every=2)
    states = store.load()
    for batch_id in range(2):
        for e in batches[batch_id]:
            apply_to(states, e)
        store.commit(batch_id, batches[batch_id], states)
        _commit_in_spark(tmp_path, batch_id)
    # Killed while writing batch 2's delta and a snapshot: half files, never renamed.
    d = tmp_path / "documents-state"
    (d / "delta-2.json.tmp").write_bytes(b'[["c","products",[1],[9')
    (d / "snapshot-3.json.tmp").write_bytes(b"{")
    loaded = DocumentStateStore(tmp_path, SPECS).load()
    assert _view(loaded[INDEX]) == _view(states[INDEX])
    assert not list(d.glob("*.tmp"))
    assert DocumentStateStore(tmp_path, SPECS).delta(2) is None  # batch 2 is computed again


def test_a_changed_declaration_or_a_lost_delta_stops_the_start(tmp_path: Path) -> None:
    store = DocumentStateStore(tmp_path, SPECS)
    states = store.load()
    store.commit(0, [], states)
    _commit_in_spark(tmp_path, 0)
    other = {INDEX: DocumentSpec(root="products", root_key="id", fields=("id",))}
    with pytest.raises(ConfigError, match="changed since the state"):
        DocumentStateStore(tmp_path, other).load()
    _commit_in_spark(tmp_path, 1)  # Spark committed a batch the state has no delta of
    with pytest.raises(ConfigError, match=r"delta-1\.json is missing"):
        DocumentStateStore(tmp_path, SPECS).load()


def test_a_state_ahead_of_sparks_checkpoint_stops_the_start(tmp_path: Path) -> None:
    """Files of the batch after the last commit are a kill's (allowed); of a later one,
    Spark's checkpoint went back (its commits removed): refused."""
    store = DocumentStateStore(tmp_path, SPECS)
    states = store.load()
    for batch_id in range(3):
        store.commit(batch_id, [], states)
    _commit_in_spark(tmp_path, 0)
    _commit_in_spark(tmp_path, 1)  # batch 2 written, not committed: a kill
    DocumentStateStore(tmp_path, SPECS).load()
    (tmp_path / "commits" / "1").unlink()
    with pytest.raises(
        ConfigError, match="holds batch 2, but Spark's checkpoint committed up to 0"
    ):
        DocumentStateStore(tmp_path, SPECS).load()
