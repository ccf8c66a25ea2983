"""The demo's screen: a rich Live layout on a terminal, periodic plain lines otherwise."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.layout import Layout
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from demo.monitor import Sample
from demo.sample import DOCUMENTS_CATEGORY, SEARCH_WORD
from pgcdc.core.contract import CACHE_JOB, JOBS


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def fmt_lsn(v: int | None) -> str:
    return "–" if v is None else f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"


def fmt_int(v: int | None) -> str:
    return "–" if v is None else f"{v:,}"


@dataclass
class View:
    """Everything the screen shows besides the latest sample."""

    phase: str = "starting"
    started: float = field(default_factory=time.monotonic)
    phase_started: float = field(default_factory=time.monotonic)
    events_per_s: float = 0.0
    peak_events_per_s: float = 0.0
    workload: Counter[str] = field(default_factory=Counter)
    transactions: int = 0
    processes: dict[str, str] = field(default_factory=dict)
    notes: deque[str] = field(default_factory=lambda: deque(maxlen=9))


class Screen:
    """Live dashboard (``live=True``) or plain progress lines, one every ``plain_every_s``."""

    def __init__(self, live: bool, console: Console | None = None, plain_every_s: float = 5.0):
        self.console = console or Console()
        self.view = View()
        self.sample: Sample | None = None
        self._live = (
            Live(console=self.console, refresh_per_second=4, screen=False) if live else None
        )
        self._plain_every_s = plain_every_s
        self._last_plain = 0.0
        self._rates: deque[tuple[float, int]] = deque(maxlen=12)

    def __enter__(self) -> Screen:
        if self._live is not None:
            self._live.start()
            self._live.update(self.render())
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.stop()

    def note(self, msg: str) -> None:
        """A line for the message panel (and printed at once without a terminal)."""
        stamp = f"{time.monotonic() - self.view.started:6.1f}s"
        self.view.notes.append(f"{stamp} {msg}")
        if self._live is None:
            self.console.print(
                f"[demo {stamp}] {msg}", markup=False, highlight=False, soft_wrap=True
            )
        else:
            self._live.update(self.render())

    def phase(self, text: str) -> None:
        self.view.phase = text
        self.view.phase_started = time.monotonic()
        self.note(text)

    def update(self, sample: Sample) -> None:
        self.sample = sample
        self._rates.append((sample.at, sample.kafka_total))
        # events/s over the last few seconds, so one slow tick does not make it jump.
        (t0, n0), (t1, n1) = self._rates[0], self._rates[-1]
        self.view.events_per_s = (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
        self.view.peak_events_per_s = max(self.view.peak_events_per_s, self.view.events_per_s)
        if self._live is not None:
            self._live.update(self.render())
        elif sample.at - self._last_plain >= self._plain_every_s:
            self._last_plain = sample.at
            self.console.print(self.plain_line(), markup=False, highlight=False, soft_wrap=True)

    # -- plain ---------------------------------------------------------------------------

    def plain_line(self) -> str:
        s, v = self.sample, self.view
        if s is None:
            return f"[demo] {v.phase}"
        followers = " ".join(
            f"{job}: behind={fmt_int(s.behind(job))} wm={fmt_lsn(s.watermark.get(job))}"
            for job in JOBS
        )
        hits = "–" if s.search_total is None else str(s.search_total)
        docs = "–" if s.documents_total is None else str(s.documents_total)
        return (
            f"[demo {time.monotonic() - v.started:6.1f}s] {v.phase} | {v.events_per_s:,.0f} ev/s "
            f"| kafka={s.kafka_total:,} slot_lag={fmt_bytes(s.slot_lag_bytes)} | {followers} "
            f"| search '{SEARCH_WORD}'={hits} | documents '{DOCUMENTS_CATEGORY}'={docs} "
            f"| changes={sum(v.workload.values()):,}"
        )

    # -- live ----------------------------------------------------------------------------

    def render(self) -> Layout:
        v = self.view
        layout = Layout()
        layout.split_column(
            Layout(self._header(), name="header", size=3),
            Layout(name="body", ratio=1),
            Layout(Panel("\n".join(v.notes), title="progress"), name="notes", size=11),
        )
        layout["body"].split_row(
            Layout(Group(self._pipeline_table(), self._workload_table()), ratio=3),
            Layout(Group(self._search_panel(), self._documents_panel()), ratio=2),
        )
        return layout

    def _header(self) -> Panel:
        v = self.view
        since = time.monotonic() - v.phase_started
        t = Text.assemble(
            ("PostgreSQL → Kafka → Spark → Redis + OpenSearch", "bold"),
            f"   {time.monotonic() - v.started:5.0f}s   ",
            (v.phase, "cyan"),
            f" ({since:.0f}s)",
        )
        return Panel(t)

    def _pipeline_table(self) -> Table:
        s, v = self.sample, self.view
        t = Table(title="pipeline", expand=True, title_justify="left")
        t.add_column("stage")
        t.add_column("position", justify="right")
        t.add_column("lag", justify="right")
        t.add_column("state")
        if s is None:
            return t
        t.add_row(
            "PostgreSQL WAL",
            fmt_lsn(s.wal_lsn),
            "",
            "",
        )
        t.add_row(
            "reader → Kafka (slot)",
            fmt_lsn(s.flush_lsn),
            fmt_bytes(s.slot_lag_bytes),
            v.processes.get("reader", "") + (" (slot active)" if s.slot_active else ""),
        )
        t.add_row(
            "Kafka table topics",
            f"{s.kafka_total:,} records",
            "",
            f"{v.events_per_s:,.0f} events/s (peak {v.peak_events_per_s:,.0f})",
        )
        for job in JOBS:
            behind = s.behind(job)
            t.add_row(
                f"Kafka → {'Redis' if job == CACHE_JOB else 'OpenSearch'} ({job})",
                f"wm {fmt_lsn(s.watermark.get(job))}",
                f"{fmt_int(behind)} events / {fmt_bytes(s.watermark_lag_bytes(job))}",
                v.processes.get(job, ""),
            )
        for e in s.errors[-2:]:
            t.add_row("[red]error[/]", "", "", f"[red]{e[:90]}[/]")
        return t

    def _workload_table(self) -> Table:
        v = self.view
        t = Table(title="live workload (rows changed)", expand=True, title_justify="left")
        kinds = ("insert", "update", "delete", "key change")
        for k in (*kinds, "transactions"):
            t.add_column(k, justify="right")
        t.add_row(*(f"{v.workload.get(k, 0):,}" for k in kinds), f"{v.transactions:,}")
        return t

    def _search_panel(self) -> Panel:
        s = self.sample
        title = f"search: products matching '{SEARCH_WORD}'"
        if s is None or s.search_total is None:
            return Panel("(index not created yet)", title=title)
        t = Table(expand=True, box=None)
        t.add_column("id", justify="right")
        t.add_column("title")
        t.add_column("price", justify="right")
        for h in s.search_hits:
            t.add_row(h.id, h.title[:40], h.price)
        return Panel(Group(Text(f"{s.search_total:,} hits", style="bold"), t), title=title)

    def _documents_panel(self) -> Panel:
        s = self.sample
        title = f"joined documents: products in category '{DOCUMENTS_CATEGORY}'"
        if s is None or s.documents_total is None:
            return Panel("(index not created yet)", title=title)
        t = Table(expand=True, box=None)
        t.add_column("id", justify="right")
        t.add_column("title")
        t.add_column("category")
        t.add_column("stock", justify="right")
        for h in s.documents_hits:
            t.add_row(h.id, h.title[:30], h.category, fmt_int(h.total_stock))
        total = Text(f"{s.documents_total:,} products", style="bold")
        return Panel(Group(total, t), title=title)
