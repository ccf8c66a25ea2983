"""What every follower's writer shares: the change it applies, its versions, its results.

A follower applies batches of already-parsed changes. Each change carries a version derived
from the transaction's commit LSN and the change's position inside the transaction (its
:class:`~pgcdc.core.contract.VersionOrder`), so a follower can refuse anything older than
what it holds: replays and reordering never overwrite a newer value (design guarantee 4).

A batch is reduced to one change per key once. The sync jobs' batches are reduced in each task
(``spark_jobs.reduce.latest_per_key``) and reach :meth:`Sink.apply` with one change per
key; a sink reduces with :func:`reduce_batch` only a batch that repeats a key (a caller
that holds an unreduced batch), see :func:`one_per_key`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, NamedTuple, Protocol, TypeVar

import orjson

from pgcdc.core.contract import PLACEHOLDER_TEXTS, VersionOrder

T = TypeVar("T")


class Outcome(StrEnum):
    """What a follower did with one change."""

    APPLIED = "applied"
    SKIPPED = "skipped"  # a newer version is held, or a newer change of the batch won
    FAILED = "failed"


# What the followers write of a change's whole document, made with it (the direct read's
# native path, spark_jobs.fast_changes, makes them from the record's bytes): the document as
# ``orjson.dumps`` writes it; the Redis follower's hash fields (sinks.cache.hash_fields: each
# column's name then its value's JSON, framed as RESP bulk strings); and the row digest the
# search follower keeps beside it, as ``orjson.dumps(row_digest.stored(key, doc))`` writes it.
# Only for a change whose ``doc`` is split (no unchanged column): each is of ``doc`` whole.
Rendered = tuple[bytes, bytes, bytes]


class WholeDocument(Mapping[str, Any]):
    """A change's whole document as its JSON (its :data:`Rendered` first part), read from it
    only when asked (``orjson.loads``: the same values, as that JSON is ``orjson.dumps`` of
    them). The direct read's native path makes one for each change whose followers' bytes
    it made: the followers write those bytes and ask the document only whether there is one
    and its length, so its values are never made (1.2-1.6 µs a change of that path, measured
    on 30,000 4 kB events). Not a dict: a consumer that needs one asks for it (``dict(doc)``;
    :func:`plain` for JSON)."""

    __slots__ = ("_values", "columns", "json")

    def __init__(self, json: bytes, columns: int) -> None:
        self.json, self.columns = json, columns
        self._values: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any]:
        values = self._values
        if values is None:  # two threads may both read it: the same values
            values = self._values = orjson.loads(self.json)
        return values

    def __getitem__(self, column: str) -> Any:
        return self._read()[column]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return self.columns

    def __repr__(self) -> str:
        return repr(self._read())

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return dict, (self._read(),)  # pickled and copied as the dict it stands for


def plain(value: Any) -> Any:
    """``orjson.dumps``'s ``default``: a :class:`WholeDocument` as its values."""
    if isinstance(value, WholeDocument):
        return value._read()
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class Change:
    """One row change to apply to a follower.

    ``doc`` is the row after the change as JSON-ready values, or None for a delete.
    ``unchanged`` names columns whose value is the unchanged-TOAST placeholder: the follower
    keeps what it already holds for them, and the placeholder itself is never written.
    ``split`` says ``doc`` is already the values to write (no column of ``unchanged``, no
    placeholder in any form: the jobs' ``RowConverter`` split them while decoding), so
    :func:`split_unchanged` takes it as it is instead of checking every column again.
    ``rendered`` is what the followers write of ``doc``, made already (:data:`Rendered`),
    or None: they then make it from ``doc``. ``schema`` is the Debezium value schema ``doc``
    was decoded with, if known: a follower that refuses the document tells by it whether
    the table's shape changed after the change (sinks.search).
    """

    table: str
    key: str
    commit_lsn: int
    order: int
    doc: Mapping[str, Any] | None
    unchanged: frozenset[str] = frozenset()
    split: bool = field(default=False, compare=False)
    rendered: Rendered | None = field(default=None, compare=False)
    schema: Mapping[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.commit_lsn < 0 or self.order < 0:
            raise ValueError(
                f"commit_lsn and order must not be negative (got {self.commit_lsn}, {self.order})"
            )

    @property
    def version_order(self) -> VersionOrder:
        """The exact, unclamped ordering key ``(commit_lsn, order)``."""
        return VersionOrder(self.commit_lsn, self.order)


class ApplyResult(NamedTuple):
    """What a follower did with one change (:class:`Outcome`). ``retryable`` tells a failure
    worth retrying from one that belongs on the dead-letter topic.

    A named tuple: immutable as a frozen dataclass was, and made in half the time (a
    follower makes one a change)."""

    key: str
    table: str
    outcome: Outcome
    reason: str | None = None
    retryable: bool = False

    @classmethod
    def of(
        cls, change: Change, outcome: Outcome, reason: str | None = None, retryable: bool = False
    ) -> ApplyResult:
        """The result for ``change``."""
        return cls(change.key, change.table, outcome, reason, retryable)


class Sink(Protocol):
    """A follower's writer."""

    def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
        """Apply a batch; return one result per change, in the order given.

        A batch normally holds one change per (table, key); one that repeats a key is
        reduced first (:func:`one_per_key`), the older changes ``skipped``.
        """
        ...

    def register_schema(
        self, table: str, value_schema: Mapping[str, Any], since_lsn: int | None = None
    ) -> None:
        """Learn the Debezium value (envelope) schema of ``table``'s events; a sink may use
        it (e.g. to type a new index) or ignore it. Called before changes that use it;
        ``since_lsn`` is the commit LSN of one of them, if known."""
        ...

    def record_watermark(self, job: str, lsn: int) -> None:
        """Record the highest commit LSN fully applied by ``job``; never moves backwards."""
        ...

    def read_watermark(self, job: str) -> int | None:
        """The recorded watermark of ``job``, or None if it never recorded one."""
        ...

    def read_watermark_time(self, job: str) -> float | None:
        """When ``job``'s watermark last advanced (Unix seconds), or None if unknown: a
        follower that stopped advancing while changes wait is stale (``cdc status``)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def key_id(key_payload: Mapping[str, Any]) -> str:
    """Encode a Debezium key payload (field → value, in key-column order) as a document id.

    A single column becomes its value as text (``42`` → ``"42"``, ``"abc"`` → ``"abc"``);
    a composite key becomes a compact JSON array of its values (``[1,"a"]``). The encoding is
    injective for the keys of one table, where every field has one type: different keys
    always give different ids.
    """
    if not key_payload:
        raise ValueError("a key payload needs at least one field")
    values = list(key_payload.values())
    if len(values) == 1:
        only = values[0]
        if isinstance(only, str):
            return only
        if isinstance(only, bool):
            return "true" if only else "false"
        if isinstance(only, int):
            return str(only)
        return _json(only)
    return _json(values)


def _json(value: Any) -> str:
    # Python's json keeps 1 and 1.0 and true apart, writes floats with repr (round-trips),
    # NaN/Infinity as bare tokens that no string can produce, and sorts object keys.
    return json.dumps(_jsonable(value), separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float):
        return value
    raise TypeError(f"key value of type {type(value).__name__} has no id encoding")


def is_placeholder(value: Any) -> bool:
    """True if ``value`` is Debezium's unchanged-TOAST placeholder in any of its forms: the
    text, the placeholder's bytes as base64 or hex, or a one-element array of one of those.

    Records of our reader name their unchanged columns in a header, whatever the value
    (:func:`pgcdc.core.contract` ``HEADER_UNCHANGED``); this is for records from elsewhere,
    and a safety net: a value in one of these forms is never written to a follower.
    """
    if isinstance(value, str):
        return value in PLACEHOLDER_TEXTS
    if isinstance(value, list) and len(value) == 1:
        only = value[0]
        return isinstance(only, str) and only in PLACEHOLDER_TEXTS
    return False


def split_unchanged(change: Change) -> tuple[Mapping[str, Any], frozenset[str]]:
    """The values to write and the columns to keep as held.

    Columns named in ``change.unchanged`` and any column still holding the placeholder are
    left out of the values, so the placeholder can never reach a follower. A change built
    already split (``change.split``) gives its own ``doc`` (shared: not to be modified).
    """
    assert change.doc is not None, "a delete has no values"
    if change.split:
        return change.doc, change.unchanged
    unchanged = change.unchanged
    found: list[str] = []  # placeholders outside ``unchanged``
    values: dict[str, Any] = {}
    for column, value in change.doc.items():
        if column in unchanged:
            continue
        # is_placeholder, inline: this runs for every column of every change.
        if isinstance(value, str):
            if value in PLACEHOLDER_TEXTS:
                found.append(column)
                continue
        elif isinstance(value, list) and is_placeholder(value):
            found.append(column)
            continue
        values[column] = value
    return values, unchanged.union(found) if found else unchanged


@dataclass(frozen=True, slots=True)
class Reduced:
    """A batch with one change per (table, key).

    ``winners`` holds the newest change of each key (input order of first appearance), with
    unchanged-TOAST columns filled from older changes of the same batch where they carried
    values. ``superseded`` holds the input indexes of every other change, and ``index_of``
    maps each winner back to the input index it stands for.
    """

    winners: list[Change]
    index_of: list[int]
    superseded: list[int] = field(default_factory=list)


class OnePerKey(list[Change]):
    """Changes known to hold one change per (table, key): what the native path reduced a
    range's parts to (:class:`spark_jobs.fast_changes.NativeParts`). :func:`one_per_key`
    takes them as they are, with no set of their keys made again by each follower."""

    __slots__ = ()


def one_per_key(changes: Sequence[Change]) -> Reduced:
    """The batch as a sink applies it: one change per (table, key).

    A batch of the sync jobs already is (``latest_per_key`` reduced it, once) and comes back
    as it is: checked, unless it is :class:`OnePerKey`. A batch that repeats a key, from a
    caller that did not reduce it, is reduced here by :func:`reduce_batch`.
    """
    if type(changes) is not OnePerKey and len({(c.table, c.key) for c in changes}) < len(changes):
        return reduce_batch(changes)
    return Reduced(list(changes), list(range(len(changes))))


def reduce_batch(changes: Sequence[Change]) -> Reduced:
    """Keep the newest change per (table, key), ordered by the exact :class:`VersionOrder`;
    of two equal versions (a replay inside one batch) the later one wins.

    An older change's values still count for the newest one's unchanged-TOAST columns
    (:func:`fill_unchanged`): e.g. an UPDATE that wrote a large value and, later in the
    batch, an UPDATE that left it untouched.
    """
    by_key: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(changes):
        by_key.setdefault((c.table, c.key), []).append(i)
    winners: list[Change] = []
    index_of: list[int] = []
    superseded: list[int] = []
    for indexes in by_key.values():
        ordered = sorted(indexes, key=lambda i: changes[i].version_order)  # stable
        winners.append(fill_unchanged([changes[i] for i in ordered]))
        index_of.append(ordered[-1])
        superseded.extend(ordered[:-1])
    return Reduced(winners, index_of, sorted(superseded))


def fill_unchanged(history: Sequence[Change]) -> Change:
    """The last of one key's changes, given oldest first, with its unchanged-TOAST columns
    filled from the older ones where they carried a value since the key's last delete.

    Chooses nothing: the caller has ordered the changes, and the last one is the newest.
    """
    current = history[0]
    for newer in history[1:]:
        current = _fold(current, newer)
    return current


def _fold(older: Change, newer: Change) -> Change:
    if newer.doc is None or older.doc is None:
        return newer
    values, held = split_unchanged(newer)
    if not held:
        return newer
    older_values, _ = split_unchanged(older)
    still_held: set[str] = set()
    merged = dict(values)
    for column in held:
        if column in older_values:
            merged[column] = older_values[column]
        else:
            still_held.add(column)
    return Change(
        newer.table,
        newer.key,
        newer.commit_lsn,
        newer.order,
        merged,
        frozenset(still_held),
        split=True,  # merged from split values only
        schema=newer.schema,
    )


_new_tuple: Final = tuple.__new__


class BatchOutcomes:
    """The results of one :meth:`Sink.apply`: one slot per input change, filled in as the
    sink learns them."""

    def __init__(self, changes: Sequence[Change]) -> None:
        self._changes = changes
        self._results: list[ApplyResult | None] = [None] * len(changes)

    def one_per_key(self) -> list[tuple[int, Change]]:
        """``(slot, change)`` to apply per (table, key) (:func:`one_per_key`); changes that
        a newer one of the same key supersedes are ``skipped`` here."""
        reduced = one_per_key(self._changes)
        for slot in reduced.superseded:
            self.set(slot, Outcome.SKIPPED, "superseded by a newer change in the batch")
        return list(zip(reduced.index_of, reduced.winners, strict=True))

    def set(
        self, slot: int, outcome: Outcome, reason: str | None = None, retryable: bool = False
    ) -> None:
        """Record what happened to the change at ``slot``."""
        change = self._changes[slot]
        # ApplyResult.of without its two calls: this runs for every change.
        result = (change.key, change.table, outcome, reason, retryable)
        self._results[slot] = _new_tuple(ApplyResult, result)

    def change(self, slot: int) -> Change:
        """The change at ``slot``."""
        return self._changes[slot]

    def has(self, slot: int) -> bool:
        """Whether the change at ``slot`` has its result."""
        return self._results[slot] is not None

    def results(self) -> list[ApplyResult]:
        """One result per input change, in input order."""
        return [
            r if r is not None else ApplyResult.of(c, Outcome.FAILED, "no outcome (bug)")
            for c, r in zip(self._changes, self._results, strict=True)
        ]


def chunks_by_bytes(
    items: Sequence[T], size_of: Callable[[T], int], max_bytes: int
) -> Iterator[list[T]]:
    """``items`` in order, cut into runs of at most ``max_bytes`` (by ``size_of``): a
    request is sized by what it carries, not by a count. An item larger than ``max_bytes``
    on its own makes a run of one (the server decides whether it takes it)."""
    run: list[T] = []
    size = 0
    for item in items:
        n = size_of(item)
        if run and size + n > max_bytes:
            yield run
            run, size = [], 0
        run.append(item)
        size += n
    if run:
        yield run
