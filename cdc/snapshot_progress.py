"""Progress of a snapshot: a rich progress bar per table on a terminal, log lines otherwise."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from schemas.model import TableSchema

log = logging.getLogger(__name__)

# A table never analyzed is counted when it is at most this many pages (10 MiB of 8 KiB
# pages): a count that takes milliseconds, against a progress with no size at all.
COUNT_MAX_PAGES = 1280


def estimate_rows(reltuples: float, pages: int, count: Callable[[], int]) -> int | None:
    """The rows a table is thought to hold, for its progress and ETA, or None if unknown.

    ``pg_class.reltuples`` once ANALYZE or VACUUM set it; before that it is -1 (0 before
    PostgreSQL 14), which is no estimate: then an empty file (``pages`` 0) holds none, a
    small table is counted (``count``), and a large one's size is unknown rather than 0."""
    if reltuples > 0:
        return round(reltuples)
    if pages == 0:
        return 0
    if pages <= COUNT_MAX_PAGES:
        return count()
    return None


def progress_line(table: str, rows: int, estimated: int | None, rate: float) -> str:
    """The log line's text: rows so far, the estimate, the rate, and an ETA when one is
    known (none for a table of unknown size, or one already past its estimate)."""
    if estimated is None:
        return f"{table} {rows} rows (size unknown), {rate:.0f} rows/s"
    left = estimated - rows
    eta = f"{left / rate:.0f}s" if rate > 0 and left > 0 else "?"
    return f"{table} {rows} rows (~{estimated}), {rate:.0f} rows/s, ETA {eta}"


class TableCopy(Protocol):
    """A table being copied: what it is, how many rows it is thought to have (None:
    unknown), how many so far."""

    @property
    def schema(self) -> TableSchema: ...
    @property
    def estimated_rows(self) -> int | None: ...
    @property
    def rows(self) -> int: ...


class SnapshotProgress:
    """A rich progress bar per table on a terminal; periodic log lines otherwise."""

    def __init__(self, tables: Sequence[TableCopy], tty: bool) -> None:
        """One bar per table when ``tty``; log lines at most every 5 s otherwise."""
        self._started = time.monotonic()
        self._last_log = self._started
        # Rows already done when the bars start (a resumed snapshot): not part of the rate.
        self._base = {id(p): p.rows for p in tables}
        self._bar: Any = None
        self._tasks: dict[int, Any] = {}
        if tty:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]} rows/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                # On stderr: the terminal the caller looked at (and where the logs go).
                console=Console(stderr=True),
                transient=False,
            )
            for p in tables:
                self._tasks[id(p)] = self._bar.add_task(
                    f"{p.schema.schema}.{p.schema.table}",
                    total=p.estimated_rows or None,
                    completed=p.rows,
                    rate="0",
                )
            self._bar.start()

    def update(self, plan: TableCopy, *, refresh: bool = False) -> None:
        """``plan`` has copied ``plan.rows`` rows so far; ``refresh`` draws the bar now
        (otherwise it is drawn ten times a second)."""
        now = time.monotonic()
        done = plan.rows - self._base.get(id(plan), 0)
        rate = done / max(1e-6, now - self._started)
        table = f"{plan.schema.schema}.{plan.schema.table}"
        if self._bar is not None:
            est = plan.estimated_rows
            self._bar.update(
                self._tasks[id(plan)],
                completed=plan.rows,
                total=None if est is None else max(plan.rows, est) or None,  # None: no ETA
                rate=f"{rate:,.0f}",
                refresh=refresh,
            )
        elif now - self._last_log >= 5.0:
            self._last_log = now
            log.info(
                "snapshot progress: %s",
                progress_line(table, plan.rows, plan.estimated_rows, rate),
                extra={"table": table},
            )

    def close(self) -> None:
        """Stop the bars (the terminal keeps them)."""
        if self._bar is not None:
            self._bar.stop()
