"""The versions of a table's index against the real OpenSearch (sinks.search_versions): the
next version built beside the serving one, the check that it caught up, and the atomic switch
while a searcher reads the table's name the whole time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from opensearchpy import OpenSearch
from opensearchpy.exceptions import TransportError

from pgcdc.core.search_documents import every_document
from sinks import search_versions as v
from sinks.base import Change, Outcome
from sinks.search import SearchSink
from sinks.search_index import index_settings
from tests.conftest import Endpoints, wait_until
from tests.integration.search_digests import digest_folds, digests_missing, python_folds

pytestmark = pytest.mark.integration

T = "public.items"
ROWS = 1_200  # more than one page of ids at page=500


@pytest.fixture
def sink(endpoints: Endpoints, index_prefix: str) -> Iterator[SearchSink]:
    s = SearchSink(endpoints.search_url, index_prefix)
    yield s
    s.close()


def _create(sink: SearchSink, index: str, qty_type: str, version: int, shards: int = 1) -> None:
    name = index.rsplit("-v", 1)[0] if version > 1 else index
    mapping = v.with_version({"properties": {"qty": {"type": qty_type}}}, name, version)
    body = {"settings": index_settings("24h", shards=shards), "mappings": mapping}
    sink.client.indices.create(index=index, body=body)


def _fill(sink: SearchSink, index: str, ids: range, qty: object) -> None:
    lines = []
    for i in ids:
        lines += [{"index": {"_index": index, "_id": str(i)}}, {"qty": qty}]
    got = sink.client.bulk(body=lines, params={"refresh": "true"})
    assert not got["errors"], got["items"][:3]


def _id_field_data_and_open_contexts(sink: SearchSink, index: str) -> tuple[int, int]:
    """The bytes of ``_id`` field data OpenSearch holds for ``index``, and its open search
    contexts (a scroll's, a point in time's)."""
    stats = sink.client.indices.stats(
        index=index, metric="fielddata,search", params={"fielddata_fields": "_id"}
    )["indices"][index]["total"]
    held = stats["fielddata"].get("fields", {}).get("_id", {}).get("memory_size_in_bytes", 0)
    return held, stats["search"]["open_contexts"]


def test_a_version_is_built_beside_and_switched_atomically_twice(sink: SearchSink) -> None:
    name = sink.index_for(T)
    assert v.serving(sink.client, name) is None
    _create(sink, name, "integer", 1)  # as every index before versions: concrete, version 1
    _fill(sink, name, range(ROWS), 7)
    first = v.serving(sink.client, name)
    assert first == v.Serving(name, name, 1) and not first.is_alias
    assert v.building(sink.client, first) is None

    # Version 2 with the new mapping (qty text); the serving index cannot take text.
    nxt = first.next_index
    assert nxt == f"{name}-v2"
    _create(sink, nxt, "keyword", 2)
    assert v.building(sink.client, first) == nxt
    _fill(sink, nxt, range(0, ROWS, 2), "many")  # half of the rows so far
    assert v.missing(sink.client, first, nxt) == ROWS - ROWS // 2  # by count alone
    _fill(sink, nxt, range(ROWS, ROWS + ROWS // 2), "new")  # as many, but other ids
    assert v.missing(sink.client, first, nxt, page=500) == ROWS - ROWS // 2  # by ids
    _fill(sink, nxt, range(1, ROWS, 2), "many")
    assert v.missing(sink.client, first, nxt, page=500) == 0
    # Paged by each shard's sequence numbers: no id of the index loaded into OpenSearch's
    # heap as field data (a sort on _id did, with a deprecation warning that reached the
    # job's output), no search context left open (a scroll needs a cluster privilege).
    assert _id_field_data_and_open_contexts(sink, name) == (0, 0)

    # A searcher counts the table's documents through its name the whole time.
    # A searcher counts the table's documents through its name the whole time, both
    # switches long: from the concrete version 1, then from an alias.
    seen: list[tuple[str, int]] = []
    errors: list[tuple[str, BaseException]] = []
    phase = ["v1"]
    stop = threading.Event()
    searcher_client = OpenSearch(sink.client.transport.hosts)

    def search() -> None:
        while not stop.is_set():
            try:
                seen.append((phase[0], int(searcher_client.count(index=name)["count"])))
            except TransportError as e:
                errors.append((phase[0], e))

    def twenty_more(what: str) -> None:
        start = len(seen)
        wait_until(lambda: len(seen) >= start + 20, timeout=30, what=f"searches {what}")

    searcher = threading.Thread(target=search)
    searcher.start()
    try:
        twenty_more("before the switch")
        phase[0] = "to v2"
        assert v.switch(sink.client, first, nxt) is None  # version 1 went in the same call
        twenty_more("after it")
        second = v.serving(sink.client, name)
        assert second == v.Serving(name, nxt, 2) and second.is_alias
        third = second.next_index
        _create(sink, third, "text", 3)
        _fill(sink, third, range(ROWS + ROWS // 2), "x")
        assert v.missing(sink.client, second, third) == 0
        phase[0] = "to v3"
        retired = v.switch(sink.client, second, third)
        twenty_more("after the switch to v3")
        assert retired == nxt
        v.retire(sink.client, retired)
        phase[0] = "retired"
        twenty_more("after retiring v2")
    finally:
        stop.set()
        searcher.join()
        searcher_client.close()
    # Every answer counted a complete version; only the switch away from a concrete
    # version 1 may fail a search in flight (and then only with a retryable 503).
    assert min(n for _, n in seen) >= ROWS, sorted({n for _, n in seen})[:5]
    assert {n for p, n in seen if p == "retired"} == {ROWS + ROWS // 2}
    assert all(p == "to v2" and e.status_code == 503 for p, e in errors), errors
    assert v.serving(sink.client, name) == v.Serving(name, third, 3)
    assert not sink.client.indices.exists(index=nxt)


def test_the_ids_of_every_shard_are_compared(sink: SearchSink) -> None:
    """An index of three shards: the ids are paged shard by shard (sequence numbers are
    unique within a shard only), each met once, so the documents the next version lacks are
    counted exactly, wherever they lie."""
    name = sink.index_for(T)
    _create(sink, name, "integer", 1, shards=3)
    _fill(sink, name, range(ROWS), 7)
    first = v.serving(sink.client, name)
    assert first is not None
    nxt = first.next_index
    _create(sink, nxt, "keyword", 2, shards=3)
    _fill(sink, nxt, range(0, ROWS, 3), "many")
    _fill(sink, nxt, range(ROWS, ROWS + ROWS), "new")  # more documents, other ids
    assert v.missing(sink.client, first, nxt, page=100) == ROWS - len(range(0, ROWS, 3))
    pages = list(v._ids(sink.client, name, 100))
    ids = [i for p in pages for i in p]
    assert sorted(ids, key=int) == [str(i) for i in range(ROWS)]  # each id once
    assert len(pages) >= 3 * (ROWS // 3 // 100)  # page by page, in each shard
    assert _id_field_data_and_open_contexts(sink, name) == (0, 0)


def test_a_long_name_keeps_its_version_in_the_mapping(sink: SearchSink) -> None:
    name = sink.index_for("public." + "t" * 240)
    nxt = v.version_name(name, 2)
    assert len(nxt.encode()) <= 255 and nxt != name and "--" in nxt  # cut and hashed
    _create(sink, nxt, "keyword", 2)
    sink.client.indices.update_aliases(body={"actions": [{"add": {"index": nxt, "alias": name}}]})
    assert v.serving(sink.client, name) == v.Serving(name, nxt, 2)


# -- the follower's sink with search.evolve_indices ----------------------------------------


def _schema(qty: str) -> dict[str, object]:
    """A Debezium value schema whose row has id (int32) and qty of Connect type ``qty``."""
    row = {
        "type": "struct",
        "field": "after",
        "optional": True,
        "fields": [{"field": "id", "type": "int32"}, {"field": "qty", "type": qty}],
    }
    return {"type": "struct", "fields": [{**row, "field": "before"}, row]}


def _changes(ids: range, qty: object, lsn: int) -> list[Change]:
    return [Change(T, str(i), lsn, i, {"id": i, "qty": qty}) for i in ids]


def test_the_sink_builds_the_next_version_after_a_type_change_and_switches(
    endpoints: Endpoints, index_prefix: str
) -> None:
    rows = 60
    sink = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True, refresh=True)
    try:
        name = sink.index_for(T)
        sink.register_schema(T, _schema("int32"))
        assert {r.outcome for r in sink.apply(_changes(range(rows), 7, 100))} == {Outcome.APPLIED}
        # ALTER COLUMN qty TYPE text: the serving version maps qty as integer.
        sink.register_schema(T, _schema("string"))
        assert v.serving(sink.client, name) == v.Serving(name, name, 1)
        assert v.building(sink.client, v.Serving(name, name, 1)) == f"{name}-v2"
        # Changes in the new shape: applied (to version 2), not dead-lettered, although
        # version 1 refuses them; searches still read version 1, complete.
        got = sink.apply(_changes(range(0, rows, 3), "many", 200))
        assert {r.outcome for r in got} == {Outcome.APPLIED}, got[:2]
        assert sink.advance_builds(force=True) == []  # two thirds of the rows not there yet
        assert sink.client.count(index=name)["count"] == rows
        # A worker that starts now (a restart mid-build) joins the build.
        again = SearchSink(
            endpoints.search_url,
            index_prefix,
            evolve_indices=True,
            refresh=True,
            build_check_interval_s=float("inf"),  # its own writes never check: the driver does
        )
        try:
            again.register_schema(T, _schema("string"))
            # The reader's snapshot after the change brings every other row in the new shape.
            rest = [i for i in range(rows) if i % 3]
            got = again.apply([c for c in _changes(range(rows), "snap", 300) if int(c.key) in rest])
            assert {r.outcome for r in got} == {Outcome.APPLIED}
            assert again.advance_builds() == [] and T in again._builds
        finally:
            again.close()
        # The job's driver, which writes no row, finds the build by its index and switches.
        driver = SearchSink(
            endpoints.search_url, index_prefix, evolve_indices=True, build_check_interval_s=0
        )
        try:
            assert [(s.name, t) for s, t in v.under_way(driver.client, index_prefix)] == [
                (name, f"{name}-v2")
            ]
            driver.maintain()
        finally:
            driver.close()
        assert v.serving(sink.client, name) == v.Serving(name, f"{name}-v2", 2)
        held = {h["_id"]: h["_source"]["qty"] for h in every_document(endpoints.search_url, name)}
        assert len(held) == rows and held["0"] == "many" and held["1"] == "snap", held
        # The first worker learns of the switch at its next check, and writes on.
        assert sink.advance_builds(force=True) == [T]
        assert {r.outcome for r in sink.apply(_changes(range(2), "later", 400))} == {
            Outcome.APPLIED
        }
        assert sink.client.get(index=name, id="1")["_source"]["qty"] == "later"
    finally:
        sink.close()


def test_echoes_into_a_serving_version_made_before_digests_carry_none(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """Version 1 made by an older sink (no _source excludes): while version 2 is built, the
    changes go to version 2 with their row digest and to version 1, as echoes, without it;
    after the switch the name's write alias writes into version 2, digests and all."""
    from pgcdc.core import row_digest

    sink = SearchSink(
        endpoints.search_url,
        index_prefix,
        evolve_indices=True,
        refresh=True,
        build_check_interval_s=float("inf"),  # switched below, when the test says
    )
    try:
        name = sink.index_for(T)
        _create(sink, name, "integer", 1)
        sink.register_schema(T, _schema("int32"))
        assert {r.outcome for r in sink.apply(_changes(range(6), 7, 100))} == {Outcome.APPLIED}
        sink.register_schema(T, _schema("string"))  # ALTER COLUMN qty TYPE text
        nxt = f"{name}-v2"
        assert sink._builds[T][1] == nxt
        # "5" is text for version 2 and a number version 1 still takes: the echoes land.
        got = sink.apply(_changes(range(6), "5", 200))
        assert {r.outcome for r in got} == {Outcome.APPLIED}
        rows = {str(i): {"id": i, "qty": "5"} for i in range(6)}

        def sources(index: str) -> dict[str, object]:
            sink.client.indices.refresh(index=index)
            hits = sink.client.search(index=index, body={"query": {"match_all": {}}})
            return {h["_id"]: h["_source"] for h in hits["hits"]["hits"]}

        assert sources(name) == rows  # the echoes' _source: the rows alone
        held = sink.client.indices.get_mapping(index=name)[name]["mappings"]
        assert row_digest.FIELD not in held["properties"] and "_source" not in held
        assert sources(nxt) == rows
        assert digest_folds(sink.client, nxt) == python_folds(rows)
        assert sink.advance_builds(force=True) == [T]
        assert v.serving(sink.client, name) == v.Serving(name, nxt, 2)
        # Through the name's write alias, now on version 2: the digests go with the rows.
        got = sink.apply(_changes(range(4, 9), "x", 300))
        assert {r.outcome for r in got} == {Outcome.APPLIED}
        rows.update({str(i): {"id": i, "qty": "x"} for i in range(4, 9)})
        assert sources(nxt) == rows
        assert digests_missing(sink.client, nxt) == 0
        assert digest_folds(sink.client, nxt) == python_folds(rows)
    finally:
        sink.close()


