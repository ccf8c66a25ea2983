"""Progress of a snapshot: a rich progress bar per table on a terminal, log lines otherwise."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from schemas.model import TableSchema

log = logging.getLogger(__name__)


class TableCopy(Protocol):
    """A table being copied: what it is, how many rows it is thought to have, how many so far."""

    @property
    def schema(self) -> TableSchema: ...
    @property
    def estimated_rows(self) -> int: ...
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
        left = max(0, plan.estimated_rows - plan.rows)
        if self._bar is not None:
            self._bar.update(
                self._tasks[id(plan)],
                completed=plan.rows,
                total=max(plan.rows, plan.estimated_rows) or None,
                rate=f"{rate:,.0f}",
                refresh=refresh,
            )
        elif now - self._last_log >= 5.0:
            self._last_log = now
            log.info(
                "snapshot progress: %s.%s %d rows (~%d), %.0f rows/s, ETA %s",
                plan.schema.schema,
                plan.schema.table,
                plan.rows,
                plan.estimated_rows,
                rate,
                f"{left / rate:.0f}s" if rate > 0 else "?",
                extra={"table": f"{plan.schema.schema}.{plan.schema.table}"},
            )

    def close(self) -> None:
        """Stop the bars (the terminal keeps them)."""
        if self._bar is not None:
            self._bar.stop()
