"""One table against one follower: fold and bisect, then settle every candidate behind the
fence (:mod:`pgcdc.verify.fence`). The reading is done by the two readers given; this module
decides and waits, nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pgcdc.core.errors import VerifyError
from pgcdc.core.lsn import Lsn
from pgcdc.core.row_digest import bucket, key_hash
from pgcdc.verify.bisect import FACTOR, THRESHOLD, MemorySide, compare
from pgcdc.verify.fence import CONFIRMATIONS, Settling, Verdict, fenced, judge

# Fenced re-checks at most. Real drift is confirmed in CONFIRMATIONS of them; a key a live
# load keeps changing is seen newer than each snapshot with a chance of about (follower lag
# / time between its changes) a re-check, so a few more settle nearly all of them.
ATTEMPTS = 8


class LeaderRead(Protocol):
    """PostgreSQL's rows of a table in one snapshot, by document id, each the document the
    sinks would be given for it, and the snapshot's fence LSN."""

    @property
    def lsn(self) -> int: ...

    @property
    def rows(self) -> Mapping[str, Mapping[str, Any]]: ...


class Leader(Protocol):
    def read(self, table: str, keys: Collection[str] | None = None) -> LeaderRead:
        """A fresh snapshot of ``table`` (a table id, ``schema.table``); only ``keys``' rows
        if given."""
        ...


class Follower(Protocol):
    name: str  # "cache" or "search"

    def watermark(self) -> int | None:
        """The follower's watermark LSN, or None if none is recorded."""
        ...

    def digest(self, key: str, doc: Mapping[str, Any]) -> int:
        """The digest of ``doc`` as this follower stores it under ``key``."""
        ...

    def digests(self, table: str) -> dict[str, int]:
        """Every row of ``table`` the follower holds: key → digest."""
        ...

    def read(self, table: str, keys: Collection[str]) -> dict[str, tuple[int | None, int | None]]:
        """Each key's (row digest or None, held version LSN or None), read now."""
        ...


@dataclass
class TableResult:
    """What one table's verification against one follower found."""

    table: str
    follower: str
    leader_rows: int = 0
    follower_rows: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)
    candidates: int = 0  # keys the first pass found different
    rechecks: int = 0  # fenced re-checks made
    catch_ups: int = 0  # reads of PostgreSQL right after the follower's, for keys ahead
    cleared: int = 0  # candidates a re-check found equal: not drift
    segments_folded: int = 0
    rows_checked: int = 0  # keys compared: PostgreSQL's and the follower's, together
    snapshot_lsn: int | None = None  # the fence LSN of the first PostgreSQL snapshot
    folded: bool = False  # folded inside the stores (verify_folded), not read back
    buckets_read: int = 0  # buckets whose folds differed, read row by row
    seconds: dict[str, float] = field(default_factory=dict)  # where a folded pass's time went
    finished_at: float = 0.0  # Unix seconds

    @property
    def drift(self) -> bool:
        return bool(self.missing or self.extra or self.differ)

    @property
    def clean(self) -> bool:
        return not (self.drift or self.unsettled)


