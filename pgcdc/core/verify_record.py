"""The record of ``cdc verify``'s last pass, which ``cdc status`` shows.

``cdc verify`` (a one-off run, or each pass of ``cdc verify --every``) writes it into the
reader's state topic under :func:`state_key` (``<database>/<slot>#verify``), beside the
slot's own records, and ``cdc status`` reads it there with the rest of the state: no
process has to be asked, and the record outlives the one that wrote it. Each pass replaces
the one before. Standard library only: the writer (:mod:`pgcdc.verify`) and the reader
(:mod:`cdc.status`) share this one definition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

FORMAT = 1  # the record's format version, written as "v"


class Outcome(StrEnum):
    """What a pass (or one table on one follower) found."""

    CLEAN = "clean"  # every follower equals PostgreSQL
    DRIFT = "drift"  # missing, extra or differing keys
    UNSETTLED = "unsettled"  # no drift, but keys that kept changing had no verdict
    FAILED = "failed"  # the pass stopped: a server could not be read, a fence timed out


KINDS = ("missing", "extra", "differ", "unsettled")


def state_key(database: str, slot: str) -> bytes:
    """The record's key in the reader's state topic."""
    return f"{database}/{slot}#verify".encode()


@dataclass(frozen=True)
class Check:
    """One table against one follower in a pass."""

    table: str
    follower: str  # "cache" or "search"
    rows_checked: int  # keys compared (PostgreSQL's and the follower's, together)
    snapshot_lsn: str  # the fence LSN of the PostgreSQL snapshot read first
    finished_at: float  # Unix seconds
    counts: dict[str, int] = field(default_factory=dict)  # KINDS -> keys of that kind
    examples: dict[str, list[str]] = field(default_factory=dict)  # KINDS -> a few keys

    @property
    def outcome(self) -> Outcome:
        if any(self.counts.get(k) for k in ("missing", "extra", "differ")):
            return Outcome.DRIFT
        return Outcome.UNSETTLED if self.counts.get("unsettled") else Outcome.CLEAN

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "follower": self.follower,
            "outcome": self.outcome.value,
            "rows_checked": self.rows_checked,
            **{k: self.counts.get(k, 0) for k in KINDS},
            "examples": {k: v for k, v in self.examples.items() if v},
            "snapshot_lsn": self.snapshot_lsn,
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Check:
        return cls(
            table=d["table"],
            follower=d["follower"],
            rows_checked=int(d["rows_checked"]),
            snapshot_lsn=d["snapshot_lsn"],
            finished_at=float(d["finished_at"]),
            counts={k: int(d.get(k, 0)) for k in KINDS},
            examples={k: list(v) for k, v in (d.get("examples") or {}).items()},
        )


@dataclass(frozen=True)
class VerifyPass:
    """One pass of ``cdc verify``: every table and follower it checked, or why it failed."""

    started_at: float  # Unix seconds
    finished_at: float
    checks: tuple[Check, ...] = ()
    error: str | None = None  # the pass failed: the one line ``cdc verify`` printed
    every_s: float | None = None  # ``--every``'s interval; None: a one-off run
    number: int = 1  # the pass's number in its ``--every`` run

    @property
    def outcome(self) -> Outcome:
        if self.error is not None:
            return Outcome.FAILED
        found = {c.outcome for c in self.checks}
        for outcome in (Outcome.DRIFT, Outcome.UNSETTLED):
            if outcome in found:
                return outcome
        return Outcome.CLEAN

    @property
    def rows_checked(self) -> int:
        return sum(c.rows_checked for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": FORMAT,
            "outcome": self.outcome.value,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_s": round(self.finished_at - self.started_at, 3),
            "rows_checked": self.rows_checked,
            "every_s": self.every_s,
            "number": self.number,
            "error": self.error,
            "checks": [c.to_dict() for c in self.checks],
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VerifyPass:
        if d.get("v") != FORMAT:
            raise ValueError(f"verify record of format {d.get('v')!r}, not {FORMAT}")
        every = d.get("every_s")
        return cls(
            started_at=float(d["started_at"]),
            finished_at=float(d["finished_at"]),
            checks=tuple(Check.from_dict(c) for c in d.get("checks") or ()),
            error=d.get("error"),
            every_s=None if every is None else float(every),
            number=int(d.get("number", 1)),
        )

    @classmethod
    def from_json(cls, data: bytes) -> VerifyPass:
        """The record written by :meth:`to_json`; ValueError for anything else."""
        try:
            return cls.from_dict(json.loads(data))
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"not a verify record ({type(e).__name__}: {e})") from e
