"""The outputs of a run: a rich table on the terminal, JSON, Markdown and a PNG plot.

Ratios put our figures next to the ceilings measured in the same run (PostgreSQL's own
decoding, pg_recvlogical, COPY binary) and next to Debezium Server's; when Debezium was not
measured, next to its published figures, said as such.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from benchmarks.results import BenchRecord, Figure

# Published figures (other machines; for orientation only, never mixed with measured ones).
PUBLISHED = [
    ("Debezium Server", "streaming", "~20k ops/s on 16 vCPU, p99 ~440 ms"),
    ("Debezium Server", "snapshot", "~45k rows/s"),
    ("Sequin", "streaming", "~20k ops/s on 4 vCPU"),
    ("Redpanda Connect", "snapshot", "~210k rows/s on 2 cores"),
]
KNOWN_CEILINGS = (
    "known on this 2-core machine: pgoutput decoding ~700k rows/s (1,000-row txns), ~320k "
    "(single-row); psycopg stream minimal parse ~250k; pg_recvlogical ~145k; COPY binary ~1M"
)


@dataclass(frozen=True)
class Comparison:
    system: str
    metric: str
    detail: str
    value: float
    against: str
    ratio: float


def _same(rec: BenchRecord, system: str, metric: str, detail: str) -> Figure | None:
    return rec.find(system, metric, detail)


def comparisons(rec: BenchRecord) -> list[Comparison]:
    """Ratios of each reader's figures to the ceilings and to the peer."""
    out: list[Comparison] = []
    for f in rec.figures:
        if not f.measured or f.system not in ("ours", "debezium", "debezium-tuned"):
            continue
        assert f.value is not None
        against: list[tuple[str, Figure | None]] = []
        if f.metric == "catch-up events/s":
            against += [
                ("pgoutput decode", _same(rec, "postgres", "pgoutput decode rows/s", f.detail)),
                ("pg_recvlogical", _same(rec, "pg_recvlogical", "pg_recvlogical rows/s", f.detail)),
            ]
        if f.metric.startswith("snapshot rows/s"):
            # The same table size only: COPY of 1M rows is not the ceiling of a 100k snapshot.
            against.append(("COPY binary", _same(rec, "postgres", "COPY binary rows/s", f.detail)))
        if f.system == "ours":
            against.append(("Debezium", _same(rec, "debezium", f.metric, f.detail)))
            against.append(("tuned Debezium", _same(rec, "debezium-tuned", f.metric, f.detail)))
        for label, other in against:
            if other is not None and other.value:
                out.append(Comparison(f.system, f.metric, f.detail, f.value, label,
                                      f.value / other.value))  # fmt: skip
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.3g}"


def _rows(rec: BenchRecord) -> list[tuple[str, str, str, str, str, str]]:
    comps = comparisons(rec)
    rows = []
    for f in rec.figures:
        rel = "; ".join(
            f"{c.ratio:.2f}× {c.against}"
            for c in comps
            if (c.system, c.metric, c.detail) == (f.system, f.metric, f.detail)
        )
        value = _fmt(f.value) if f.measured else f"not measured: {f.reason}"
        rows.append((f.system, f.metric, f.detail, value, f.unit, rel))
    return rows


