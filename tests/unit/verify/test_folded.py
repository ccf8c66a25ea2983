"""``cdc verify`` folded inside the stores (:func:`pgcdc.verify.run.verify_folded`): only the
buckets whose folds differ are read row by row, and their keys are judged as unfolded ones.

The fakes fold with the real digest (:mod:`pgcdc.core.row_digest`); the stores' own folds (the
Lua script, the aggregation) are checked against it on the real servers in
``tests/integration/test_verify_folds.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from pgcdc.core.row_digest import bucket, digest, fold_docs, key_hash
from pgcdc.verify.run import FoldingFollower, verify_folded, verify_pass_table

pytestmark = pytest.mark.unit

Doc = Mapping[str, Any]


@dataclass(frozen=True)
class Snap:
    lsn: int
    rows: Mapping[str, Doc]


@dataclass(frozen=True)
class LeaderFolds:
    lsn: int
    folds: Mapping[int, Sequence[int]]
    rows: int
    names: Sequence[str]


@dataclass
class Leader:
    rows: dict[str, Doc]
    lsn: int = 100
    buckets_read: list[frozenset[int]] = field(default_factory=list)

    def read(
        self,
        table: str,
        keys: Collection[str] | None = None,
        *,
        on_lsn: Callable[[int], None] | None = None,
    ) -> Snap:
        if on_lsn is not None:
            on_lsn(self.lsn)
        return Snap(self.lsn, {k: v for k, v in self.rows.items() if keys is None or k in keys})

    def fold(
        self, table: str, *, on_start: Callable[[int, Sequence[str]], None] | None = None
    ) -> LeaderFolds:
        names = sorted(next(iter(self.rows.values()), {}))
        if on_start is not None:
            on_start(self.lsn, names)
        return LeaderFolds(self.lsn, fold_docs(self.rows), len(self.rows), names)

    def read_buckets(self, table: str, buckets: frozenset[int]) -> Snap:
        self.buckets_read.append(buckets)
        return Snap(
            self.lsn, {k: v for k, v in self.rows.items() if bucket(key_hash(k)) in buckets}
        )


@dataclass
class Follower:
    held: dict[str, Doc]
    name: str = "cache"
    foldable: bool = True
    asked: list[frozenset[int]] = field(default_factory=list)

    def watermark(self) -> int | None:
        return 1_000

    def digest(self, key: str, doc: Doc) -> int:
        return digest(key, doc)

    def digests(self, table: str) -> dict[str, int]:
        return {k: digest(k, d) for k, d in self.held.items()}

    def read(self, table: str, keys: Collection[str]) -> dict[str, tuple[int | None, int | None]]:
        return {k: (digest(k, self.held[k]), 50) if k in self.held else (None, None) for k in keys}

    def can_fold(self, table: str) -> bool:
        return self.foldable

    def fold(self, table: str, names: Sequence[str]) -> dict[int, list[int]]:
        return fold_docs(self.held)

    def bucket_digests(
        self, table: str, names: Sequence[str], buckets: frozenset[int]
    ) -> dict[str, int]:
        self.asked.append(buckets)
        return {k: digest(k, d) for k, d in self.held.items() if bucket(key_hash(k)) in buckets}


def _rows(n: int) -> dict[str, Doc]:
    return {str(i): {"id": i, "v": f"row {i}"} for i in range(n)}


def test_equal_stores_read_no_row_back() -> None:
    rows = _rows(2_000)
    leader, cache, search = Leader(rows), Follower(dict(rows)), Follower(dict(rows), "search")
    assert isinstance(cache, FoldingFollower)
    results = verify_folded("t", leader, [cache, search])
    assert [r.clean for r in results] == [True, True]
    assert [r.rows_checked for r in results] == [2_000, 2_000]
    assert leader.buckets_read == [] and cache.asked == [] and search.asked == []


def test_drift_is_found_in_the_buckets_that_differ_only() -> None:
    rows = _rows(2_000)
    held = dict(rows)
    del held["7"]  # missing
    held["8"] = {"id": 8, "v": "by hand"}  # differs
    held["extra"] = {"id": -1}  # extra
    leader, cache, search = Leader(rows), Follower(held), Follower(dict(rows), "search")
    got_cache, got_search = verify_folded("t", leader, [cache, search])
    assert (got_cache.missing, got_cache.differ, got_cache.extra) == (["7"], ["8"], ["extra"])
    assert got_search.clean and search.asked == []
    wanted = frozenset(bucket(key_hash(k)) for k in ("7", "8", "extra"))
    assert cache.asked == [wanted] and leader.buckets_read == [wanted]
    assert got_cache.leader_rows == 2_000 and got_cache.follower_rows == 2_000


def test_a_follower_that_cannot_fold_reads_every_row_back() -> None:
    rows = _rows(50)
    held = {**rows, "8": {"id": 8, "v": "by hand"}}
    leader = Leader(rows)
    cache, search = Follower(held), Follower(dict(rows), "search", foldable=False)
    got = verify_pass_table("t", leader, [cache, search])
    assert [r.differ for r in got] == [["8"], []]
    assert leader.buckets_read == [] and cache.asked == []  # the unfolded path: no buckets
    folded = verify_pass_table("t", leader, [cache, Follower(dict(rows), "search")])
    assert [r.differ for r in folded] == [["8"], []] and len(cache.asked) == 1
