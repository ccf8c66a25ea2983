"""Record-by-record comparison of Debezium's records with ours.

Records are grouped by table. Snapshot records (``op: r``) are paired by key (keyless tables:
by row); everything else (changes, tombstones, TRUNCATE events) is aligned in stream order by
(kind, op, LSN, key), since both systems read the same WAL. Each pair's key, value (schema and
payload) and headers are flattened to leaves and compared leaf by leaf; a record without a
counterpart is a difference too. Every difference must be explained by an entry of
:mod:`tests.integration.debezium_parity.allowlist`, or the comparison fails.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from pgcdc.core.contract import HEADER_COMMIT_LSN, HEADER_ORDER
from tests.integration.debezium_parity.peers import Record

MISSING = "<absent>"
Path = tuple[str, ...]


@dataclass(frozen=True)
class Event:
    """One record of one system, decoded and with its system's prefix taken out of names."""

    system: str  # "debezium" or "ours"
    table: tuple[str, str]
    key: Any
    value: Any  # None: a tombstone
    headers: dict[str, Any]
    topic: str
    offset: int
    # Ours only: a delete (or its tombstone) written for a row a TRUNCATE removed.
    truncated_row: bool = False

    @property
    def payload(self) -> Any:
        if not isinstance(self.value, dict):
            return None
        return self.value.get("payload", self.value)

    @property
    def op(self) -> str | None:
        p = self.payload
        return p.get("op") if isinstance(p, dict) else None

    @property
    def snapshot(self) -> bool:
        return self.op == "r"

    @property
    def lsn(self) -> Any:
        p = self.payload
        return p["source"].get("lsn") if isinstance(p, dict) else None

    @property
    def key_payload(self) -> Any:
        if isinstance(self.key, dict) and "payload" in self.key:
            return self.key["payload"]
        return self.key


@dataclass(frozen=True)
class Difference:
    """One leaf (or one whole record) on which the two systems disagree."""

    table: tuple[str, str]
    op: str | None
    snapshot: bool
    path: Path  # ("record",) for a record without a counterpart
    debezium: Any
    ours: Any
    debezium_event: Event | None
    our_event: Event | None

    def describe(self) -> str:
        t = ".".join(self.table)
        where = "/".join(self.path)
        return f"{t} op={self.op} {where}: debezium={self.debezium!r} ours={self.ours!r}"


@dataclass
class Comparison:
    """What was compared and what differed."""

    pairs: int = 0
    fields: int = 0
    debezium_records: int = 0
    our_records: int = 0
    differences: list[Difference] = field(default_factory=list)


def _json(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace")


def _without_prefix(doc: Any, prefix: str) -> Any:
    """``doc`` with the system's topic prefix replaced by ``PREFIX`` in every string."""
    if isinstance(doc, str):
        if doc == prefix:
            return "PREFIX"
        return "PREFIX." + doc[len(prefix) + 1 :] if doc.startswith(prefix + ".") else doc
    if isinstance(doc, list):
        return [_without_prefix(v, prefix) for v in doc]
    if isinstance(doc, dict):
        return {k: _without_prefix(v, prefix) for k, v in doc.items()}
    return doc


def events(
    system: str,
    records: Iterable[Record],
    prefix: str,
    tables_by_topic: dict[str, tuple[str, str]],
) -> list[Event]:
    """Decode records; a record of a topic not in ``tables_by_topic`` (our truncate topic)
    belongs to the table its value's ``source`` names."""
    out = []
    for r in records:
        value = _without_prefix(_json(r.value), prefix)
        table = tables_by_topic.get(r.topic)
        if table is None:
            payload = value.get("payload", value) if isinstance(value, dict) else None
            if not isinstance(payload, dict):
                raise ValueError(f"record {r.topic}@{r.offset} names no table")
            table = (payload["source"]["schema"], payload["source"]["table"])
        headers = {k: _without_prefix(_json(v), prefix) for k, v in r.headers}
        out.append(
            Event(
                system,
                table,
                _without_prefix(_json(r.key), prefix),
                value,
                headers,
                r.topic,
                r.offset,
            )
        )
    return out


# --- flattening --------------------------------------------------------------------------


def _schema_leaves(schema: Any, path: Path) -> Iterator[tuple[Path, Any]]:
    """A Connect schema's leaves; struct fields by name (plus their order as one leaf)."""
    if not isinstance(schema, dict):
        yield path, schema
        return
    for k, v in schema.items():
        if k == "fields" and isinstance(v, list):
            yield (*path, "fields#order"), [f.get("field") for f in v]
            for f in v:
                yield from _schema_leaves(f, (*path, f"<{f.get('field')}>"))
        elif k in ("items", "keys", "values"):
            yield from _schema_leaves(v, (*path, k))
        else:
            yield (*path, k), v


def _leaves(doc: Any, path: Path) -> Iterator[tuple[Path, Any]]:
    if isinstance(doc, dict) and doc:
        for k, v in doc.items():
            if k == "schema" and len(path) == 1:  # the record's {"schema", "payload"} schema
                yield from _schema_leaves(v, (*path, "schema"))
            else:
                yield from _leaves(v, (*path, k))
    elif isinstance(doc, list) and doc:
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, f"[{i}]"))
    else:
        yield path, doc