def wait_fenced(
    follower: Follower,
    lsn: int,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait until ``follower``'s watermark reaches ``lsn``; its watermark, or VerifyError
    after ``timeout_s``."""
    deadline = clock() + timeout_s
    while True:
        mark = follower.watermark()
        if fenced(mark, lsn):
            assert mark is not None
            return mark
        if clock() >= deadline:
            held = "none recorded" if mark is None else str(Lsn(mark))
            raise VerifyError(
                f"the {follower.name} follower's watermark ({held}) did not reach the "
                f"snapshot's LSN {Lsn(lsn)} within {timeout_s:g} s: is its sync job running? "
                "(raise --fence-timeout for a follower far behind)"
            )
        sleep(0.2)


def verify_table(
    table: str,
    leader: Leader,
    follower: Follower,
    *,
    fence_timeout_s: float = 60.0,
    attempts: int = ATTEMPTS,
    confirmations: int = CONFIRMATIONS,
    factor: int = FACTOR,
    threshold: int = THRESHOLD,
    first: LeaderRead | None = None,
    held: Mapping[str, int] | None = None,
) -> TableResult:
    """Compare ``table`` between PostgreSQL and ``follower``; ``first`` is a leader read to
    start from (one snapshot serves every follower's first pass), ``held`` the follower's
    digests already read behind that read's fence (:func:`verify_followers`)."""
    read = first if first is not None else leader.read(table)
    if held is None:
        wait_fenced(follower, read.lsn, fence_timeout_s)
        held = follower.digests(table)
    expected = _digests(follower, read)
    found = compare(
        MemorySide(expected), MemorySide(dict(held)), factor=factor, threshold=threshold
    )
    result = TableResult(table, follower.name, len(expected), len(held))
    result.segments_folded = found.segments_folded
    result.rows_checked = len(expected.keys() | held.keys())
    result.snapshot_lsn = read.lsn
    candidates = found.kind_of()
    result.candidates = len(candidates)
    settled: set[str] = set()
    if candidates:
        # On a live table most candidates are changes in flight that have landed by now:
        # PostgreSQL read again right after the follower's read settles those (equal rows
        # are never drift) before any fenced re-check waits for the follower.
        result.catch_ups += 1
        latest = _digests(follower, leader.read(table, candidates))
        settled = {k for k in candidates if latest.get(k) == held.get(k)}
    settling = Settling((k for k in candidates if k not in settled), confirmations)
    settling.cleared |= settled
    for _ in range(attempts):
        pending = settling.pending
        if not pending:
            break
        again = leader.read(table, pending)
        wait_fenced(follower, again.lsn, fence_timeout_s)
        now = follower.read(table, pending)
        result.rechecks += 1
        expected = _digests(follower, again)
        verdicts: dict[str, Verdict] = {}
        for key in sorted(pending):
            digest, version = now.get(key, (None, None))
            verdicts[key] = judge(expected.get(key), digest, version, again.lsn)
        ahead = {k for k, v in verdicts.items() if v == Verdict.AHEAD}
        if ahead:
            # Newer than the snapshot: does the follower hold what PostgreSQL holds now? A
            # snapshot taken right after the follower's read leaves a hot key a few
            # milliseconds to change, instead of the follower's lag.
            result.catch_ups += 1
            latest = _digests(follower, leader.read(table, ahead))
            for key in ahead:
                if latest.get(key) == now.get(key, (None, None))[0]:
                    verdicts[key] = Verdict.EQUAL
        for key, verdict in verdicts.items():
            settling.record(key, verdict)
    for key, verdict in sorted(settling.drift.items()):
        kinds = {Verdict.MISSING: result.missing, Verdict.EXTRA: result.extra}
        kinds.get(verdict, result.differ).append(key)
    result.unsettled = sorted(settling.pending)
    result.cleared = len(settling.cleared)
    result.finished_at = time.time()
    return result


class StreamingLeader(Leader, Protocol):
    def read(
        self,
        table: str,
        keys: Collection[str] | None = None,
        *,
        on_lsn: Callable[[int], None] | None = None,
    ) -> LeaderRead:
        """As :meth:`Leader.read`; ``on_lsn`` is called with the snapshot's fence LSN as
        soon as it is known, before the rows are read."""
        ...


def verify_pass_table(
    table: str,
    leader: FoldingLeader,
    followers: Sequence[Follower],
    *,
    fence_timeout_s: float = 60.0,
    fold: bool = True,
) -> list[TableResult]:
    """``table`` against every follower: folded inside the stores (:func:`verify_folded`)
    when ``fold`` and every follower's store can, else every row read back
    (:func:`verify_followers`)."""
    folding = [f for f in followers if isinstance(f, FoldingFollower) and f.can_fold(table)]
    if fold and followers and len(folding) == len(followers):
        return verify_folded(table, leader, folding, fence_timeout_s=fence_timeout_s)
    return verify_followers(table, leader, followers, fence_timeout_s=fence_timeout_s)


class FoldingLeader(StreamingLeader, Protocol):
    def fold(
        self, table: str, *, on_start: Callable[[int, Sequence[str]], None] | None = None
    ) -> LeaderFolds:
        """A fresh snapshot of ``table`` folded by bucket; ``on_start`` is given its fence
        LSN and the documents' sorted fields as soon as they are known."""
        ...

    def read_buckets(self, table: str, buckets: frozenset[int]) -> LeaderRead:
        """A fresh snapshot of the rows whose ids fall in ``buckets``."""
        ...


class LeaderFolds(Protocol):
    @property
    def lsn(self) -> int: ...

    @property
    def folds(self) -> Mapping[int, Sequence[int]]: ...

    @property
    def rows(self) -> int: ...

    @property
    def names(self) -> Sequence[str]: ...


@runtime_checkable
class FoldingFollower(Follower, Protocol):
    def can_fold(self, table: str) -> bool:
        """Whether the follower's store folds ``table`` itself."""
        ...

    def fold(self, table: str, names: Sequence[str]) -> Mapping[int, Sequence[int]]:
        """Every row the follower holds folded by bucket (``names``: the documents' sorted
        fields)."""
        ...

    def bucket_digests(
        self, table: str, names: Sequence[str], buckets: frozenset[int]
    ) -> dict[str, int]:
        """Each key the follower holds in ``buckets`` and its row's digest."""
        ...


@dataclass(frozen=True)
class _Rows:
    lsn: int
    rows: Mapping[str, Mapping[str, Any]]


def _differing(a: Mapping[int, Sequence[int]], b: Mapping[int, Sequence[int]]) -> frozenset[int]:
    return frozenset(k for k in a.keys() | b.keys() if list(a.get(k, ())) != list(b.get(k, ())))


def verify_folded(
    table: str,
    leader: FoldingLeader,
    followers: Sequence[FoldingFollower],
    *,
    fence_timeout_s: float = 60.0,
) -> list[TableResult]:
    """``table`` against every follower, each store folding its own rows by bucket
    (:mod:`pgcdc.core.row_digest`): PostgreSQL's rows rendered and folded as they are read,
    each follower's folded inside it behind the snapshot's fence, in a thread of its own,
    while PostgreSQL's are still being read. Only the buckets whose folds differ are read
    row by row (a fresh snapshot, each follower behind its fence), and their keys go through
    :func:`verify_table`'s comparison and fenced re-checks, as every key does unfolded."""
    if not followers:
        return []
    started_at = time.monotonic()
    spent: dict[str, dict[str, float]] = {f.name: {} for f in followers}
    with ThreadPoolExecutor(len(followers), thread_name_prefix="verify-follower") as pool:
        held: list[Future[Mapping[int, Sequence[int]]]] = []

        def behind_fence(
            follower: FoldingFollower, lsn: int, names: Sequence[str]
        ) -> Mapping[int, Sequence[int]]:
            t0 = time.monotonic()
            wait_fenced(follower, lsn, fence_timeout_s)
            t1 = time.monotonic()
            got = follower.fold(table, names)
            spent[follower.name].update(fence_s=t1 - t0, fold_s=time.monotonic() - t1)
            return got

        def started(lsn: int, names: Sequence[str]) -> None:
            held.extend(pool.submit(behind_fence, f, lsn, names) for f in followers)

        first = leader.fold(table, on_start=started)
        leader_s = time.monotonic() - started_at
        folds = [h.result() for h in held]
    differing = [_differing(first.folds, f) for f in folds]
    union = frozenset().union(*differing)
    folded_at = time.monotonic()
    rows = leader.read_buckets(table, union) if union else _Rows(first.lsn, {})
    results = []
    for follower, theirs, buckets in zip(followers, folds, differing, strict=True):
        began = time.monotonic()
        kept: dict[str, int] = {}
        mine: dict[str, Mapping[str, Any]] = {}
        if buckets:
            wait_fenced(follower, rows.lsn, fence_timeout_s)
            kept = follower.bucket_digests(table, first.names, buckets)
            mine = {k: doc for k, doc in rows.rows.items() if bucket(key_hash(k)) in buckets}
        result = verify_table(
            table,
            leader,
            follower,
            fence_timeout_s=fence_timeout_s,
            first=_Rows(rows.lsn, mine),
            held=kept,
        )
        held_rows = sum(f[0] for f in theirs.values())
        result.leader_rows = first.rows
        result.follower_rows = held_rows
        result.rows_checked = max(first.rows, held_rows)
        result.segments_folded = len(first.folds.keys() | theirs.keys())
        result.snapshot_lsn = first.lsn
        result.folded = True
        result.buckets_read = len(buckets)
        result.seconds = {
            "leader_fold": leader_s,
            **{k: v for k, v in spent[follower.name].items()},
            "folds_done": folded_at - started_at,
            "buckets_and_rechecks": time.monotonic() - began,
        }
        results.append(result)
    return results


def verify_followers(
    table: str,
    leader: StreamingLeader,
    followers: Sequence[Follower],
    *,
    fence_timeout_s: float = 60.0,
) -> list[TableResult]:
    """``table`` against every follower from one PostgreSQL snapshot, each follower read
    in a thread of its own as soon as the snapshot's fence LSN is known, while PostgreSQL's
    rows are still being read: the reads wait on three servers at once instead of one after
    another. Then each follower's comparison and re-checks, as :func:`verify_table`."""
    if not followers:
        return []
    with ThreadPoolExecutor(len(followers), thread_name_prefix="verify-follower") as pool:
        held: list[Future[dict[str, int]]] = []

        def behind_fence(follower: Follower, lsn: int) -> dict[str, int]:
            wait_fenced(follower, lsn, fence_timeout_s)
            return follower.digests(table)

        def started(lsn: int) -> None:
            held.extend(pool.submit(behind_fence, f, lsn) for f in followers)

        # A failed read ends the pass once the follower reads it started are done.
        first = leader.read(table, on_lsn=started)
        results = []
        for follower, digests in zip(followers, held, strict=True):
            results.append(
                verify_table(
                    table,
                    leader,
                    follower,
                    fence_timeout_s=fence_timeout_s,
                    first=first,
                    held=digests.result(),
                )
            )
        return results


def _digests(follower: Follower, read: LeaderRead) -> dict[str, int]:
    return {k: follower.digest(k, doc) for k, doc in read.rows.items()}
