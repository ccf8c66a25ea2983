"""``cdc status`` for a person: the status mapping of :mod:`cdc.status` as rich tables."""

from __future__ import annotations

import io
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgcdc.core.durations import duration


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} B)"
    return f"{n} B"


def _age(seconds: float | None) -> str:
    """How long ago the watermark last advanced (``-``: never, or not known)."""
    return "-" if seconds is None else f"{seconds:.1f}s ago"


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def _slot_table(slot: Mapping[str, Any], state: Mapping[str, Any] | None) -> Table:
    table = Table(title="Reader", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    rows: list[tuple[str, str]] = [
        ("database", _text(slot.get("database"))),
        ("slot", _text(slot.get("slot"))),
        ("exists", _text(slot.get("exists"))),
        ("active", _text(slot.get("active"))),
        ("wal_status", _text(slot.get("wal_status"))),
        ("server WAL LSN", _text(slot.get("server_wal_lsn"))),
        ("confirmed flush LSN", _text(slot.get("confirmed_flush_lsn"))),
        ("lag", _size(slot.get("lag_bytes"))),
        ("lag (seconds, replay_lag)", _text(slot.get("lag_seconds"))),
        ("retained WAL", _size(slot.get("retained_wal_bytes"))),
    ]
    if state is not None:
        rows += [
            ("phase", _text(state.get("phase"))),
            ("acked LSN", _text(state.get("acked_lsn"))),
            ("last commit acked", _text(state.get("last_commit_lsn"))),
            ("delivery", _text(state.get("delivery"))),
            ("committed in Kafka", _text(state.get("committed"))),
        ]
    for what, value in rows:
        table.add_row(what, value)
    return table


def _topics_table(topics: Mapping[str, Mapping[str, int]]) -> Table:
    table = Table(title="Topics", title_justify="left")
    table.add_column("topic")
    table.add_column("partitions", justify="right")
    table.add_column("records (end offsets)", justify="right")
    for name, ends in topics.items():
        table.add_row(name, str(len(ends)), str(sum(ends.values())))
    return table


def _followers_table(
    followers: Mapping[str, Mapping[str, Any]], dead: Mapping[str, Any] | None
) -> Table:
    """Each job's watermark (every change committed before it is applied *or
    dead-lettered*), how long ago it last advanced, beside the letters it wrote to the
    dead-letter topic."""
    table = Table(title="Followers", title_justify="left")
    table.add_column("job")
    table.add_column("watermark")
    table.add_column("age")
    table.add_column("behind")
    table.add_column("dead-lettered")
    table.add_column("job metrics (spark.job_endpoints)")
    letters = "-" if dead is None or "error" in dead else None
    for job, f in followers.items():
        count = letters or str((dead or {}).get(job, 0))
        if "error" in f:
            table.add_row(job, "[red]unreachable[/red]", "-", escape(f["error"]), count, "-")
        else:
            table.add_row(
                job,
                _text(f.get("watermark")),
                _age(f.get("watermark_age_s")),
                _size(f.get("behind_bytes")),
                count,
                _job(f.get("job")),
            )
    return table


def _snapshots_table(snapshots: list[Mapping[str, Any]]) -> Table:
    table = Table(title="Incremental snapshots", title_justify="left")
    for column in ("table", "rows / estimated", "done", "chunks", "last key", "where", "via"):
        table.add_column(column)
    for s in snapshots:
        est = int(s.get("estimated_rows") or 0)
        rows = int(s.get("rows") or 0)
        done = f"{min(100.0, 100.0 * rows / est):.0f} %" if est else "-"
        table.add_row(
            escape(f"{s['schema']}.{s['table']}"),
            f"{rows} / ~{est}",
            done,
            str(s.get("chunks", 0)),
            escape(",".join(s.get("last_key") or []) or "-"),
            escape(s.get("where") or "-"),
            _text(s.get("via")),
        )
    return table


def _verify_table(verify: Mapping[str, Any]) -> Table:
    """``cdc verify``'s last pass: when, what it found per table and follower."""
    every = verify.get("every_s")
    how = f", pass {verify.get('number')} of --every {duration(every)}" if every else ""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(verify["finished_at"]))
    title = (
        f"Verification: last pass {verify['outcome'].upper()}, finished {at} "
        f"({duration(verify.get('age_s') or 0.0)} ago, took {duration(verify['duration_s'])}"
        f"{how})"
    )
    table = Table(title=escape(title), title_justify="left")
    for column in ("table", "follower", "outcome", "rows checked", "missing", "extra"):
        table.add_column(column)
    for column in ("differ", "unsettled", "snapshot LSN", "examples"):
        table.add_column(column)
    for c in verify.get("checks") or []:
        examples = "; ".join(f"{k} {', '.join(v)}" for k, v in (c.get("examples") or {}).items())
        table.add_row(
            escape(c["table"]),
            c["follower"],
            c["outcome"],
            str(c["rows_checked"]),
            *(str(c.get(k, 0)) for k in ("missing", "extra", "differ", "unsettled")),
            c.get("snapshot_lsn") or "-",
            escape(examples) or "-",
        )
    if verify.get("error"):
        table.add_row("-", "-", "failed", "-", "-", "-", "-", "-", "-", escape(verify["error"]))
    return table


def _job(m: Mapping[str, Any] | None) -> str:
    if not m:
        return "-"
    if "error" in m:
        return escape(f"unreachable: {m['error']}")
    return (
        f"applied {m['applied']}, skipped {m['skipped']}, failed {m['failed']}, "
        f"dead-lettered {m['dead_lettered']}; {m['batches']} batches, "
        f"mean {_text(m['mean_batch_ms'])} ms; lag {_text(m['lag_records'])} records, "
        f"{_size(m['lag_lsn_bytes'])} of WAL"
    )


def render(status: Mapping[str, Any], console: Console) -> None:
    """Print the status: reader, topics, followers, cdc verify's last pass, then warnings
    and problems."""
    console.print(_slot_table(status["slot"], status.get("state")))
    console.print(_topics_table(status.get("topics") or {}))
    if status.get("snapshots"):
        console.print(_snapshots_table(status["snapshots"]))
    if status.get("followers") is not None:
        console.print(_followers_table(status["followers"], status.get("dead_letters")))
    if status.get("verify"):
        console.print(_verify_table(status["verify"]))
    for warning in status.get("warnings") or []:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", markup=True, highlight=False)
    for problem in status.get("problems") or []:
        console.print(f"[red]unhealthy:[/red] {escape(problem)}", markup=True, highlight=False)
    console.print("healthy" if status.get("healthy", True) else "[red]UNHEALTHY[/red]")


def render_text(status: Mapping[str, Any], width: int = 120) -> str:
    """The status as plain-text tables (the caller scrubs secrets before printing)."""
    out = io.StringIO()
    render(status, Console(file=out, width=width, no_color=True, highlight=False))
    return out.getvalue()