def test_an_index_that_only_claims_to_be_a_version_is_never_switched_to(
    sink: SearchSink,
) -> None:
    name = sink.index_for(T)
    _create(sink, name, "integer", 1)
    # Made by someone else under the prefix, its _meta naming the table's index.
    impostor = f"{sink.index_for('public.other')}-v2"
    mapping = v.with_version({"properties": {}}, name, 2)
    sink.client.indices.create(index=impostor, body={"mappings": mapping})
    assert v.under_way(sink.client, sink.index_prefix) == []
    _create(sink, f"{name}-v2", "keyword", 2)
    assert [t for _, t in v.under_way(sink.client, sink.index_prefix)] == [f"{name}-v2"]


def test_without_evolve_a_type_change_is_refused_and_cdc_status_says_so(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """search.evolve_indices = false: the index keeps its mapping, the changes it cannot take
    are refused, and the follower's status names the table until the index is built again
    (what the acceptance's first run did by hand: the index deleted, the table snapshotted)."""
    from cdc.status import problems
    from pgcdc.core.settings import Settings
    from sinks.status import follower_status

    sink = SearchSink(endpoints.search_url, index_prefix, evolve_indices=False, refresh=True)
    settings = Settings(
        search={"url": endpoints.search_url, "index_prefix": index_prefix}  # type: ignore[arg-type]
    )
    slot = {"slot": "s", "exists": True}
    try:
        name = sink.index_for(T)
        sink.register_schema(T, _schema("int32"))
        assert {r.outcome for r in sink.apply(_changes(range(3), 7, 100))} == {Outcome.APPLIED}
        sink.register_schema(T, _schema("string"))  # ALTER COLUMN qty TYPE text
        assert v.building(sink.client, v.Serving(name, name, 1)) is None  # no version built
        got = sink.apply(_changes(range(1), "many-0", 200))
        assert [r.outcome for r in got] == [Outcome.FAILED], got

        def refused_lines() -> list[str]:
            lines = problems({"slot": slot, "followers": follower_status(settings)}, 1 << 40)
            return [x for x in lines if "no longer follows" in x]

        # (the record is searchable at the watermark index's next refresh)
        wait_until(refused_lines, timeout=60, interval=0.2, what="the refused table's line")
        assert refused_lines() == [
            f"follower search_sync: index {name} no longer follows table {T}: qty is integer "
            "in the index, text now; its changes are refused and dead-lettered until the index "
            "is built again (docs/schema-changes.md)"
        ]
        # Built again (deleted; the table's snapshot makes it anew): the line goes.
        sink.client.indices.delete(index=name)
        assert refused_lines() == []
    finally:
        sink.close()


def test_a_version_opensearch_refuses_to_create_is_refused_like_without_versions(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """Creating the next version refused for good (here an index template's field limit, as
    a shard limit or a missing privilege would): the job does not stop; the table's changes
    are refused as without versions, and ``cdc status`` names the table."""
    from pgcdc.core.settings import Settings
    from sinks.status import follower_status

    sink = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True, refresh=True)
    name = sink.index_for(T)
    template = f"{index_prefix}-limit"
    sink.client.transport.perform_request(
        "PUT",
        f"/_index_template/{template}",
        body={
            "index_patterns": [f"{name}-v*"],
            "priority": 900,
            "template": {"settings": {"index.mapping.total_fields.limit": 1}},
        },
    )
    settings = Settings(
        search={"url": endpoints.search_url, "index_prefix": index_prefix}  # type: ignore[arg-type]
    )
    try:
        sink.register_schema(T, _schema("int32"))
        assert {r.outcome for r in sink.apply(_changes(range(3), 7, 100))} == {Outcome.APPLIED}
        sink.register_schema(T, _schema("string"))  # no exception: the job goes on
        assert not sink.client.indices.exists(index=f"{name}-v2")
        assert [r.outcome for r in sink.apply(_changes(range(1), "many", 200))] == [Outcome.FAILED]
        wait_until(
            lambda: follower_status(settings)["search_sync"]["refused_tables"],
            timeout=60,
            interval=0.2,
            what="the table refused in the follower's status",
        )
        (refused,) = follower_status(settings)["search_sync"]["refused_tables"]
        assert refused["index"] == name and refused["columns"] == (
            "qty is integer in the index, text now"
        )
    finally:
        sink.client.transport.perform_request("DELETE", f"/_index_template/{template}")
        sink.close()


def test_a_switch_refused_for_good_keeps_serving_and_cdc_status_says_so(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """The next version holds every document but OpenSearch refuses the switch (here a
    read-only block on version 1, as a missing alias privilege would): the job goes on,
    searches read version 1, and ``cdc status`` names the index until the switch lands."""
    from cdc.status import problems
    from pgcdc.core.settings import Settings
    from sinks.status import follower_status

    sink = SearchSink(
        endpoints.search_url,
        index_prefix,
        evolve_indices=True,
        refresh=True,
        build_check_interval_s=float("inf"),  # its writes never switch: maintain does
    )
    settings = Settings(
        search={"url": endpoints.search_url, "index_prefix": index_prefix}  # type: ignore[arg-type]
    )

    def lines() -> list[str]:
        got = problems({"slot": {"slot": "s"}, "followers": follower_status(settings)}, 1 << 40)
        return [x for x in got if "cannot switch" in x]

    try:
        name = sink.index_for(T)
        sink.register_schema(T, _schema("int32"))
        sink.apply(_changes(range(5), 7, 100))
        sink.register_schema(T, _schema("string"))
        assert {r.outcome for r in sink.apply(_changes(range(5), "many", 200))} == {Outcome.APPLIED}
        sink.client.indices.put_settings(index=name, body={"index.blocks.read_only": True})
        sink.maintain()  # caught up, the switch refused: no exception
        assert v.serving(sink.client, name) == v.Serving(name, name, 1)
        wait_until(lines, timeout=60, interval=0.2, what="the refused switch in the status")
        assert lines() == [
            f"follower search_sync: index {name} cannot switch to version 2 ({name}-v2), "
            "which holds every document (403 cluster_block_exception: index "
            f"[{name}] blocked by: [FORBIDDEN/5/index read-only (api)];); searches read the "
            "version before it, which no longer follows its table (docs/schema-changes.md)"
        ]
        sink.client.indices.put_settings(index=name, body={"index.blocks.read_only": False})
        sink.maintain()  # allowed again: it switches, and the line goes
        assert v.serving(sink.client, name) == v.Serving(name, f"{name}-v2", 2)
        assert lines() == []
    finally:
        if sink.client.indices.exists(index=name):
            sink.client.indices.put_settings(
                index=name, body={"index.blocks.read_only": False}, params={"ignore": 404}
            )
        sink.close()


def test_a_next_version_name_taken_by_another_index_is_never_written_or_switched_to(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """An index of the next version's name that this follower did not make (no version in
    its mapping's _meta): after a type change nothing is written to it and the name never
    reads it; the changes are refused as without versions, and the status names the table."""
    from pgcdc.core.settings import Settings
    from sinks.status import follower_status

    sink = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True, refresh=True)
    settings = Settings(
        search={"url": endpoints.search_url, "index_prefix": index_prefix}  # type: ignore[arg-type]
    )
    try:
        name = sink.index_for(T)
        assert sink.index_for("public.items-v2") != f"{name}-v2"  # a table's never collides
        sink.register_schema(T, _schema("int32"))
        sink.apply(_changes(range(3), 7, 100))
        sink.client.indices.create(index=f"{name}-v2", body={"mappings": {}})  # someone's
        sink.register_schema(T, _schema("string"))
        assert [r.outcome for r in sink.apply(_changes(range(1), "many", 200))] == [Outcome.FAILED]
        sink.maintain()
        assert v.serving(sink.client, name) == v.Serving(name, name, 1)
        sink.client.indices.refresh(index=f"{name}-v2")
        assert sink.client.count(index=f"{name}-v2")["count"] == 0
        wait_until(
            lambda: follower_status(settings)["search_sync"]["refused_tables"],
            timeout=60,
            interval=0.2,
            what="the table refused in the follower's status",
        )
    finally:
        sink.close()


# -- an index, or an alias, deleted under the job -------------------------------------------

_LOST = "was deleted under the search follower: created it again"


def test_an_older_shape_in_flight_is_superseded_in_the_version_being_built(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """qty int → text → bigint while the job streams. One worker meets bigint first: the
    index (integer) refuses it, so version 2 is made for bigint (long), recording the LSN of a
    bigint change. Another worker still holds changes from when qty was text: version 2
    refuses them, and since they committed before that LSN they are of the older shape and
    skipped as superseded (the reader's snapshot brings their rows again as bigint), never
    dead-lettered. A text value committed after it is no older shape: refused as ever."""
    rows = 6
    sink = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True, refresh=True)
    name = sink.index_for(T)
    v2 = f"{name}-v2"
    try:
        sink.register_schema(T, _schema("int32"), 90)
        assert {r.outcome for r in sink.apply(_changes(range(rows), 7, 100))} == {Outcome.APPLIED}
        sink.register_schema(T, _schema("int64"), 300)
        assert T in sink._builds and v.shape_lsn(sink.client, v2) == 300
        assert _indices(sink)[v2][1:3] == (2, "long")
        other = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True, refresh=True)
        try:
            other.register_schema(T, _schema("string"), 200)  # joins the build, reads its LSN
            got = other.apply(
                [*_changes(range(2), "many-1!", 200), *_changes(range(2, 3), "late!", 400)]
            )
        finally:
            other.close()
        assert [r.outcome for r in got] == [Outcome.SKIPPED, Outcome.SKIPPED, Outcome.FAILED]
        assert all("older shape" in (r.reason or "") for r in got[:2]), got
        assert "mapper_parsing_exception" in (got[0].reason or ""), got[0]
        assert "older shape" not in (got[2].reason or "") and got[2].retryable is False
        # The bigint changes and then the snapshot's rows: version 2 whole, switched to.
        assert {r.outcome for r in sink.apply(_changes(range(3, 4), 5_000_000_000, 310))} == {
            Outcome.APPLIED
        }
        got = sink.apply(_changes(range(rows), 8, 500))
        assert {r.outcome for r in got} == {Outcome.APPLIED}, got
        assert sink.advance_builds(force=True) == [T]
        assert v.serving(sink.client, name) == v.Serving(name, v2, 2)
        held = {h["_id"]: h["_source"]["qty"] for h in every_document(endpoints.search_url, name)}
        assert held == {str(i): 8 for i in range(rows)}
    finally:
        sink.close()


def _with_amount(kind: str) -> dict[str, object]:
    """:func:`_schema` (qty int32) with a column ``amount`` of Connect type ``kind``."""
    schema = _schema("int32")
    for row in schema["fields"]:  # type: ignore[attr-defined]
        row["fields"] = [*row["fields"], {"field": "amount", "type": kind, "optional": True}]
    return schema


def _amounts(ids: range, amount: object, lsn: int, kind: str) -> list[Change]:
    schema = _with_amount(kind)
    return [
        Change(T, str(i), lsn, i, {"id": i, "qty": 1, "amount": amount}, schema=schema) for i in ids
    ]


def test_a_new_column_met_first_in_a_newer_shape_supersedes_its_older_shape(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """A column amount is added as text, filled, then its type changed to int, while the job
    streams a topic of several partitions. The worker of the partition ahead meets the int
    shape first: the sink maps amount from that schema (integer), recording the LSN of an
    int change. The worker of a partition behind still holds text changes from before:
    the index refuses them, and since they committed before that LSN they are of an older
    shape and skipped as superseded (the reader's snapshot after the change brings their
    rows as int), never dead-lettered, and no next version is built for the older shape.
    A text change committed after that LSN, or one whose schema is not known, is refused as
    ever. (Before, the column was mapped from the first value written: long.)"""
    rows = 6
    ahead = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True, refresh=True)
    behind = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True, refresh=True)
    name = ahead.index_for(T)
    try:
        ahead.register_schema(T, _schema("int32"), 90)
        assert {r.outcome for r in ahead.apply(_changes(range(rows), 7, 100))} == {Outcome.APPLIED}
        ahead.register_schema(T, _with_amount("int32"), 300)
        amount = ahead.client.indices.get_mapping(index=name)[name]["mappings"]["properties"][
            "amount"
        ]
        assert amount == {"type": "integer", "meta": {"pgcdc_shape_lsn": "300"}}
        got = ahead.apply(_amounts(range(3, rows), 9, 300, "int32"))
        assert {r.outcome for r in got} == {Outcome.APPLIED}, got

        behind.register_schema(T, _with_amount("string"), 200)  # the older shape: no build
        assert T not in behind._builds and list(_indices(behind)) == [name]
        assert behind.refused_tables() == []
        late = _amounts(range(2, 3), "late!", 400, "string")  # after the int change: refused
        unknown = [Change(T, "1", 200, 1, {"id": 1, "qty": 1, "amount": "x"})]  # no schema
        got = behind.apply([*_amounts(range(1), "many-1!", 200, "string"), *unknown, *late])
        assert [r.outcome for r in got] == [Outcome.SKIPPED, Outcome.FAILED, Outcome.FAILED]
        assert "older shape" in (got[0].reason or "") and "mapper_parsing" in (got[0].reason or "")
        assert all("older shape" not in (r.reason or "") and not r.retryable for r in got[1:])

        got = ahead.apply(_amounts(range(rows), 10, 500, "int32"))  # the snapshot's rows
        assert {r.outcome for r in got} == {Outcome.APPLIED}, got
        held = {
            h["_id"]: h["_source"]["amount"] for h in every_document(endpoints.search_url, name)
        }
        assert held == {str(i): 10 for i in range(rows)}
    finally:
        ahead.close()
        behind.close()


