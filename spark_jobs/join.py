"""Joined search documents: the pure, incremental core of a document maintained from the
change streams of several tables (issue 33; run by ``spark_jobs/documents_sync.py``).

A :class:`DocumentSpec` roots a document at one table (``products``) and names what it takes
from others: **lookups**, many-to-one (the root's ``category_id`` → one ``categories`` row,
embedded under a name), and **nested** lists, one-to-many (every ``stock_levels`` row whose
``product_id`` is the root's key, as a list sorted by the child's key) with simple
aggregates over them (count, sum, min, max). :class:`JoinState` takes the tables' changes in
any interleaving Kafka gives (each key's changes in order, as one partition holds them; the
tables' topics interleaved at random; a prefix read again after a restart) and tells which
documents each change touched; :meth:`JoinState.document` makes one from the state.

The rules, each guarded by ``tests/unit/test_join_model.py``:

- **Per row, newest wins.** Every row keeps the version (commit LSN, order) of the change
  that set it, a delete too (a tombstone). A change not newer than the held version is a
  replay or a stale copy: ignored, nothing is touched. A TRUNCATE removes the table's rows
  and makes every change older than it stale.
- **Reverse indices** say whom a change touches: the roots that look a row up by its key,
  and the root a child belongs to, before and after the change (a child that moves to
  another product touches both). A lookup row that arrives after its referrer is found
  through the index, which holds referrers whatever the lookup holds.
- **A document is a function of the state**, never patched: its root row (absent: the
  document is deleted), each lookup's row (absent: ``null``), each nested list and its
  aggregates.
- **Document versions.** A document's inputs each have their own LSN order, and a late
  change of one input may be older than another input's newest: an LSN cannot be the
  document's version. Each document has a counter in the state instead, raised each time a
  change touches it; the follower writes with ``version_type=external_gte``, so a change
  processed late is never refused, and since the state only moves forward (per row,
  newest wins) and the counter only rises, the follower never goes backwards. A replay
  from a checkpoint restores the counters with the state and writes the same versions
  again (``gte``); a rebuild from offset 0 goes into a fresh index.

Join values are compared as the converter gives them (JSON values: an ``int`` key and an
``int`` reference match; a ``numeric`` key arrives as text and must be referenced by the
same text). Not supported: lookups of lookups, nested lists inside nested lists, joins on
more than one column, aggregates other than the four.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Version = tuple[int, int]  # (commit LSN, order in the transaction)
Row = Mapping[str, Any]

AGGREGATES: dict[str, Callable[[list[Any]], Any]] = {
    "count": len,
    "sum": lambda vs: sum(v for v in vs if v is not None),
    "min": lambda vs: min((v for v in vs if v is not None), default=None),
    "max": lambda vs: max((v for v in vs if v is not None), default=None),
}


@dataclass(frozen=True)
class Lookup:
    """Many-to-one: the root's ``on`` column holds the ``key`` of one ``table`` row, whose
    ``fields`` go under ``name``."""

    name: str
    table: str
    on: str
    key: str
    fields: tuple[str, ...]


@dataclass(frozen=True)
class Aggregate:
    name: str
    function: Literal["count", "sum", "min", "max"]
    field: str


@dataclass(frozen=True)
class Nested:
    """One-to-many: every ``table`` row whose ``on`` column is the root's key, its
    ``fields`` as a list under ``name`` (sorted by the child's key), and ``aggregates`` of
    them beside it on the document."""

    name: str
    table: str
    on: str
    fields: tuple[str, ...]
    aggregates: tuple[Aggregate, ...] = ()


@dataclass(frozen=True)
class DocumentSpec:
    """A document rooted at ``root``, one per root row, its id the root's ``root_key``."""

    root: str
    root_key: str
    fields: tuple[str, ...]
    lookups: tuple[Lookup, ...] = ()
    nested: tuple[Nested, ...] = ()

    def tables(self) -> set[str]:
        return {self.root, *(x.table for x in self.lookups), *(n.table for n in self.nested)}


@dataclass(frozen=True)
class JoinChange:
    """A row change of one of the document's tables: its key columns' values, its version,
    and the row after it (None: deleted)."""

    table: str
    key: tuple[Any, ...]
    version: Version
    row: Row | None


@dataclass(frozen=True)
class Truncate:
    table: str
    version: Version


@dataclass
class _Held:
    version: Version
    row: Row | None


@dataclass
class JoinState:
    """What the document's tables hold, as far as the changes applied so far say."""

    spec: DocumentSpec
    rows: dict[str, dict[tuple[Any, ...], _Held]] = field(default_factory=lambda: defaultdict(dict))
    truncated: dict[str, Version] = field(default_factory=dict)
    # (lookup table, looked-up key) -> roots that reference it
    referrers: dict[tuple[str, Any], set[Any]] = field(default_factory=lambda: defaultdict(set))
    # (child table, root key) -> child keys
    children: dict[tuple[str, Any], set[tuple[Any, ...]]] = field(
        default_factory=lambda: defaultdict(set)
    )
    versions: dict[Any, int] = field(default_factory=dict)  # document id -> its counter

    def apply(self, change: JoinChange | Truncate) -> set[Any]:
        """Apply one change; the ids of the documents it touched (their counters raised)."""
        touched = self._truncate(change) if isinstance(change, Truncate) else self._change(change)
        for doc_id in touched:
            self.versions[doc_id] = self.versions.get(doc_id, 0) + 1
        return touched

    def _change(self, c: JoinChange) -> set[Any]:
        held = self.rows[c.table].get(c.key)
        floor = self.truncated.get(c.table)
        if (held is not None and c.version <= held.version) or (
            floor is not None and c.version <= floor
        ):
            return set()  # a replay or a stale copy
        before = held.row if held is not None else None
        self.rows[c.table][c.key] = _Held(c.version, c.row)
        return self._reindex(c.table, c.key, before, c.row)

    def _truncate(self, t: Truncate) -> set[Any]:
        floor = self.truncated.get(t.table)
        if floor is not None and t.version <= floor:
            return set()
        self.truncated[t.table] = t.version
        touched: set[Any] = set()
        for key, held in list(self.rows[t.table].items()):
            if held.version < t.version:
                del self.rows[t.table][key]
                touched |= self._reindex(t.table, key, held.row, None)
        return touched

    def _reindex(
        self, table: str, key: tuple[Any, ...], before: Row | None, after: Row | None
    ) -> set[Any]:
        spec, touched = self.spec, set()
        if table == spec.root:
            doc_id = _root_id(spec, key, before, after)
            touched.add(doc_id)
            for lk in spec.lookups:
                if before is not None:
                    self.referrers[(lk.table, before.get(lk.on))].discard(doc_id)
                if after is not None:
                    self.referrers[(lk.table, after.get(lk.on))].add(doc_id)
        for lk in spec.lookups:
            if table == lk.table:
                value = (after or before or {}).get(lk.key, key[0] if len(key) == 1 else None)
                touched |= self.referrers.get((lk.table, value), set())
        for n in spec.nested:
            if table == n.table:
                for row, add in ((before, False), (after, True)):
                    if row is None:
                        continue
                    owner = row.get(n.on)
                    members = self.children[(n.table, owner)]
                    (members.add if add else members.discard)(key)
                    touched.add(owner)
        return touched

    def snapshot(self) -> dict[str, Any]:
        """The state as JSON values (:meth:`restore` reads it back): the held rows with
        their versions, the truncation floors and the counters. The reverse indices are not
        kept: they are a function of the held rows, made again by :meth:`restore`."""
        return {
            "rows": {
                table: [[list(key), list(h.version), h.row] for key, h in held.items()]
                for table, held in self.rows.items()
                if held
            },
            "truncated": {table: list(v) for table, v in self.truncated.items()},
            "versions": [[doc_id, n] for doc_id, n in self.versions.items()],
        }

    @classmethod
    def restore(cls, spec: DocumentSpec, data: Mapping[str, Any]) -> JoinState:
        """The state :meth:`snapshot` gave. Each held row is indexed as its insert would
        index it (the same :meth:`_reindex`), so the indices are those the changes made;
        the counters are taken as they were, not raised."""
        state = cls(spec)
        for table, held in data["rows"].items():
            for key, version, row in held:
                state.rows[table][tuple(key)] = _Held((version[0], version[1]), row)
        state.truncated = {t: (v[0], v[1]) for t, v in data["truncated"].items()}
        for table, held in list(state.rows.items()):
            for key, h in held.items():
                if h.row is not None:
                    state._reindex(table, key, None, h.row)
        state.versions = {doc_id: n for doc_id, n in data["versions"]}
        return state

    def document(self, doc_id: Any) -> tuple[int, dict[str, Any] | None]:
        """Document ``doc_id`` as the state holds it, with its version: None when its root
        row is absent (deleted, or not arrived yet)."""
        spec = self.spec
        version = self.versions.get(doc_id, 0)
        held = self.rows[spec.root].get((doc_id,))
        if held is None or held.row is None:
            return version, None
        root = held.row
        doc: dict[str, Any] = {f: root.get(f) for f in spec.fields}
        for lk in spec.lookups:
            found = self.rows[lk.table].get((root.get(lk.on),))
            doc[lk.name] = (
                None
                if found is None or found.row is None
                else {f: found.row.get(f) for f in lk.fields}
            )
        for n in spec.nested:
            rows = []
            for key in sorted(self.children.get((n.table, doc_id), ())):
                child = self.rows[n.table][key].row
                if child is not None:
                    rows.append(child)
            doc[n.name] = [{f: r.get(f) for f in n.fields} for r in rows]
            for agg in n.aggregates:
                doc[agg.name] = AGGREGATES[agg.function]([r.get(agg.field) for r in rows])
        return version, doc


def _root_id(spec: DocumentSpec, key: tuple[Any, ...], *rows: Row | None) -> Any:
    for row in rows:
        if row is not None and spec.root_key in row:
            return row[spec.root_key]
    return key[0]
