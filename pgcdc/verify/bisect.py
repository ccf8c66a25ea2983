"""Bisection: which keys of a table differ between two sides, folding before downloading.

Starting from the whole key space (or given segments), each segment is folded on both sides
(:class:`Side.fold`); equal folds end there. A differing segment that holds more than
``threshold`` rows on either side is split into ``factor`` parts (:func:`.segments.split`)
and each part is looked at the same way; a smaller one is compared row by row
(:class:`Side.digests`). What a side's fold costs is the side's business: here both sides
fold rows read back into memory (:class:`MemorySide`); a store that folds a range itself can
take its place without changing this module.
"""

from __future__ import annotations

import bisect as _bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pgcdc.verify.fold import Fold, fold
from pgcdc.verify.segments import Segment, split

FACTOR = 32  # reladiff's bisection factor
THRESHOLD = 16_384  # rows of a segment compared key by key, at most (reladiff's default)


class Side(Protocol):
    """One side of the comparison: PostgreSQL rendered as the follower stores it, or the
    follower itself."""

    def fold(self, segment: Segment) -> Fold:
        """The segment's ``(count, hash)``."""
        ...

    def keys(self, segment: Segment) -> list[str]:
        """The segment's keys, sorted (where to cut it)."""
        ...

    def digests(self, segment: Segment) -> dict[str, int]:
        """Each key of the segment and its row's digest (:func:`.fold.row_digest`, which
        covers the key: rows of two keys never fold alike)."""
        ...


class MemorySide:
    """A side whose rows (key → digest) are held in memory."""

    def __init__(self, digests: Mapping[str, int]) -> None:
        self._digests = dict(digests)
        self._sorted = sorted(self._digests)

    def _range(self, segment: Segment) -> list[str]:
        lo = 0 if segment.lo is None else _bisect.bisect_left(self._sorted, segment.lo)
        hi = (
            len(self._sorted)
            if segment.hi is None
            else _bisect.bisect_left(self._sorted, segment.hi)
        )
        return self._sorted[lo:hi]

    def fold(self, segment: Segment) -> Fold:
        return fold(self._digests[k] for k in self._range(segment))

    def keys(self, segment: Segment) -> list[str]:
        return self._range(segment)

    def digests(self, segment: Segment) -> dict[str, int]:
        return {k: self._digests[k] for k in self._range(segment)}


@dataclass
class Differences:
    """Keys that differ, by kind, and what it took to find them."""

    missing: set[str] = field(default_factory=set)  # on the leader only
    extra: set[str] = field(default_factory=set)  # on the follower only
    differ: set[str] = field(default_factory=set)  # on both, with different rows
    segments_folded: int = 0
    segments_split: int = 0
    rows_compared: int = 0

    def kind_of(self) -> dict[str, str]:
        """Each differing key and its kind (``missing``, ``extra``, ``differs``)."""
        out = dict.fromkeys(self.missing, "missing")
        out.update(dict.fromkeys(self.extra, "extra"))
        out.update(dict.fromkeys(self.differ, "differs"))
        return out


def compare(
    leader: Side,
    follower: Side,
    segments: list[Segment] | None = None,
    *,
    factor: int = FACTOR,
    threshold: int = THRESHOLD,
) -> Differences:
    """The keys whose rows differ between ``leader`` and ``follower``."""
    if threshold < 1:
        raise ValueError("threshold must be at least 1")
    out = Differences()
    pending = list(segments or [Segment()])
    while pending:
        segment = pending.pop()
        a, b = leader.fold(segment), follower.fold(segment)
        out.segments_folded += 1
        if a == b:
            continue
        if max(a.count, b.count) > threshold:
            keys = sorted(set(leader.keys(segment)) | set(follower.keys(segment)))
            parts = split(segment, keys, factor)
            if len(parts) > 1:
                out.segments_split += 1
                pending.extend(parts)
                continue
        _diff_rows(leader.digests(segment), follower.digests(segment), out)
    return out


def _diff_rows(leader: dict[str, int], follower: dict[str, int], out: Differences) -> None:
    out.rows_compared += len(leader) + len(follower)
    for key, digest in leader.items():
        held = follower.get(key)
        if held is None:
            out.missing.add(key)
        elif held != digest:
            out.differ.add(key)
    out.extra.update(k for k in follower if k not in leader)
