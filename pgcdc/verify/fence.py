"""The fence: when a difference between PostgreSQL and a follower is drift.

The rule (stated in full in :mod:`pgcdc.verify`): PostgreSQL is read in a snapshot taken
below WAL position ``L``; the follower is read once its watermark has reached ``L``. Then a
key's states on the two sides are judged by :func:`judge`:

- equal → ``equal``;
- the follower's version (the commit LSN of the change it holds, or of its delete's
  tombstone) is above ``L`` → ``ahead``: the key changed after the snapshot, look again;
- else the follower lacks the row → ``missing``; holds a row PostgreSQL lacks → ``extra``;
  holds another row → ``differs``.

A key is reported as drift only when a fenced re-check in a fresh snapshot judges it so
again (:func:`settle`); one still ``ahead`` after every re-check is ``unsettled``.
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    EQUAL = "equal"
    AHEAD = "ahead"  # changed after the snapshot: not drift, checked again
    MISSING = "missing"
    EXTRA = "extra"
    DIFFERS = "differs"


DRIFT = frozenset((Verdict.MISSING, Verdict.EXTRA, Verdict.DIFFERS))


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
