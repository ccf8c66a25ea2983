"""What an incremental snapshot shows as it goes: a bar per table on a terminal (log lines
otherwise, :class:`cdc.snapshot_progress.SnapshotProgress`), and the observer's metrics."""

from __future__ import annotations

from dataclasses import dataclass

from cdc.incremental.queue import TableSnapshot
from cdc.observer import StreamObserver
from cdc.snapshot_progress import SnapshotProgress
from schemas.model import TableSchema


@dataclass
class _View:
    """What the bar shows for a table (a :class:`cdc.snapshot_progress.TableCopy`)."""

    schema: TableSchema
    estimated_rows: int
    rows: int


class Progress:
    """One bar per snapshot, drawn once per chunk; metrics through the observer."""

    def __init__(self, observer: StreamObserver, tty: bool) -> None:
        self._observer = observer
        self._tty = tty
        self._bars: dict[int, tuple[SnapshotProgress, _View]] = {}

    def chunk(self, snap: TableSnapshot, table: TableSchema, *, complete: bool) -> None:
        on_progress = getattr(self._observer, "on_snapshot_progress", None)
        if on_progress is not None:
            on_progress(snap.name, snap.rows, snap.estimated_rows, snap.chunks)
        bar = self._bars.get(id(snap))
        if bar is None:
            view = _View(table, snap.estimated_rows, snap.rows)
            bar = self._bars[id(snap)] = (SnapshotProgress([view], self._tty), view)
        bar[1].rows = snap.rows
        # Done is 100 %: rows a streamed change replaced, or an estimate too high, leave the
        # count below the estimate.
        bar[1].estimated_rows = snap.rows if complete else max(snap.estimated_rows, snap.rows)
        bar[0].update(bar[1], refresh=True)
        if complete:
            self.done(snap)

    def done(self, snap: TableSnapshot) -> None:
        bar = self._bars.pop(id(snap), None)
        if bar is not None:
            bar[0].close()

    def close(self) -> None:
        for bar, _ in self._bars.values():
            bar.close()
        self._bars.clear()
