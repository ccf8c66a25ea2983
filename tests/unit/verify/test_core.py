"""cdc verify's pure parts: segments, folds, bisection, the fence rule and the settle loop.

The bisection is checked against a plain key-by-key diff on generated tables (Hypothesis),
with thresholds small enough that segments are split and counted. The settle loop runs
against in-memory sides whose rows change between reads, the way a live load changes them.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.core.errors import VerifyError
from pgcdc.core.row_digest import digest_of_canonical as row_digest
from pgcdc.verify.bisect import MemorySide, compare
from pgcdc.verify.fence import Settling, Verdict, fenced, judge
from pgcdc.verify.fold import Fold, fold
from pgcdc.verify.report import as_json, as_text
from pgcdc.verify.run import TableResult, verify_followers, verify_table, wait_fenced
from pgcdc.verify.segments import Segment, split

pytestmark = pytest.mark.unit


# --- segments -----------------------------------------------------------------------------


def test_a_segment_is_open_at_both_ends_and_half_open_inside() -> None:
    whole = Segment()
    assert "" in whole and "\U0010ffff" in whole
    s = Segment("b", "d")
    assert "b" in s and "c" in s and "d" not in s and "a" not in s
    assert Segment(None, "b").label() == "[-inf, 'b')"


@given(st.lists(st.text(max_size=4), unique=True), st.integers(2, 9))
def test_split_covers_the_segment_exactly_without_overlap(keys: list[str], parts: int) -> None:
    keys.sort()
    pieces = split(Segment(), keys, parts)
    assert pieces[0].lo is None and pieces[-1].hi is None
    for a, b in itertools.pairwise(pieces):
        assert a.hi == b.lo and a.hi is not None
        assert b.lo is not None and (a.lo is None or a.lo < b.lo)
    for k in keys:
        assert sum(k in p for p in pieces) == 1
    if len(keys) >= parts:
        assert len(pieces) == parts


def test_split_of_an_inner_segment_keeps_its_ends() -> None:
    keys = [str(i) for i in range(100, 200)]
    pieces = split(Segment("120", "160"), keys, 4)
    assert pieces[0].lo == "120" and pieces[-1].hi == "160"
    assert len(pieces) == 4


# --- folds ----------------------------------------------------------------------------------


def test_a_fold_ignores_order_and_adds_up() -> None:
    digests = [row_digest(str(i), b"row %d" % i) for i in range(50)]
    assert fold(digests) == fold(reversed(digests))
    assert fold(digests[:20]) + fold(digests[20:]) == fold(digests)
    assert fold([]) == Fold(0, 0)
    assert 0 <= fold(digests).total < 1 << 64


def test_a_digest_tells_key_and_row_apart() -> None:
    assert row_digest("1", b"x") != row_digest("2", b"x")
    assert row_digest("1", b"x") != row_digest("1", b"y")


# --- bisection ------------------------------------------------------------------------------

tables = st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 3), max_size=60)


@settings(max_examples=150, deadline=None)
@given(tables, tables, st.integers(1, 6), st.integers(2, 5))
def test_bisection_finds_exactly_what_a_row_diff_finds(
    leader: dict[str, int], follower: dict[str, int], threshold: int, factor: int
) -> None:
    # A side holds each row's digest, which covers its key (row_digest): rows of different
    # keys never fold alike.
    a = {k: row_digest(k, bytes([v])) for k, v in leader.items()}
    b = {k: row_digest(k, bytes([v])) for k, v in follower.items()}
    found = compare(MemorySide(a), MemorySide(b), threshold=threshold, factor=factor)
    assert found.missing == leader.keys() - follower.keys()
    assert found.extra == follower.keys() - leader.keys()
    assert found.differ == {k for k in leader.keys() & follower.keys() if leader[k] != follower[k]}


def test_bisection_splits_big_segments_and_downloads_only_differing_ones() -> None:
    leader = {f"{i:05d}": i for i in range(10_000)}
    follower = dict(leader)
    follower["04242"] = -1
    del follower["00007"]
    follower["99999"] = 5
    found = compare(MemorySide(leader), MemorySide(follower), threshold=100, factor=8)
    assert (found.missing, found.extra, found.differ) == ({"00007"}, {"99999"}, {"04242"})
    assert found.segments_split >= 2  # the path that splits was taken
    assert found.rows_compared < 1_000  # rows were diffed only in small differing segments


def test_equal_sides_fold_once() -> None:
    same = {str(i): i for i in range(1000)}
    found = compare(MemorySide(same), MemorySide(dict(same)), threshold=10)
    assert found.segments_folded == 1 and found.rows_compared == 0
    assert not found.kind_of()


# --- the fence rule -------------------------------------------------------------------------


def test_the_fence_needs_the_watermark_at_or_past_the_snapshot() -> None:
    assert fenced(100, 100) and fenced(101, 100)
    assert not fenced(99, 100) and not fenced(None, 100)


@pytest.mark.parametrize(
    ("leader", "follower", "version", "verdict"),
    [
        (1, 1, 50, Verdict.EQUAL),
        (None, None, None, Verdict.EQUAL),
        (1, 2, 101, Verdict.AHEAD),  # the follower holds a change newer than the snapshot
        (1, None, 101, Verdict.AHEAD),  # deleted after the snapshot (a tombstone's version)
        (None, 2, 101, Verdict.AHEAD),  # inserted after the snapshot
        (1, 2, 100, Verdict.DIFFERS),  # at the snapshot's LSN: the snapshot saw it
        (1, 2, 7, Verdict.DIFFERS),
        (1, None, None, Verdict.MISSING),
        (1, None, 7, Verdict.MISSING),
        (None, 2, None, Verdict.EXTRA),
        (None, 2, 7, Verdict.EXTRA),
    ],
)
def test_judge(
    leader: int | None, follower: int | None, version: int | None, verdict: Verdict
) -> None:
    assert judge(leader, follower, version, 100) is verdict


# --- the settle loop, against sides that change between reads -------------------------------


@dataclass
class Read:
    lsn: int
    rows: Mapping[str, Mapping[str, Any]]


@dataclass
class FakeLeader:
    """Snapshots in order: each read returns the next one (the last one repeats)."""

    snapshots: list[Read]
    reads: int = 0

    def read(self, table: str, keys: Collection[str] | None = None) -> Read:
        snap = self.snapshots[min(self.reads, len(self.snapshots) - 1)]
        self.reads += 1
        if keys is None:
            return snap
        return Read(snap.lsn, {k: v for k, v in snap.rows.items() if k in keys})


@dataclass
class FakeFollower:
    """Rows (key → (row, version)) the follower holds, one state per read of candidates."""

    first: dict[str, tuple[Mapping[str, Any], int]]
    later: list[dict[str, tuple[Mapping[str, Any], int | None]]] = field(default_factory=list)
    mark: int | None = 1_000
    name: str = "fake"
    reads: int = 0

    def watermark(self) -> int | None:
        return self.mark

    def digest(self, key: str, doc: Mapping[str, Any]) -> int:
        return row_digest(key, repr(sorted(doc.items())).encode())

    def digests(self, table: str) -> dict[str, int]:
        return {k: self.digest(k, row) for k, (row, _) in self.first.items()}

    def read(self, table: str, keys: Collection[str]) -> dict[str, tuple[int | None, int | None]]:
        state = self.later[min(self.reads, len(self.later) - 1)]
        self.reads += 1
        out: dict[str, tuple[int | None, int | None]] = {}
        for k in keys:
            row, version = state.get(k, (None, None))
            out[k] = (None if row is None else self.digest(k, row), version)
        return out


def _rows(n: int) -> dict[str, dict[str, Any]]:
    return {str(i): {"v": i} for i in range(n)}


def test_real_drift_is_confirmed_by_a_fenced_recheck() -> None:
    pg = _rows(20)
    held = {k: (v, 5) for k, v in pg.items() if k != "3"}
    held["7"] = ({"v": -7}, 5)
    held["99"] = ({"v": 99}, 5)
    leader = FakeLeader([Read(100, pg)])
    follower = FakeFollower(held, [held])
    result = verify_table("t", leader, follower, threshold=4, factor=3)
    assert (result.missing, result.extra, result.differ) == (["3"], ["99"], ["7"])
    assert result.rechecks == 2 and result.candidates == 3 and result.cleared == 0
    # The whole table, the candidates right after the follower's read, then two fresh
    # snapshots confirm each key.
    assert leader.reads == 4
    assert result.drift and not result.clean


def test_a_key_that_changed_after_the_snapshot_is_not_drift() -> None:
    # The first pass sees key 2 differ (the follower is ahead: a newer change of it landed
    # after the snapshot); PostgreSQL read right after the follower holds the same change.
    before = _rows(5)
    after = {**before, "2": {"v": 22}}
    held = {k: (v, 5) for k, v in after.items()}
    held["2"] = ({"v": 22}, 150)
    leader = FakeLeader([Read(100, before), Read(200, after)])
    follower = FakeFollower(held, [held])
    result = verify_table("t", leader, follower)
    assert result.clean and result.candidates == 1 and result.cleared == 1
    assert result.catch_ups == 1 and result.rechecks == 0  # settled without a fenced wait


def test_a_hot_key_is_settled_by_a_read_right_after_the_followers() -> None:
    # Key 4 changes faster than the follower's lag: each fenced re-check finds the follower
    # ahead of the snapshot (version 10**9). PostgreSQL read again right after the follower
    # holds the same row: equal, so not drift and not unsettled.
    pg = _rows(5)
    now = {**pg, "4": {"v": 40}}
    held = {k: (v, 5) for k, v in now.items()}
    held["4"] = ({"v": 40}, 10**9)
    leader = FakeLeader([Read(100, pg), Read(100, pg), Read(200, pg), Read(300, now)])
    follower = FakeFollower(held, [held])
    result = verify_table("t", leader, follower)
    assert result.clean and result.cleared == 1
    assert result.catch_ups == 2 and result.rechecks == 1  # the catch-up path was taken


def test_a_key_still_changing_is_unsettled_not_drift() -> None:
    pg = _rows(5)
    moving = {k: (v, 5) for k, v in pg.items()}
    moving["4"] = ({"v": 40}, 10**9)  # always newer than any snapshot here
    leader = FakeLeader([Read(100, pg), Read(200, pg), Read(300, pg), Read(400, pg)])
    follower = FakeFollower(moving, [moving])
    result = verify_table("t", leader, follower, attempts=3)
    assert result.unsettled == ["4"] and not (result.missing or result.extra or result.differ)
    assert result.rechecks == 3 and result.catch_ups == 4 and not result.clean


def test_a_change_in_flight_that_leaves_no_version_is_not_drift() -> None:
    # Key 1 is deleted after the first re-check's snapshot and OpenSearch applies the delete
    # before it is read (a deleted document keeps no readable version): that re-check sees
    # it missing; the next snapshot no longer holds it either, and the key is cleared.
    pg = _rows(5)
    gone = {k: v for k, v in pg.items() if k != "1"}
    held = {k: (v, 5) for k, v in pg.items()}
    held["1"] = ({"v": -1}, 5)  # differs in the first pass (a change in flight)
    without = {k: (v, 5) for k, v in gone.items()}
    leader = FakeLeader([Read(100, pg), Read(100, pg), Read(200, pg), Read(300, gone)])
    follower = FakeFollower(held, [without, without])
    result = verify_table("t", leader, follower)
    assert result.clean and result.rechecks == 2 and result.cleared == 1


def test_settling_needs_drift_verdicts_in_a_row() -> None:
    s = Settling(["a", "b", "c", "d"], confirmations=2)
    for key, verdicts in {
        "a": [Verdict.DIFFERS, Verdict.DIFFERS],
        "b": [Verdict.MISSING, Verdict.AHEAD, Verdict.MISSING],  # the run starts over
        "c": [Verdict.EXTRA, Verdict.EQUAL],
        "d": [Verdict.AHEAD, Verdict.AHEAD, Verdict.AHEAD],
    }.items():
        for v in verdicts:
            s.record(key, v)
    assert s.drift == {"a": Verdict.DIFFERS}
    assert s.cleared == {"c"}
    assert s.pending == {"b", "d"}
    s.record("b", Verdict.MISSING)
    assert s.drift["b"] is Verdict.MISSING and s.pending == {"d"}
    with pytest.raises(ValueError):
        Settling([], confirmations=0)


def test_a_follower_that_never_reaches_the_snapshot_stops_with_one_line() -> None:
    follower = FakeFollower({}, [{}], mark=50)
    ticks = iter(range(1000))
    with pytest.raises(VerifyError, match=r"fake follower's watermark \(0/32\) did not reach"):
        wait_fenced(follower, 100, 5, clock=lambda: float(next(ticks)), sleep=lambda _: None)
    follower.mark = None
    with pytest.raises(VerifyError, match="none recorded"):
        wait_fenced(follower, 100, 0, clock=lambda: 0.0, sleep=lambda _: None)


def test_waiting_ends_when_the_watermark_passes() -> None:
    marks = iter([None, 90, 120])
    follower = FakeFollower({}, [{}])
    follower.watermark = lambda: next(marks)  # type: ignore[method-assign]
    naps: list[float] = []
    assert wait_fenced(follower, 100, 60, sleep=naps.append) == 120
    assert len(naps) == 2


# --- the report -----------------------------------------------------------------------------


def test_the_report_counts_and_shows_examples() -> None:
    dirty = TableResult("public.t", "cache", 10, 9, missing=[str(i) for i in range(7)])
    clean = TableResult("public.t", "search", 10, 10)
    doc = as_json([dirty, clean])
    assert doc["clean"] is False and doc["drift"] is True
    assert doc["results"][0]["missing"] == {"count": 7, "examples": ["0", "1", "2", "3", "4"]}
    assert doc["results"][1]["clean"] is True
    text = as_text([dirty, clean])
    assert "public.t on cache: missing 0, 1, 2, 3, 4 …" in text
    assert text.rstrip().endswith("DRIFT found")
    assert as_text([clean]).rstrip().endswith("clean: every follower equals PostgreSQL")
    moving = TableResult("public.t", "search", 10, 10, unsettled=["4"])
    assert as_json([moving])["drift"] is False and as_json([moving])["clean"] is False
    assert "no drift found, but 1 key(s) kept changing" in as_text([moving])


def test_every_read_of_the_follower_waits_for_the_fence() -> None:
    pg = _rows(3)
    held = {k: (v, 5) for k, v in pg.items() if k != "0"}
    # Behind the first snapshot: nothing is read.
    behind = FakeFollower(held, [held], mark=50)
    with pytest.raises(VerifyError):
        verify_table("t", FakeLeader([Read(100, pg)]), behind, fence_timeout_s=0)
    assert behind.reads == 0
    # Past the first snapshot, behind the re-check's: the candidate is not judged.
    marks = iter([150, 150])
    follower = FakeFollower(held, [held])
    follower.watermark = lambda: next(marks)  # type: ignore[method-assign]
    leader = FakeLeader([Read(100, pg), Read(200, pg)])
    with pytest.raises(VerifyError):
        verify_table("t", leader, follower, fence_timeout_s=0)
    assert follower.reads == 0


@dataclass
class OverlappingLeader(FakeLeader):
    """Gives the fence LSN first, then holds its rows back until every follower has been
    read: the pass only ends if the followers are read while PostgreSQL still is."""

    followers_read: threading.Barrier | None = None

    def read(  # type: ignore[override]
        self,
        table: str,
        keys: Collection[str] | None = None,
        *,
        on_lsn: Callable[[int], None] | None = None,
    ) -> Read:
        snap = super().read(table, keys)
        if on_lsn is not None:
            on_lsn(snap.lsn)
            assert self.followers_read is not None
            self.followers_read.wait(timeout=10)
        return snap


@dataclass
class CountedFollower(FakeFollower):
    barrier: threading.Barrier | None = None

    def digests(self, table: str) -> dict[str, int]:
        assert self.barrier is not None
        self.barrier.wait(timeout=10)  # every follower and the leader's rows at once
        return super().digests(table)


def test_the_followers_are_read_while_postgresql_is_and_judged_as_one_by_one() -> None:
    pg = _rows(30)
    cache_rows = {k: (v, 5) for k, v in pg.items() if k != "4"}
    search_rows = {**{k: (v, 5) for k, v in pg.items()}, "77": ({"v": 77}, 5)}
    barrier = threading.Barrier(3)  # two followers' reads and the leader's rows
    leader = OverlappingLeader([Read(100, pg)], followers_read=barrier)
    cache = CountedFollower(cache_rows, [cache_rows], name="cache", barrier=barrier)
    search = CountedFollower(search_rows, [search_rows], name="search", barrier=barrier)
    results = verify_followers("t", leader, [cache, search])
    assert not barrier.broken
    got = {r.follower: (r.missing, r.extra, r.differ) for r in results}
    assert got == {"cache": (["4"], [], []), "search": ([], ["77"], [])}
    # The same verdicts as one follower at a time from the same snapshot.
    for follower, result in zip((cache, search), results, strict=True):
        alone = verify_table("t", FakeLeader([Read(100, pg)]), FakeFollower(
            follower.first, follower.later, name=follower.name))  # fmt: skip
        assert (alone.missing, alone.extra, alone.differ) == got[follower.name]
        assert result.snapshot_lsn == 100


def test_no_follower_reads_nothing() -> None:
    assert verify_followers("t", OverlappingLeader([Read(1, {})]), []) == []