def leaves(event: Event) -> dict[Path, Any]:
    """Every leaf of the record: key, value and headers."""
    out: dict[Path, Any] = {}
    out.update(_leaves(event.key, ("key",)))
    out.update(_leaves(event.value, ("value",)))
    for name, v in event.headers.items():
        out.update(_leaves(v, ("header", name)))
    return out


# --- pairing ------------------------------------------------------------------------------


def _canonical(doc: Any) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def _stream_ids(evs: list[Event]) -> list[tuple[Any, ...]]:
    """An identity per stream record: what it is, at which LSN, for which key."""
    ids: list[tuple[Any, ...]] = []
    last_lsn: Any = None
    for e in evs:
        if e.value is None:
            ids.append(("tombstone", last_lsn, _canonical(e.key_payload)))
        else:
            last_lsn = e.lsn
            key = b"" if e.op == "t" else _canonical(e.key_payload)
            ids.append(("event", e.op, e.lsn, key))
    return ids


def _our_order(e: Event) -> tuple[int, int]:
    return int(e.headers.get(HEADER_COMMIT_LSN, 0)), int(e.headers.get(HEADER_ORDER, 0))


def pair(dbz: list[Event], ours: list[Event]) -> Iterator[tuple[Event | None, Event | None]]:
    """Pairs of one table's records (None where a system has no counterpart)."""
    dbz_snap = [e for e in dbz if e.snapshot]
    our_snap = [e for e in ours if e.snapshot]
    by_id: dict[bytes, list[Event]] = defaultdict(list)
    for e in our_snap:
        by_id[_snapshot_id(e)].append(e)
    for e in dbz_snap:
        match = by_id.get(_snapshot_id(e))
        yield e, (match.pop(0) if match else None)
    for rest in by_id.values():
        for e in rest:
            yield None, e
    dbz_stream = [e for e in dbz if not e.snapshot]
    # Ours: the table topic and the truncate topic, merged in commit order.
    our_stream = sorted((e for e in ours if not e.snapshot), key=_our_order)
    a, b = _stream_ids(dbz_stream), _stream_ids(our_stream)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            yield from zip(dbz_stream[i1:i2], our_stream[j1:j2], strict=True)
        else:
            for e in dbz_stream[i1:i2]:
                yield e, None
            for e in our_stream[j1:j2]:
                yield None, e


def _snapshot_id(e: Event) -> bytes:
    if e.key is not None:
        return _canonical(e.key_payload)
    return _canonical(e.payload.get("after"))


# --- comparing ----------------------------------------------------------------------------


def compare(dbz: list[Event], ours: list[Event]) -> Comparison:
    """Every difference between the two systems' records, record by record."""
    result = Comparison(debezium_records=len(dbz), our_records=len(ours))
    tables = sorted({e.table for e in dbz} | {e.table for e in ours})
    for table in tables:
        d = [e for e in dbz if e.table == table]
        o = _mark_truncated_rows([e for e in ours if e.table == table])
        for de, oe in pair(d, o):
            if de is None or oe is None:
                e = de or oe
                assert e is not None
                result.differences.append(
                    Difference(
                        table,
                        e.op,
                        e.snapshot,
                        ("record",),
                        _summary(de),
                        _summary(oe),
                        de,
                        oe,
                    )
                )
                continue
            result.pairs += 1
            fields, differences = diff_pair(de, oe)
            result.fields += fields
            result.differences.extend(differences)
    return result


def diff_pair(de: Event, oe: Event) -> tuple[int, list[Difference]]:
    """(leaves compared, differing leaves) of a pair of records."""
    dl, ol = leaves(de), leaves(oe)
    differences = []
    paths = sorted(dl.keys() | ol.keys())
    for path in paths:
        dv, ov = dl.get(path, MISSING), ol.get(path, MISSING)
        if dv != ov or type(dv) is not type(ov):
            differences.append(Difference(de.table, de.op, de.snapshot, path, dv, ov, de, oe))
    return len(paths), differences


def _mark_truncated_rows(evs: list[Event]) -> list[Event]:
    """Our deletes at a TRUNCATE's position (same LSN as our ``t`` record of the table) and
    their tombstones, marked as such."""
    truncates = {e.lsn for e in evs if e.op == "t"}
    out: list[Event] = []
    marked_keys: set[bytes] = set()
    for e in sorted(evs, key=_our_order):
        if e.op == "d" and e.lsn in truncates:
            marked_keys.add(_canonical(e.key_payload))
            e = replace(e, truncated_row=True)
        elif e.value is None and _canonical(e.key_payload) in marked_keys:
            marked_keys.discard(_canonical(e.key_payload))
            e = replace(e, truncated_row=True)
        out.append(e)
    return out


def _summary(e: Event | None) -> Any:
    if e is None:
        return MISSING
    kind = "tombstone" if e.value is None else f"op={e.op}"
    return f"{kind} key={e.key_payload!r} lsn={e.lsn}"


def field_schema(event: Event | None, image: str, column: str) -> dict[str, Any] | None:
    """The value schema of ``column`` in the ``before``/``after`` struct of an event."""
    if event is None or not isinstance(event.value, dict) or "schema" not in event.value:
        return None
    for f in event.value["schema"].get("fields", []):
        if f.get("field") == image:
            for c in f.get("fields", []):
                if c.get("field") == column:
                    result: dict[str, Any] = c
                    return result
    return None
