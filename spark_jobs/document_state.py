"""The joined documents' state (:class:`spark_jobs.join.JoinState`, one per declared
document) kept in the driver and persisted beside Spark's checkpoint, the way Spark's
HDFS-backed state store keeps its own: a delta file per batch and a snapshot every few.

Layout, under ``<checkpoint>/documents-state/``:

- ``documents.json``: the declared documents the state was built for. A changed declaration
  stops the job with one line (the state holds the columns the old one chose): rebuild.
- ``delta-<batch id>.json``: the batch's input changes, in the order they were applied.
  Applying them again to the state before the batch gives the state after it, counters
  included (the join is deterministic).
- ``snapshot-<batch id>.json``: every state after that batch (:meth:`JoinState.snapshot`).

Every file is written whole to ``<name>.tmp``, flushed to disk, then renamed: a file is
there whole or not at all; a ``.tmp`` left by a kill is ignored and removed.

**The rule.** A batch computes its documents, writes them, and only then writes its delta;
Spark commits the batch after that. So at a start the state is the newest snapshot at or
below the last batch Spark committed, and the deltas after it up to that batch
(:meth:`DocumentStateStore.load`). Spark then runs the next batch, ``n``, again with the same
offsets (its offsets log holds them). If delta ``n`` exists, the job died after writing
that batch's documents and its delta but before Spark's commit: the delta is applied and
nothing written (:meth:`DocumentStateStore.delta`). Without it, the batch is computed again
from the same state and the same records: the same documents with the same versions,
written again (``external_gte`` takes them).

Pure file I/O: no Spark, no OpenSearch.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from pgcdc.core.errors import ConfigError
from spark_jobs.join import DocumentSpec, JoinChange, JoinState, Truncate

log = logging.getLogger(__name__)

STATE_DIR: Final = "documents-state"
SNAPSHOT_EVERY: Final = 20  # batches between two snapshots
_FILE = re.compile(r"(delta|snapshot)-(\d+)\.json\Z")

Event = JoinChange | Truncate


def encode_event(e: Event) -> list[Any]:
    """One change as JSON values (:func:`decode_event` reads it back)."""
    if isinstance(e, Truncate):
        return ["t", e.table, list(e.version)]
    return ["c", e.table, list(e.key), list(e.version), e.row]


def decode_event(v: Sequence[Any]) -> Event:
    """The change :func:`encode_event` gave."""
    if v[0] == "t":
        return Truncate(v[1], (v[2][0], v[2][1]))
    return JoinChange(v[1], tuple(v[2]), (v[3][0], v[3][1]), v[4])


def apply_to(states: Mapping[str, JoinState], event: Event) -> dict[str, set[Any]]:
    """Apply one change to the state of every document that joins its table; the ids of
    the documents it touched, per document's index."""
    touched: dict[str, set[Any]] = {}
    for index, state in states.items():
        if event.table in state.spec.tables():
            ids = state.apply(event)
            if ids:
                touched[index] = ids
    return touched


def last_committed(checkpoint: Path) -> int | None:
    """The last batch Spark's checkpoint at ``checkpoint`` committed (``commits/<id>``)."""
    commits = checkpoint / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(ids, default=None)


def _declared(specs: Mapping[str, DocumentSpec]) -> bytes:
    return orjson.dumps(
        {index: dataclasses.asdict(spec) for index, spec in specs.items()},
        option=orjson.OPT_SORT_KEYS,
    )