def print_table(rec: BenchRecord) -> None:
    """The table on the terminal (rich)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"make bench — run {rec.run_id}{' (quick)' if rec.quick else ''}")
    for col in ("system", "metric", "conditions", "value", "unit", "ratio"):
        t.add_column(col, overflow="fold")
    for row in _rows(rec):
        t.add_row(*row)
    console = Console(width=200)
    console.print(t)
    for n in rec.notes:
        console.print(f"• {n}")


def markdown(rec: BenchRecord) -> str:
    """The report as Markdown."""
    lines = [
        f"# Benchmark run {rec.run_id}{' (quick)' if rec.quick else ''}",
        "",
        "Open-loop mixed workload (50% insert, 40% update, 10% delete) on a 10-column row of "
        f"about {rec.environment.get('row_bytes', 0):.0f} bytes. Kafka timestamps are the "
        "broker's LogAppendTime; latency = append time − the event's source commit time.",
        "",
        "| system | metric | conditions | value | unit | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for row in _rows(rec):
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    if throughput_points(rec):
        lines += ["", "![catch-up events/s against transaction size](bench-throughput.png)"]
    lines += ["", "![slot lag and commit→Kafka latency over time](bench.png)"]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in rec.notes]
    lines += ["", "## Reference figures (not measured here)", "", f"- Ceilings {KNOWN_CEILINGS}"]
    lines += [f"- {who}, {what}: {fig}" for who, what, fig in PUBLISHED]
    lines += ["", "## Environment", "", "```", json.dumps(rec.environment, indent=2), "```", ""]
    return "\n".join(lines)


def plot(rec: BenchRecord, path: Path) -> bool:
    """Lag and latency over time as a PNG; False when there is nothing to plot."""
    if not any(s.points for s in rec.series):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lag, ax_lat) = plt.subplots(2, 1, figsize=(11, 7))
    for s in rec.series:
        if not s.points:
            continue
        ax = ax_lag if s.name.endswith("lag") else ax_lat
        xs = [p[0] for p in s.points]
        ys = [p[1] for p in s.points]
        if ax is ax_lat:
            ax.plot(xs, ys, ".", markersize=1, label=s.name, alpha=0.5)
        else:
            ax.plot(xs, ys, label=s.name)
    ax_lag.set_ylabel("slot lag (MiB)")
    ax_lag.set_xlabel("seconds since the reader started streaming")
    ax_lat.set_ylabel("commit→Kafka (ms)")
    ax_lat.set_xlabel("seconds since the reader started streaming")
    ax_lat.set_yscale("log")
    for ax in (ax_lag, ax_lat):
        if ax.get_legend_handles_labels()[0]:  # a run of some groups may plot nothing here
            ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# Catch-up throughput against transaction size: (system, metric) -> plot label.
THROUGHPUT_LINES = (
    ("ours", "catch-up events/s", "ours (pgcdc reader)"),
    ("debezium-tuned", "catch-up events/s", "Debezium Server, tuned"),
    ("debezium", "catch-up events/s", "Debezium Server, defaults"),
    ("pg_recvlogical", "pg_recvlogical rows/s", "pg_recvlogical to a file (ceiling)"),
    ("postgres", "pgoutput decode rows/s", "PostgreSQL pgoutput decoding (ceiling)"),
)


def _txn_rows(detail: str) -> int | None:
    """The transaction size a catch-up figure's conditions name (``…, 100-row txns``)."""
    m = re.search(r"(\d+)-row txns", detail)
    return int(m.group(1)) if m else None


def throughput_points(rec: BenchRecord) -> dict[str, list[tuple[int, float]]]:
    """Per line of :data:`THROUGHPUT_LINES`: (transaction rows, events or rows per second)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for system, metric, label in THROUGHPUT_LINES:
        pts = sorted(
            (n, f.value)
            for f in rec.figures
            if f.system == system and f.metric == metric and f.value is not None
            for n in [_txn_rows(f.detail)]
            if n is not None
        )
        if pts:
            out[label] = pts
    return out


def plot_throughput(rec: BenchRecord, path: Path) -> bool:
    """Catch-up events/s against transaction size, ours beside Debezium and the ceilings,
    as a PNG; False when no catch-up was measured."""
    lines = throughput_points(rec)
    if not lines:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, pts in lines.items():
        style = "--" if "ceiling" in label else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows per transaction")
    ax.set_ylabel("catch-up events/s (ceilings: rows/s)")
    ax.set_title(f"Catch-up throughput, run {rec.run_id} (2 cores shared with the whole stack)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_all(rec: BenchRecord, out_dir: Path) -> dict[str, Path]:
    """Write JSON, Markdown and PNG into ``out_dir``; also copy them as ``latest.*``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = rec.to_json()
    doc["comparisons"] = [c.__dict__ for c in comparisons(rec)]
    paths = {"json": out_dir / "bench.json", "md": out_dir / "bench.md"}
    paths["json"].write_text(json.dumps(doc, indent=2, default=str))
    paths["md"].write_text(markdown(rec))
    png = out_dir / "bench.png"
    if plot(rec, png):
        paths["png"] = png
    tput = out_dir / "bench-throughput.png"
    if plot_throughput(rec, tput):
        paths["throughput.png"] = tput
    latest = out_dir.parent
    for kind, p in paths.items():
        (latest / f"latest.{kind}").write_bytes(p.read_bytes())
    return paths
