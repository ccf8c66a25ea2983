"""What ``cdc verify`` prints: a table for people, one JSON document for machines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgcdc.core.lsn import Lsn
from pgcdc.core.verify_record import Check, VerifyPass
from pgcdc.verify.run import TableResult

EXAMPLES = 5  # example keys shown per kind


def as_json(results: Sequence[TableResult], examples: int = EXAMPLES) -> dict[str, Any]:
    """``{"clean": bool, "drift": bool, "results": [...]}``: per table and follower the
    counts of each kind and up to ``examples`` example keys of each. ``clean``: no drift and
    no unsettled key."""
    return {
        "clean": all(r.clean for r in results),
        "drift": any(r.drift for r in results),
        "results": [
            {
                "table": r.table,
                "follower": r.follower,
                "clean": r.clean,
                "drift": r.drift,
                "leader_rows": r.leader_rows,
                "follower_rows": r.follower_rows,
                **{
                    kind: {"count": len(keys), "examples": keys[:examples]}
                    for kind, keys in _kinds(r)
                },
                "candidates": r.candidates,
                "rechecks": r.rechecks,
                "catch_ups": r.catch_ups,
                "cleared": r.cleared,
                "folded": r.folded,
                "buckets_read": r.buckets_read,
                "seconds": {k: round(v, 3) for k, v in r.seconds.items()},
            }
            for r in results
        ],
    }


def _kinds(r: TableResult) -> list[tuple[str, list[str]]]:
    return [
        ("missing", r.missing),
        ("extra", r.extra),
        ("differ", r.differ),
        ("unsettled", r.unsettled),
    ]


def as_text(results: Sequence[TableResult], examples: int = EXAMPLES) -> str:
    """One line per table and follower, then the example keys of each kind found."""
    head = (
        "table",
        "follower",
        "rows pg",
        "rows follower",
        "missing",
        "extra",
        "differ",
        "unsettled",
    )
    rows = [
        (
            r.table,
            r.follower,
            str(r.leader_rows),
            str(r.follower_rows),
            *(str(len(keys)) for _, keys in _kinds(r)),
        )
        for r in results
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in (head, *rows)
    ]
    for r in results:
        for kind, keys in _kinds(r):
            if keys:
                shown = ", ".join(keys[:examples]) + (" …" if len(keys) > examples else "")
                lines.append(f"{r.table} on {r.follower}: {kind} {shown}")
    unsettled = sum(len(r.unsettled) for r in results)
    if any(r.drift for r in results):
        lines.append("DRIFT found")
    elif unsettled:
        lines.append(f"no drift found, but {unsettled} key(s) kept changing: verify them again")
    else:
        lines.append("clean: every follower equals PostgreSQL")
    return "\n".join(lines) + "\n"


def as_record(
    results: Sequence[TableResult],
    started_at: float,
    finished_at: float,
    *,
    error: str | None = None,
    every_s: float | None = None,
    number: int = 1,
    examples: int = EXAMPLES,
) -> VerifyPass:
    """The pass as ``cdc status`` reads it (:mod:`pgcdc.core.verify_record`)."""
    checks = tuple(
        Check(
            table=r.table,
            follower=r.follower,
            rows_checked=r.rows_checked,
            snapshot_lsn=str(Lsn(r.snapshot_lsn)) if r.snapshot_lsn is not None else "",
            finished_at=r.finished_at or finished_at,
            counts={kind: len(keys) for kind, keys in _kinds(r)},
            examples={kind: keys[:examples] for kind, keys in _kinds(r) if keys},
        )
        for r in results
    )
    return VerifyPass(started_at, finished_at, checks, error, every_s, number)