class DocumentStateStore:
    """The files of the documents' state for one checkpoint (the rule in the module's
    docstring)."""

    def __init__(
        self,
        checkpoint: Path,
        specs: Mapping[str, DocumentSpec],
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        self.checkpoint = checkpoint
        self.dir = checkpoint / STATE_DIR
        self.specs = dict(specs)
        self.snapshot_every = snapshot_every

    # -- files ------------------------------------------------------------------------

    def _path(self, kind: str, batch_id: int) -> Path:
        return self.dir / f"{kind}-{batch_id}.json"

    def _write(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a crash of the machine
        finally:
            os.close(fd)

    def _files(self, kind: str) -> list[int]:
        found = (_FILE.match(p.name) for p in self.dir.iterdir())
        return sorted(int(m.group(2)) for m in found if m and m.group(1) == kind)

    # -- start ------------------------------------------------------------------------

    def load(self) -> dict[str, JoinState]:
        """The states as of the last batch Spark committed: the newest snapshot at or below
        it, and the deltas after the snapshot up to it. ConfigError if the declaration
        changed, a committed batch's delta is missing, or the files hold a batch beyond the
        one after Spark's last commit (the state cannot be trusted: rebuild into a fresh
        index with a fresh checkpoint)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink()  # a write cut by a kill: never renamed, never read
        declared = self.dir / "documents.json"
        if declared.exists():
            if declared.read_bytes() != _declared(self.specs):
                raise ConfigError(
                    f"the declared documents ([[search.documents]]) changed since the state "
                    f"in {self.dir} was built: rebuild them into fresh indices with a fresh "
                    "checkpoint (--checkpoint, or remove this one)"
                )
        else:
            self._write(declared, _declared(self.specs))
        committed = last_committed(self.checkpoint)
        # At most the batch after the last commit can have files (written, then killed
        # before Spark's commit); a later one means Spark's checkpoint went back.
        last = -1 if committed is None else committed
        ahead = [n for kind in ("delta", "snapshot") for n in self._files(kind) if n > last + 1]
        if ahead:
            raise ConfigError(
                f"the documents' state in {self.dir} holds batch {max(ahead)}, but Spark's "
                f"checkpoint committed {'none' if committed is None else f'up to {committed}'}: "
                "the state is not the checkpoint's; rebuild the documents into fresh indices "
                "with a fresh checkpoint"
            )
        states = {index: JoinState(spec) for index, spec in self.specs.items()}
        if committed is None:
            return states
        snapshots = [n for n in self._files("snapshot") if n <= committed]
        start = -1
        if snapshots:
            start = snapshots[-1]
            data = orjson.loads(self._path("snapshot", start).read_bytes())
            states = {
                index: JoinState.restore(spec, data[index]) for index, spec in self.specs.items()
            }
        for batch_id in range(start + 1, committed + 1):
            path = self._path("delta", batch_id)
            if not path.exists():
                raise ConfigError(
                    f"{path} is missing, but Spark committed batch {batch_id}: the documents' "
                    "state cannot be made again; rebuild them into fresh indices with a fresh "
                    "checkpoint"
                )
            for event in self._read_delta(path):
                apply_to(states, event)
        log.info(
            "documents' state loaded: snapshot %s, deltas up to batch %d",
            start if snapshots else "none",
            committed,
        )
        return states

    # -- each batch ---------------------------------------------------------------------

    def delta(self, batch_id: int) -> list[Event] | None:
        """Batch ``batch_id``'s changes if its delta was written (its documents were too),
        else None."""
        path = self._path("delta", batch_id)
        return self._read_delta(path) if path.exists() else None

    @staticmethod
    def _read_delta(path: Path) -> list[Event]:
        return [decode_event(v) for v in orjson.loads(path.read_bytes())]

    def commit(
        self, batch_id: int, events: Iterable[Event], states: Mapping[str, JoinState]
    ) -> None:
        """Record batch ``batch_id`` once its documents are written: its delta, and every
        ``snapshot_every`` batches a snapshot (older files no start can need are removed)."""
        self._write(self._path("delta", batch_id), orjson.dumps([encode_event(e) for e in events]))
        if (batch_id + 1) % self.snapshot_every == 0:
            self.snapshot(batch_id, states)

    def snapshot(self, batch_id: int, states: Mapping[str, JoinState]) -> None:
        """Write the states after batch ``batch_id``; then remove the snapshots before the
        previous one and the deltas up to it (a start loads at most the previous snapshot:
        this one may belong to a batch Spark has not committed yet)."""
        self._write(
            self._path("snapshot", batch_id),
            orjson.dumps({index: s.snapshot() for index, s in states.items()}),
        )
        older = [n for n in self._files("snapshot") if n < batch_id]
        if not older:
            return
        keep = older[-1]
        for n in older[:-1]:
            self._path("snapshot", n).unlink(missing_ok=True)
        for n in self._files("delta"):
            if n <= keep:
                self._path("delta", n).unlink(missing_ok=True)
