"""The search follower's external versions: the commit LSN with ``external_gte``, exact at
any LSN below 2**63 and any order inside a transaction (was: LSN << 16 | min(order, 0xFFFF),
which collided past 65,535 changes and overflowed past LSN 2**47)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.core.errors import SinkError
from sinks.base import Change
from sinks.search import SearchSink
from sinks.search_requests import MAX_EXTERNAL_VERSION, bulk_action, check_versionable

pytestmark = pytest.mark.unit


def _meta(kind: str, change: Change) -> dict[str, object]:
    line = bulk_action(kind, "cdc-public.t", change)
    assert line.endswith(b"\n")
    meta: dict[str, dict[str, object]] = orjson.loads(line)
    return meta[kind]


@given(
    st.integers(min_value=0, max_value=MAX_EXTERNAL_VERSION),
    st.integers(min_value=0, max_value=2**40),
)
def test_the_version_is_the_commit_lsn_with_external_gte(lsn: int, order: int) -> None:
    for kind in ("index", "delete"):  # deletes carry the LSN too
        change = Change("public.t", "1", lsn, order, None if kind == "delete" else {"id": 1})
        check_versionable(change)
        meta = _meta(kind, change)
        assert meta == {
            "_index": "cdc-public.t",
            "_id": "1",
            "version": lsn,
            "version_type": "external_gte",
        }


def test_lsns_past_the_old_packing_limits_are_exact() -> None:
    # 2**47 and beyond overflowed the packed version; orders past 65535 were clamped.
    for lsn in (2**47, 2**47 + 1, 2**62, MAX_EXTERNAL_VERSION):
        assert _meta("index", Change("public.t", "1", lsn, 70_000, {}))["version"] == lsn


def test_an_lsn_beyond_the_largest_external_version_fails_fast() -> None:
    with pytest.raises(SinkError, match=r"2\*\*63-1") as e:
        check_versionable(Change("public.t", "7", MAX_EXTERNAL_VERSION + 1, 0, {}))
    assert "public.t/7" in str(e.value)


@given(
    st.sampled_from(["index", "delete"]),
    st.text(min_size=1),
    st.text(min_size=1),
    st.integers(min_value=0, max_value=MAX_EXTERNAL_VERSION),
)
def test_the_action_line_is_the_json_of_its_meta(kind: str, index: str, key: str, lsn: int) -> None:
    meta = {kind: {"_index": index, "_id": key, "version": lsn, "version_type": "external_gte"}}
    line = bulk_action(kind, index, Change("public.t", key, lsn, 0, None))
    assert line == orjson.dumps(meta) + b"\n"


@given(
    st.text(min_size=1),
    st.text(min_size=1),
    st.integers(min_value=0, max_value=MAX_EXTERNAL_VERSION),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3) | st.integers(-(2**63), 2**63 - 1)),
)
def test_the_sinks_kept_formats_make_the_same_lines(
    index: str, key: str, lsn: int, doc: dict[str, object]
) -> None:
    """The sink fills a kept format per kind and index (format characters in the index
    name too): the action line, and for an index action the source line after it."""
    sink = SearchSink("http://127.0.0.1:1", "t")
    source = orjson.dumps(doc)
    for _ in range(2):  # a new format, then the kept one
        line = sink._action_format("index", index) % (orjson.dumps(key), lsn, source)
        change = Change("public.t", key, lsn, 0, doc)
        assert line == bulk_action("index", index, change) + source + b"\n"
        line = sink._action_format("delete", index) % (orjson.dumps(key), lsn)
        assert line == bulk_action("delete", index, Change("public.t", key, lsn, 0, None))


@given(st.text(min_size=1), st.integers(min_value=0, max_value=MAX_EXTERNAL_VERSION))
def test_an_action_moved_to_another_index_is_the_line_made_for_it(key: str, lsn: int) -> None:
    """A write refused because its index went is sent again into what the table writes into
    now: the same line as one made for that index, ``require_alias`` as it sets it."""
    from sinks.search import _moved, _Op
    from sinks.search_requests import action_format

    for kind, tail in (("index", b'{"id":1}\n'), ("delete", b"")):
        for old_alias, new_alias in ((True, True), (True, False), (False, True)):
            fmt = action_format(kind, "cdc-a-W", require_alias=old_alias) + (b"%b" if tail else b"")
            args = (orjson.dumps(key), lsn, tail) if tail else (orjson.dumps(key), lsn)
            op = _Op(0, "public.t", "cdc-a-W", fmt % args)
            want = action_format(kind, "cdc-b%s", require_alias=new_alias) % (
                orjson.dumps(key),
                lsn,
            )
            for digest in (True, False):  # no digest on the op: nothing to keep or cut
                moved = _moved(op, "cdc-b%s", require_alias=new_alias, digest=digest)
                assert moved == (want + tail, b"")
            meta = orjson.loads(want)[kind]
            assert meta.get("require_alias", False) is (new_alias and kind == "index")


def test_write_aliases_are_names_opensearch_never_gives_an_index() -> None:
    """Upper case: an index of that name cannot be created, so no write into it (deletes
    included) ever starts an index of its own; at most 255 bytes; one per name."""
    from pgcdc.core.contract import MAX_INDEX_NAME_BYTES
    from sinks.search_versions import version_name, version_of, write_alias

    long = "cdc-public." + "t" * 250
    names = ["cdc-public.items", long, version_name(long, 2), "cdc-public.items-v2"]
    aliases = [write_alias(n) for n in names]
    assert aliases[0] == "cdc-public.items-W"
    assert len(set(aliases)) == len(names)
    assert all(a != a.lower() and len(a.encode()) <= MAX_INDEX_NAME_BYTES for a in aliases)
    assert version_of("cdc-public.items", "cdc-public.items-v12") == 12
    assert version_of("cdc-public.items", "cdc-public.items") is None
    assert version_of("cdc-public.items", "cdc-public.items-v1x") is None


@given(
    st.text(min_size=1),
    st.integers(min_value=0, max_value=MAX_EXTERNAL_VERSION),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3) | st.integers(-(2**63), 2**63 - 1)),
    st.booleans(),
    st.booleans(),
)
def test_a_moved_write_keeps_its_digest_only_where_the_target_takes_it(
    key: str, lsn: int, doc: dict[str, object], old_alias: bool, new_alias: bool
) -> None:
    """The sink's index action carries the row digest of exactly its source; moved (an echo
    into the serving version, a write sent again) into a target that takes no digest, the
    source line is exactly the row again, the line made for that target; into one that
    takes it, the digest stays as it was made."""
    from pgcdc.core import row_digest
    from sinks.base import BatchOutcomes
    from sinks.search import _moved, _Op
    from sinks.search_requests import action_format

    sink = SearchSink("http://127.0.0.1:1", "t")
    sink._aliased.update({"cdc-a-W"} if old_alias else set())
    sink._digests.update({"cdc-a-W": True, "cdc-b%s": False})
    change = Change("public.t", key, lsn, 0, doc)
    ops: list[_Op] = []
    sink._add_index_op(ops, BatchOutcomes([change]), 0, change, "cdc-a-W", doc, None)
    (op,) = ops
    head, source, end = op.action.split(b"\n")
    assert end == b""
    assert head + b"\n" == action_format("index", "cdc-a-W", require_alias=old_alias) % (
        orjson.dumps(key),
        lsn,
    )
    held = orjson.loads(source)
    assert held.pop(row_digest.FIELD) == row_digest.stored(key, doc)
    assert held == doc and op.digest and source.endswith(op.digest + b"}")
    assert source.count(orjson.dumps(row_digest.FIELD)) == 1

    fmt = action_format("index", "cdc-b%s", require_alias=new_alias) + b"%b\n"
    made = fmt % (orjson.dumps(key), lsn, orjson.dumps(doc))
    assert _moved(op, "cdc-b%s", require_alias=new_alias, digest=False) == (made, b"")
    moved, kept = _moved(op, "cdc-b%s", require_alias=new_alias, digest=True)
    assert kept == op.digest and moved.split(b"\n")[1] == source
    # Into its own target, not taking the digest (e.g. read again after a lost index).
    same, none = _moved(op, "cdc-a-W", require_alias=old_alias, digest=False)
    assert none == b"" and same.split(b"\n")[1] == orjson.dumps(doc)
    assert _moved(op, "cdc-a-W", require_alias=old_alias, digest=True) == (op.action, op.digest)


def test_an_empty_row_takes_the_digest_alone_and_gives_it_back() -> None:
    from pgcdc.core import row_digest
    from sinks.base import BatchOutcomes
    from sinks.search import _moved, _Op

    sink = SearchSink("http://127.0.0.1:1", "t")
    sink._digests["cdc-a-W"] = True
    change = Change("public.t", "1", 5, 0, {})
    ops: list[_Op] = []
    sink._add_index_op(ops, BatchOutcomes([change]), 0, change, "cdc-a-W", {}, None)
    source = ops[0].action.split(b"\n")[1]
    assert orjson.loads(source) == {row_digest.FIELD: row_digest.stored("1", {})}
    moved, _ = _moved(ops[0], "cdc-b", require_alias=False, digest=False)
    assert moved.split(b"\n")[1] == b"{}"


def test_an_index_that_takes_no_digest_gets_the_row_alone() -> None:
    from sinks.base import BatchOutcomes
    from sinks.search import _Op

    sink = SearchSink("http://127.0.0.1:1", "t")
    sink._digests["cdc-old-W"] = False
    doc = {"id": 1, "n": "x"}
    change = Change("public.t", "1", 5, 0, doc)
    ops: list[_Op] = []
    sink._add_index_op(ops, BatchOutcomes([change]), 0, change, "cdc-old-W", doc, None)
    assert ops[0].digest == b"" and ops[0].action.split(b"\n")[1] == orjson.dumps(doc)


def test_a_tables_targets_are_read_again_once_its_index_is_laid_out_again() -> None:
    """What a lost index's recovery forgets: whether each of its table's write targets
    (the serving version, the next one, their write aliases) takes the digest; another
    table's stay known."""
    from sinks import search_versions as v

    sink = SearchSink("http://127.0.0.1:1", "t")
    name, other = sink.index_for("public.a"), sink.index_for("public.b")
    serving = v.Serving(name, f"{name}-v2", 2)
    sink._serving[name] = serving
    sink._writes[name] = v.write_alias(name)
    sink._builds["public.a"] = (serving, f"{name}-v3")
    sink._build_writes["public.a"] = v.write_alias(f"{name}-v3")
    targets = [name, f"{name}-v2", f"{name}-v3", v.write_alias(name), v.write_alias(f"{name}-v3")]
    sink._digests.update({t: True for t in [*targets, other, v.write_alias(other)]})
    sink._forget_digests("public.a")
    assert sink._digests == {other: True, v.write_alias(other): True}
