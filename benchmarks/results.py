"""Figures and the record of a benchmark run.

A :class:`Figure` is one measured number with its unit; a figure that could not be measured
carries ``value=None`` and the reason, so reports say why instead of printing a guess.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class NotMeasured(Exception):
    """Raised by a measurement that cannot run here; the message is the reason."""


@dataclass
class Figure:
    """One number of the report, e.g. ours / snapshot / rows_per_s."""

    system: str  # "ours", "debezium", "postgres" (ceilings), "recvlogical", "envelope", ...
    metric: str  # e.g. "snapshot rows/s"
    value: float | None
    unit: str = ""
    detail: str = ""  # conditions: rows, txn size, rate, ...
    reason: str = ""  # why value is None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return self.value is not None


@dataclass
class Series:
    """A time series for the plot (seconds since its start, value)."""

    name: str
    unit: str
    points: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class BenchRecord:
    """Everything one run produced."""

    run_id: str
    quick: bool
    started_at: float = field(default_factory=time.time)
    figures: list[Figure] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)

    def add(self, fig: Figure) -> Figure:
        """Record a figure and log it."""
        self.figures.append(fig)
        if fig.measured:
            log.info(
                "%s / %s = %.4g %s (%s)", fig.system, fig.metric, fig.value, fig.unit, fig.detail
            )
        else:
            log.warning("%s / %s: not measured: %s", fig.system, fig.metric, fig.reason)
        return fig

    def not_measured(self, system: str, metric: str, reason: str, detail: str = "") -> Figure:
        """Record that ``metric`` could not be measured, and why."""
        return self.add(Figure(system, metric, None, detail=detail, reason=reason))

    def find(self, system: str, metric: str, detail: str | None = None) -> Figure | None:
        """The first measured figure matching system/metric (and detail if given)."""
        for f in self.figures:
            same = f.system == system and f.metric == metric
            if same and f.measured and (detail is None or f.detail == detail):
                return f
        return None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @contextmanager
    def guarded(self, system: str, metrics: list[str], detail: str = "") -> Iterator[None]:
        """Run a measurement; on failure record every one of ``metrics`` as not measured.

        A measurement that fails must not stop the others, and must not leave a gap without
        a reason in the report.
        """
        try:
            yield
        except NotMeasured as e:
            for m in metrics:
                self.not_measured(system, m, str(e), detail)
        except Exception as e:  # the reason goes into the report; the traceback into the log
            log.exception("%s measurement failed", system)
            for m in metrics:
                self.not_measured(system, m, f"failed: {type(e).__name__}: {e}", detail)


def ratio(a: Figure | None, b: Figure | None) -> float | None:
    """a / b when both were measured and b is non-zero."""
    if a is None or b is None or a.value is None or not b.value:
        return None
    return a.value / b.value