def test_a_new_column_met_first_in_its_older_shape_takes_the_newer_one(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """The same change of shape met in commit order: amount is mapped from the text schema
    (text, not guessed from a value), and the int changes after it are written into it."""
    sink = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True, refresh=True)
    name = sink.index_for(T)
    try:
        sink.register_schema(T, _schema("int32"), 90)
        assert {r.outcome for r in sink.apply(_changes(range(3), 7, 100))} == {Outcome.APPLIED}
        sink.register_schema(T, _with_amount("string"), 200)
        got = sink.apply(_amounts(range(3), "many", 200, "string"))
        sink.register_schema(T, _with_amount("int32"), 300)
        got += sink.apply(_amounts(range(3), 11, 300, "int32"))
        assert {r.outcome for r in got} == {Outcome.APPLIED}, got
        props = sink.client.indices.get_mapping(index=name)[name]["mappings"]["properties"]
        assert props["amount"]["type"] == "text" and props["amount"]["meta"] == {
            "pgcdc_shape_lsn": "200"
        }
        assert T not in sink._builds
    finally:
        sink.close()


def _said(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def _indices(sink: SearchSink) -> dict[str, tuple[list[str], object, object, str]]:
    """Every index of the prefix: its aliases, version, qty's type and tombstone time."""
    got = sink.client.indices.get(index=f"{sink.index_prefix}-*")
    return {
        index: (
            sorted(body["aliases"]),
            (body["mappings"].get("_meta") or {}).get(v.META_KEY),
            body["mappings"]["properties"]["qty"]["type"],
            body["settings"]["index"]["gc_deletes"],
        )
        for index, body in got.items()
    }


def _ids(sink: SearchSink, index: str) -> set[str]:
    sink.client.indices.refresh(index=index)
    body = {"size": 1000, "_source": False, "query": {"match_all": {}}}
    return {h["_id"] for h in sink.client.search(index=index, body=body)["hits"]["hits"]}


def _building(endpoints: Endpoints, index_prefix: str, rows: int) -> SearchSink:
    """A sink building version 2 of the table's index: ``rows`` rows written with qty an
    integer, then qty's type changed to text."""
    sink = SearchSink(
        endpoints.search_url,
        index_prefix,
        evolve_indices=True,
        refresh=True,
        build_check_interval_s=float("inf"),
    )
    sink.register_schema(T, _schema("int32"))
    assert {r.outcome for r in sink.apply(_changes(range(rows), 7, 100))} == {Outcome.APPLIED}
    sink.register_schema(T, _schema("string"))
    assert T in sink._builds
    return sink


def test_a_serving_version_or_its_alias_deleted_is_made_again_as_it_was(
    endpoints: Endpoints, index_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The name reads version 2 (an alias). Its index deleted (the aliases go with it): made
    again at version 2 with the table's mapping and both aliases, the refused writes written,
    one WARNING. Its name's alias alone deleted (the follower writes on through its write
    alias): the job's driver makes it read version 2 again, and so does a restarted sink."""
    sink = _building(endpoints, index_prefix, 6)
    name = sink.index_for(T)
    v2 = f"{name}-v2"
    try:
        assert {r.outcome for r in sink.apply(_changes(range(6), "many", 200))} == {Outcome.APPLIED}
        assert sink.advance_builds(force=True) == [T]
        serving = v.Serving(name, v2, 2)
        assert v.serving(sink.client, name) == serving
        caplog.set_level(logging.WARNING, logger="sinks.search")

        sink.client.indices.delete(index=v2)
        got = sink.apply([*_changes(range(2), "x", 300), Change(T, "3", 300, 9, None)])
        assert {r.outcome for r in got} == {Outcome.APPLIED}, got
        assert v.serving(sink.client, name) == serving
        # As made, without the next version's write alias (nothing builds version 3).
        assert _indices(sink) == {v2: ([name, f"{name}-W"], 2, "text", "24h")}
        assert _ids(sink, name) == {"0", "1"}
        assert _said(caplog, _LOST) == [
            f"index {name} {_LOST} as the follower creates it ({v2}, "
            f"version 2, the table's mapping) and wrote the changes it refused; the documents "
            f"it held are gone until `cdc verify --repair` (or `cdc snapshot {T}`) publishes "
            "them again"
        ]

        # The name's alias deleted: writes go on into version 2, and the driver restores it.
        sink.client.indices.delete_alias(index=v2, name=name)
        assert {r.outcome for r in sink.apply(_changes(range(2, 3), "y", 400))} == {Outcome.APPLIED}
        assert v.serving(sink.client, name) is None
        sink.maintain()
        assert v.serving(sink.client, name) == serving and _ids(sink, name) == {"0", "1", "2"}
        # And a sink that starts while it is gone.
        sink.client.indices.delete_alias(index=v2, name=name)
        again = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True)
        try:
            assert {r.outcome for r in again.apply(_changes(range(4, 5), "z", 500))} == {
                Outcome.APPLIED
            }
        finally:
            again.close()
        assert v.serving(sink.client, name) == serving
        assert _ids(sink, name) == {"0", "1", "2", "4"}
        assert len(_said(caplog, "its alias was deleted")) == 2
        assert _indices(sink) == {v2: ([name, f"{name}-W"], 2, "text", "24h")}
        assert len(_said(caplog, _LOST)) == 1
    finally:
        sink.close()


