"""A segment folded into ``(count, hash)``: the same on both sides exactly when (but for a
64-bit collision) both hold the same rows.

Each row's digest is :func:`pgcdc.core.row_digest.digest` (60 bits); the fold is the count
and the sum of digests modulo 2**64, so it does not depend on the order rows are read in (a
Redis ``SCAN``, an OpenSearch scroll and a PostgreSQL scan each have their own) and two
folds of disjoint segments add up to the fold of their union.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Fold:
    """How many rows a segment holds and the sum of their digests (mod 2**64)."""

    count: int = 0
    total: int = 0

    def __add__(self, other: Fold) -> Fold:
        return Fold(self.count + other.count, (self.total + other.total) & _MASK)


def fold(digests: Iterable[int]) -> Fold:
    """The fold of rows with these digests."""
    count = total = 0
    for d in digests:
        count += 1
        total += d
    return Fold(count, total & _MASK)
