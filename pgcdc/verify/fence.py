"""The fence: when a difference between PostgreSQL and a follower is drift.

The rule (stated in full in :mod:`pgcdc.verify`): PostgreSQL is read in a snapshot taken
below WAL position ``L``; the follower is read once its watermark has reached ``L``. Then a
key's states on the two sides are judged by :func:`judge`:

- equal → ``equal``;
- the follower's version (the commit LSN of the change it holds, or of its delete's
  tombstone) is above ``L`` → ``ahead``: the key changed after the snapshot, look again;
- else the follower lacks the row → ``missing``; holds a row PostgreSQL lacks → ``extra``;
  holds another row → ``differs``.

A first-pass candidate, and a key a re-check finds ``ahead``, is read once more from
PostgreSQL in a snapshot taken right after the follower's read: if the follower holds what PostgreSQL holds then, it is ``equal`` (equal
rows are never drift, whatever the versions). A key a load keeps changing is then left only
the few milliseconds between the two reads to change, instead of the follower's lag.

A key is reported as drift only when ``confirmations`` fenced re-checks in a row, each in a
fresh snapshot, judge it so (:class:`Settling`): one read can still catch a change in
flight that leaves no version behind (a delete applied to OpenSearch between the snapshot
and the read), two in a row cannot. A key not confirmed after every re-check is
``unsettled``, never drift.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Verdict(StrEnum):
    EQUAL = "equal"
    AHEAD = "ahead"  # changed after the snapshot: not drift, checked again
    MISSING = "missing"
    EXTRA = "extra"
    DIFFERS = "differs"


def fenced(watermark: int | None, snapshot_lsn: int) -> bool:
    """Whether a follower with this watermark holds every change the snapshot sees."""
    return watermark is not None and watermark >= snapshot_lsn


def judge(
    leader: int | None, follower: int | None, follower_version: int | None, snapshot_lsn: int
) -> Verdict:
    """One key's verdict from its row digest on each side (None: no row) and the follower's
    version for it (None: none held), read behind the fence of a snapshot at ``snapshot_lsn``."""
    if leader == follower:
        return Verdict.EQUAL
    if follower_version is not None and follower_version > snapshot_lsn:
        return Verdict.AHEAD
    if follower is None:
        return Verdict.MISSING
    if leader is None:
        return Verdict.EXTRA
    return Verdict.DIFFERS


CONFIRMATIONS = 2  # fenced drift verdicts in a row that make a key drift


class Settling:
    """Candidate keys between fenced re-checks: each one's run of drift verdicts in a row.

    ``record`` takes one re-check's verdict for a pending key: ``equal`` clears it, ``ahead``
    restarts its run, a drift verdict extends it and, at ``confirmations``, makes it drift
    (of the kind last judged). What is still pending when the re-checks run out is
    unsettled.
    """

    def __init__(self, keys: Iterable[str], confirmations: int = CONFIRMATIONS) -> None:
        if confirmations < 1:
            raise ValueError("confirmations must be at least 1")
        self.confirmations = confirmations
        self.runs: dict[str, int] = dict.fromkeys(keys, 0)
        self.drift: dict[str, Verdict] = {}
        self.cleared: set[str] = set()

    @property
    def pending(self) -> set[str]:
        return set(self.runs)

    def record(self, key: str, verdict: Verdict) -> None:
        """One fenced re-check's verdict for pending ``key``."""
        if verdict == Verdict.EQUAL:
            del self.runs[key]
            self.cleared.add(key)
        elif verdict == Verdict.AHEAD:
            self.runs[key] = 0
        else:
            self.runs[key] += 1
            if self.runs[key] >= self.confirmations:
                del self.runs[key]
                self.drift[key] = verdict
