"""The merge of an incremental snapshot chunk with the stream: pure code, no I/O.

**The invariant.** A chunk's rows are published at its high watermark H with the version
(H − 1, place in the chunk), so a follower takes a chunk row over everything committed
before H and nothing committed after it. That is right if and only if *every published row
equals its key's state after the last transaction committed before H*. The merge keeps a
chunk row only when no transaction that changed its key and committed before H is missing
from what the chunk's SELECT saw (its MVCC snapshot S); then the row is that state.

Why the rules below establish it. Take a transaction T that changed key k and whose commit
record precedes H in the WAL (so the stream passes T before H). Where the stream met T:

1. *before the chunk was asked for*: its keys were not noted. T is in ``unconfirmed`` (the
   transactions streamed whose visibility no snapshot has confirmed yet, see
   :class:`Unconfirmed`); if S did not see it, the chunk is read again (:func:`merge_chunk`
   returns None): we cannot tell which rows it touched. A commit record can reach the WAL
   before the transaction becomes visible (a synchronous standby's wait), so this happens.
   (A transaction running when a table joins the captured set counts here too: what it
   changed in the table before that is not published, and only a chunk that saw it can
   carry it.)
2. *between the request and the low watermark L*: its keys were noted under its xid
   (``early``); if S did not see T, those keys leave the chunk (the streamed change is the
   newer state, and it is already on its way).
3. *between L and H*: S may or may not have seen it; its keys leave the chunk whatever
   (``window``). The streamed event is right either way.
4. a TRUNCATE of the table in 2 or 3 empties the chunk (it names no keys); in 1 it is a
   transaction like any other.

A transaction committed after H has a commit LSN of at least H and wins at every follower.
Keys are compared by *identity* (:func:`key_identity`: the key columns' text as PostgreSQL
renders it, with the session settings every reader connection pins), never by Kafka key
bytes, which embed the key's schema: a key column changed from int to bigint between the
chunk's read and a streamed change is still the same key.

The model-based test (``tests/unit/test_incremental_model.py``) drives this module and the
engine around it through random interleavings and checks the invariant's consequence: a
follower that applies every record by version equals the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pgcdc.core.values import RawValue

# A key by its columns' text (None for SQL NULL, which a usable key never holds).
KeyId = tuple[str | None, ...]

_WRAP = 0xFFFFFFFF
_HALF = 0x80000000


def key_identity(row: Sequence[RawValue], positions: Sequence[int]) -> KeyId:
    """The identity of a row's key: the text of the columns at ``positions``.

    pgoutput and COPY (text format) render a value with the same output function under the
    same session settings, so the stream and a chunk give one key one identity, whatever
    record key bytes (which carry the key's schema) they are published with.
    """
    out: list[str | None] = []
    for i in positions:
        v = row[i]
        out.append(v.decode() if isinstance(v, bytes) else v if isinstance(v, str) else None)
    return tuple(out)


@dataclass(frozen=True)
class ReadSnapshot:
    """What a chunk's SELECT saw: the transactions its snapshot lists as running, and every
    one from its xmax on, it did not see (32-bit xids, as pgoutput sends them)."""

    invisible: frozenset[int] = frozenset()
    xmax: int = 0

    def unseen(self, xid: int | None) -> bool:
        """The SELECT did not see this transaction (running, or begun after its snapshot)."""
        if xid is None:
            return False
        return xid in self.invisible or (xid - self.xmax) & _WRAP < _HALF


class Unconfirmed:
    """Transactions the stream has passed whose visibility no snapshot has confirmed yet.

    A committed transaction that a snapshot saw is visible to every later snapshot, so it
    leaves the set as soon as one snapshot (a chunk's, or one taken to prune it) saw it; what
    stays is the few still in flight, however long one takes to become visible.
    """

    def __init__(self) -> None:
        self._xids: dict[int, None] = {}

    def add(self, xid: int | None) -> None:
        if xid is not None:
            self._xids[xid] = None

    def prune(self, seen: ReadSnapshot) -> None:
        """Forget every transaction ``seen`` saw."""
        self._xids = {x: None for x in self._xids if seen.unseen(x)}

    def frozen(self) -> frozenset[int]:
        return frozenset(self._xids)

    def __len__(self) -> int:
        return len(self._xids)


@dataclass
class Window:
    """What the stream noted about one chunk's table from the chunk's request to its H."""

    unconfirmed: frozenset[int]  # rule 1: streamed before the request, not known visible
    in_window: bool = False  # the stream has passed L
    window: set[KeyId] = field(default_factory=set)  # rule 3
    early: dict[int | None, set[KeyId]] = field(default_factory=dict)  # rule 2, by xid
    truncated: bool = False  # rule 4

    def note(self, key: KeyId, xid: int | None) -> None:
        """A streamed change of the chunk's table touched ``key`` in transaction ``xid``."""
        if self.in_window:
            self.window.add(key)
        else:
            keys = self.early.get(xid)
            if keys is None:
                keys = self.early[xid] = set()
            keys.add(key)


def merge_chunk(keys: Sequence[KeyId], seen: ReadSnapshot, window: Window) -> list[int] | None:
    """The places in ``keys`` (a chunk's rows, in key order) of the rows that go out at the
    high watermark, or None when the chunk must be read again (see the module docstring)."""
    if any(seen.unseen(xid) for xid in window.unconfirmed):
        return None
    if window.truncated:
        return []
    drop = set(window.window)
    for xid, ks in window.early.items():
        if seen.unseen(xid):
            drop |= ks
    if not drop:
        return list(range(len(keys)))
    return [i for i, k in enumerate(keys) if k not in drop]


def unseen_of(seen: ReadSnapshot, xids: Iterable[int]) -> list[int]:
    """The transactions of ``xids`` that ``seen`` did not see (for a log line)."""
    return [x for x in xids if seen.unseen(x)]
