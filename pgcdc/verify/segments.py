"""Key ranges: a segment of a table's key space, open at both ends.

Keys are document ids (:func:`sinks.base.key_id`) compared in code-point order, the one order
every side can range over. ``Segment(None, None)`` is the whole table; ``lo`` is inclusive,
``hi`` exclusive, and ``None`` leaves that end open, so a key below the first boundary or
above the last (a new row, an extra follower key) always falls in some segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Segment:
    """Keys ``k`` with ``lo <= k < hi``; ``None`` leaves an end open."""

    lo: str | None = None
    hi: str | None = None

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        return (self.lo is None or key >= self.lo) and (self.hi is None or key < self.hi)

    def label(self) -> str:
        """``[lo, hi)`` with ``-inf``/``+inf`` for open ends."""
        lo = "-inf" if self.lo is None else repr(self.lo)
        hi = "+inf" if self.hi is None else repr(self.hi)
        return f"[{lo}, {hi})"


def split(segment: Segment, sorted_keys: Sequence[str], parts: int) -> list[Segment]:
    """``segment`` cut into at most ``parts`` adjacent segments holding about as many of
    ``sorted_keys`` (the keys inside it, sorted, without repeats) each. The pieces cover
    ``segment`` exactly: the first keeps its ``lo``, the last its ``hi``."""
    if parts < 2:
        raise ValueError("a segment is split into at least 2 parts")
    inside = [k for k in sorted_keys if k in segment]
    bounds: list[str] = []
    for i in range(1, parts):
        at = (i * len(inside)) // parts
        if not 0 < at < len(inside):
            continue
        cut = inside[at]
        if (not bounds or cut > bounds[-1]) and (segment.lo is None or cut > segment.lo):
            bounds.append(cut)
    edges: list[str | None] = [segment.lo, *bounds, segment.hi]
    return [Segment(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]