def test_the_next_version_deleted_mid_build_is_made_again_and_switches_only_when_whole(
    endpoints: Endpoints, index_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    rows = 6
    sink = _building(endpoints, index_prefix, rows)
    name = sink.index_for(T)
    v2 = f"{name}-v2"
    try:
        assert {r.outcome for r in sink.apply(_changes(range(3), "many", 200))} == {Outcome.APPLIED}
        caplog.set_level(logging.WARNING, logger="sinks.search")
        sink.client.indices.delete(index=v2)
        got = sink.apply(_changes(range(3, 5), "snap", 300))
        assert {r.outcome for r in got} == {Outcome.APPLIED}, got
        assert _indices(sink) == {
            name: ([f"{name}-W"], None, "integer", "24h"),  # searches read it, untouched
            v2: ([f"{v2}-W"], 2, "text", "24h"),
        }
        assert _ids(sink, v2) == {"3", "4"} and _ids(sink, name) == {str(i) for i in range(rows)}
        (line,) = _said(caplog, "was deleted while it was built")
        assert f"run `cdc snapshot {T}`" in line
        # Lacking the rows it lost, it is not switched to; once they come again, it is.
        assert sink.advance_builds(force=True) == []
        assert {r.outcome for r in sink.apply(_changes(range(rows), "again", 400))} == {
            Outcome.APPLIED
        }
        assert sink.advance_builds(force=True) == [T]
        assert v.serving(sink.client, name) == v.Serving(name, v2, 2)
        assert _ids(sink, name) == {str(i) for i in range(rows)}
        assert set(_indices(sink)) == {v2}
    finally:
        sink.close()


def test_the_serving_version_deleted_mid_build_is_made_again_and_the_build_goes_on(
    endpoints: Endpoints, index_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    rows = 6
    sink = _building(endpoints, index_prefix, rows)
    name = sink.index_for(T)
    v2 = f"{name}-v2"
    try:
        assert {r.outcome for r in sink.apply(_changes(range(rows), "many", 200))} == {
            Outcome.APPLIED
        }
        caplog.set_level(logging.WARNING, logger="sinks.search")
        sink.client.indices.delete(index=name)
        got = sink.apply(_changes(range(rows, rows + 1), "new", 300))
        assert {r.outcome for r in got} == {Outcome.APPLIED}, got
        # Version 1 made again as the sink makes it (its mapping now: qty text).
        assert _indices(sink) == {
            name: ([f"{name}-W"], None, "text", "24h"),
            v2: ([f"{v2}-W"], 2, "text", "24h"),
        }
        assert len(_said(caplog, _LOST)) == 1
        # It holds nothing the next version lacks: the name reads the next version.
        assert sink.advance_builds(force=True) == [T]
        assert v.serving(sink.client, name) == v.Serving(name, v2, 2)
        assert _ids(sink, name) == {str(i) for i in range(rows + 1)}
        assert set(_indices(sink)) == {v2}
    finally:
        sink.close()
