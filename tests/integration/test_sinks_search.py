"""The OpenSearch follower's writer against the real OpenSearch: external versions,
tombstones, unchanged TOAST, dead-letter outcomes, watermarks, search."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from opensearchpy.exceptions import NotFoundError, TransportError

from pgcdc.core import row_digest
from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER
from pgcdc.core.errors import RetryableSinkError, SinkError
from pgcdc.core.search_documents import every_document
from pgcdc.core.settings import SearchSettings
from pgcdc.verify.followers import SearchFollower
from sinks import search as search_module
from sinks import search_index
from sinks.base import Change, OnePerKey
from sinks.cache import hash_fields
from sinks.search import SearchSink
from sinks.search_index import dynamic_mapping, index_settings
from tests.conftest import Endpoints, wait_until
from tests.integration.search_digests import digest_folds, digests_missing, python_folds

pytestmark = pytest.mark.integration

T = "public.orders"


@pytest.fixture
def sink(endpoints: Endpoints, index_prefix: str) -> Iterator[SearchSink]:
    s = SearchSink(endpoints.search_url, index_prefix)
    yield s
    s.close()


def _outcomes(results: list[Any]) -> list[str]:
    return [r.outcome for r in results]


def _doc(sink: SearchSink, key: str, table: str = T) -> dict[str, Any] | None:
    """The held document (a realtime get) with its version, or None."""
    try:
        got = sink.client.get(index=sink.index_for(table), id=key)
    except NotFoundError:
        return None
    return {"version": got["_version"], "source": got["_source"]}


def _all_docs(sink: SearchSink, table: str = T) -> dict[str, Any]:
    sink.refresh_indices(table)
    hits = sink.client.search(
        index=sink.index_for(table),
        body={"query": {"match_all": {}}, "size": 1000, "version": True},
    )["hits"]["hits"]
    return {h["_id"]: (h["_version"], h["_source"]) for h in hits}


def test_creates_updates_and_deletes(sink: SearchSink) -> None:
    results = sink.apply(
        [
            Change(T, "1", 100, 0, {"id": 1, "status": "new", "note": None}),
            Change(T, "2", 100, 1, {"id": 2, "status": "new", "note": "x"}),
        ]
    )
    assert _outcomes(results) == ["applied", "applied"]
    assert _doc(sink, "1") == {
        "version": 100,  # the commit LSN (external_gte)
        "source": {"id": 1, "status": "new", "note": None},
    }
    assert _outcomes(sink.apply([Change(T, "1", 200, 0, {"id": 1, "status": "paid"})])) == [
        "applied"
    ]
    assert _doc(sink, "1") == {"version": 200, "source": {"id": 1, "status": "paid"}}
    assert _outcomes(sink.apply([Change(T, "2", 300, 0, None)])) == ["applied"]
    assert _doc(sink, "2") is None
    settings = sink.client.indices.get_settings(index=sink.index_for(T))
    index = settings[sink.index_for(T)]["settings"]["index"]
    assert (index["number_of_shards"], index["number_of_replicas"], index["gc_deletes"]) == (
        "1",
        "0",
        "24h",
    )


def test_stale_write_is_skipped_and_changes_nothing(sink: SearchSink) -> None:
    sink.apply([Change(T, "1", 0x2_0000_0000, 5, {"id": 1, "status": "newer"})])
    before = _doc(sink, "1")
    results = sink.apply([Change(T, "1", 0x1_FFFF_FFFF, 99, {"id": 1, "status": "older"})])
    results += sink.apply([Change(T, "1", 0x1_FFFF_FFFF, 0, None)])
    assert _outcomes(results) == ["skipped", "skipped"]
    assert _doc(sink, "1") == before


def test_a_later_change_of_the_same_transaction_wins_at_any_order(sink: SearchSink) -> None:
    """The held LSN does not refuse a write of the same transaction: changes of one key come
    in offset order, so it is the newer one (orders past 65535 collided before)."""
    lsn = 0x2_0000_0000
    sink.apply([Change(T, "1", lsn, 5, {"id": 1, "status": "first"})])
    assert _outcomes(sink.apply([Change(T, "1", lsn, 70_000, None)])) == ["applied"]
    assert _doc(sink, "1") is None
    # The re-insert after the delete, in a later batch of the same transaction, comes back.
    again = sink.apply([Change(T, "1", lsn, 140_001, {"id": 1, "status": "re-inserted"})])
    assert _outcomes(again) == ["applied"]
    assert _doc(sink, "1") == {"version": lsn, "source": {"id": 1, "status": "re-inserted"}}
    # An older transaction is still refused, deletes included.
    stale = sink.apply([Change(T, "1", lsn - 1, 0, None)])
    assert _outcomes(stale) == ["skipped"]
    assert _doc(sink, "1") == {"version": lsn, "source": {"id": 1, "status": "re-inserted"}}


def test_lsns_beyond_2_to_the_47_are_exact_and_beyond_2_to_the_63_fail_fast(
    sink: SearchSink,
) -> None:
    """The packed version overflowed at LSN 2**47 and every change was dead-lettered."""
    for lsn in (2**47, 2**47 + 1, 2**63 - 2, 2**63 - 1):
        assert _outcomes(sink.apply([Change(T, "1", lsn, 3, {"id": 1, "lsn": str(lsn)})])) == [
            "applied"
        ]
        assert _doc(sink, "1") == {"version": lsn, "source": {"id": 1, "lsn": str(lsn)}}
    assert _outcomes(sink.apply([Change(T, "1", 2**62, 0, {"id": 1})])) == ["skipped"]
    with pytest.raises(SinkError, match=r"2\*\*63-1"):
        sink.apply([Change(T, "2", 2**63, 0, {"id": 2})])
    assert _doc(sink, "2") is None


def test_replaying_a_batch_changes_nothing(sink: SearchSink) -> None:
    batch = [Change(T, str(i), 500, i, {"id": i, "n": i * 2}) for i in range(50)]
    batch.append(Change(T, "7", 501, 0, None))
    assert _outcomes(sink.apply(batch)).count("applied") == 50
    before = _all_docs(sink)
    assert len(before) == 49 and "7" not in before
    # The same LSNs again: written over with the same values (external_gte), or skipped.
    again = sink.apply(batch)
    assert set(_outcomes(again)) <= {"applied", "skipped"}
    assert _all_docs(sink) == before
    # A batch of an older transaction is refused outright.
    older = [Change(T, str(i), 499, i, {"id": i, "n": -1}) for i in range(50)]
    assert set(_outcomes(sink.apply(older))) == {"skipped"}
    assert _all_docs(sink) == before


def test_same_key_twice_in_a_batch_the_higher_version_wins(sink: SearchSink) -> None:
    results = sink.apply([Change(T, "1", 20, 0, {"v": "new"}), Change(T, "1", 10, 0, {"v": "old"})])
    assert _outcomes(results) == ["applied", "skipped"]
    doc = _doc(sink, "1")
    assert doc is not None and doc["source"] == {"v": "new"}


def test_delete_then_late_older_insert_stays_deleted(sink: SearchSink) -> None:
    sink.apply([Change(T, "1", 10, 0, {"id": 1})])
    assert _outcomes(sink.apply([Change(T, "1", 30, 0, None)])) == ["applied"]
    # The insert was committed before the delete but arrives after it: the tombstone's
    # version (kept for index.gc_deletes) refuses it.
    assert _outcomes(sink.apply([Change(T, "1", 20, 0, {"id": 1, "late": True})])) == ["skipped"]
    assert _doc(sink, "1") is None
    # A delete of a document never held still leaves a tombstone.
    assert _outcomes(sink.apply([Change(T, "5", 50, 0, None)])) == ["applied"]
    assert _outcomes(sink.apply([Change(T, "5", 40, 0, {"id": 5})])) == ["skipped"]
    assert _doc(sink, "5") is None
    # A newer insert (the key re-used) does come back.
    assert _outcomes(sink.apply([Change(T, "1", 40, 0, {"id": 1, "again": True})])) == ["applied"]
    assert _doc(sink, "1") == {"version": 40, "source": {"id": 1, "again": True}}


def test_unchanged_toast_keeps_the_held_value(sink: SearchSink) -> None:
    body = "word " * 20_000
    sink.apply([Change(T, "1", 10, 0, {"id": 1, "body": body, "n": 1})])
    update = Change(
        T, "1", 11, 0, {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "n": 2}, frozenset({"body"})
    )
    (result,) = sink.apply([update])
    assert (result.outcome, result.reason) == ("applied", None)
    assert _doc(sink, "1") == {"version": 11, "source": {"id": 1, "body": body, "n": 2}}
    # A stale partial change is skipped before anything is written.
    stale = Change(
        T, "1", 10, 5, {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "n": 0}, frozenset({"body"})
    )
    assert _outcomes(sink.apply([stale])) == ["skipped"]
    assert _doc(sink, "1") == {"version": 11, "source": {"id": 1, "body": body, "n": 2}}
    sink.refresh_indices(T)
    found = sink.client.count(
        index=sink.index_for(T), body={"query": {"term": {"body": UNAVAILABLE_VALUE_PLACEHOLDER}}}
    )
    assert found["count"] == 0


def test_unchanged_toast_merges_over_an_earlier_change_of_the_same_transaction(
    sink: SearchSink,
) -> None:
    """Held at the change's own LSN: an earlier change of the same transaction (offset
    order), so the partial change is merged over it, at any order."""
    body = "word " * 5_000
    sink.apply([Change(T, "1", 30, 70_000, {"id": 1, "body": body, "n": 1})])
    partial = Change(T, "1", 30, 70_001, {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "n": 2})
    (result,) = sink.apply([partial])
    assert (result.outcome, result.reason) == ("applied", None)
    assert _doc(sink, "1") == {"version": 30, "source": {"id": 1, "body": body, "n": 2}}
    # Hex placeholders (binary.handling.mode=hex) are recognised too, never written.
    hex_partial = Change(
        T, "1", 31, 0, {"id": 1, "body": UNAVAILABLE_VALUE_PLACEHOLDER.encode().hex(), "n": 3}
    )
    assert _outcomes(sink.apply([hex_partial])) == ["applied"]
    assert _doc(sink, "1") == {"version": 31, "source": {"id": 1, "body": body, "n": 3}}


def test_unchanged_toast_without_a_held_doc_leaves_the_column_out(sink: SearchSink) -> None:
    update = Change(
        T, "3", 11, 0, {"id": 3, "body": UNAVAILABLE_VALUE_PLACEHOLDER}, frozenset({"body"})
    )
    (result,) = sink.apply([update])
    assert result.outcome == "applied"
    assert result.reason and "body" in result.reason
    assert _doc(sink, "3") == {"version": 11, "source": {"id": 3}}


def test_a_refused_document_fails_alone(sink: SearchSink) -> None:
    sink.apply([Change(T, "1", 10, 0, {"id": 1, "qty": 3})])  # qty is mapped as a number
    results = sink.apply(
        [
            Change(T, "2", 20, 0, {"id": 2, "qty": 5}),
            Change(T, "3", 20, 1, {"id": 3, "qty": "three"}),
            Change(T, "4", 20, 2, {"id": 4, "qty": 7}),
            Change(T, "x" * 600, 20, 3, {"id": 5}),
            Change("public", "1", 20, 4, {"id": 6}),  # no table id
            Change(T, "6", 20, 5, {"id": object()}),
            Change(T, "7", 2**47, 0, {"id": 7}),  # was too large for the packed version
        ]
    )
    outcomes = _outcomes(results)
    assert outcomes == ["applied", "failed", "applied", "failed", "failed", "failed", "applied"]
    assert "not JSON" in (results[5].reason or "")
    reason = results[1].reason or ""
    assert "mapper_parsing_exception" in reason and "qty" in reason
    assert "512 bytes" in (results[3].reason or "")
    assert "table id" in (results[4].reason or "")
    assert not any(r.retryable for r in results)
    assert _doc(sink, "3") is None
    assert [_doc(sink, k)["source"]["qty"] for k in ("2", "4")] == [5, 7]  # type: ignore[index]


def test_full_text_search_finds_an_indexed_doc(sink: SearchSink) -> None:
    sink.apply(
        [
            Change(T, "1", 10, 0, {"id": 1, "title": "Quick brown fox jumps"}),
            Change(T, "2", 10, 1, {"id": 2, "title": "Lazy dog sleeps"}),
        ]
    )

    def hits() -> list[str]:
        res = sink.client.search(
            index=sink.index_for(T), body={"query": {"match": {"title": "FOX"}}}
        )
        return [h["_id"] for h in res["hits"]["hits"]]

    # refresh=false: the write becomes searchable at the next periodic refresh.
    assert wait_until(hits, timeout=30, what="the fox document to be searchable") == ["1"]


def test_typed_mapping_from_the_connect_schema(endpoints: Endpoints, index_prefix: str) -> None:
    fields = [
        {"type": "int64", "optional": False, "field": "id"},
        {"type": "string", "optional": True, "field": "title"},
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.time.ZonedTimestamp",
            "field": "at",
        },
        {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "field": "at_ms"},
        {"type": "string", "optional": True, "name": "io.debezium.data.Json", "field": "meta"},
        {
            "type": "string",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "field": "price",
        },
    ]
    sink = SearchSink(endpoints.search_url, index_prefix, schemas={T: fields}, refresh=True)
    try:
        results = sink.apply(
            [
                Change(
                    T,
                    "1",
                    10,
                    0,
                    {
                        "id": 1,
                        "title": "a",
                        "at": "2024-05-01T10:20:30.123456Z",
                        "at_ms": "2024-05-01T10:20:30.123000",
                        "meta": '{"k": "v"}',
                        "price": "12.50",
                    },
                ),
                # PostgreSQL's 'infinity' timestamp is kept in _source, not indexed.
                Change(
                    T,
                    "2",
                    10,
                    1,
                    {
                        "id": 2,
                        "title": "b",
                        "at": "infinity",
                        "at_ms": "1970-01-01T00:00:00",
                        "meta": "[]",
                        "price": "0.01",
                    },
                ),
            ]
        )
        assert _outcomes(results) == ["applied", "applied"]
        props = sink.client.indices.get_mapping(index=sink.index_for(T))[sink.index_for(T)][
            "mappings"
        ]["properties"]
        assert props["at"]["type"] == "date" and props["at_ms"]["type"] == "date"
        assert props["price"]["type"] == "double"
        res = sink.client.search(
            index=sink.index_for(T),
            body={"query": {"range": {"at": {"gte": "2024-05-01", "lt": "2024-05-02"}}}},
        )
        assert [h["_id"] for h in res["hits"]["hits"]] == ["1"]
        # Decimals: the exact text in _source, a number in the index for range queries.
        res = sink.client.search(
            index=sink.index_for(T), body={"query": {"range": {"price": {"gte": 10}}}}
        )
        assert [h["_source"]["price"] for h in res["hits"]["hits"]] == ["12.50"]
    finally:
        sink.close()


_LOST = "was deleted under the search follower"


def _lost_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if _LOST in r.getMessage()]


def test_an_index_deleted_under_the_sink_is_made_again_as_the_sink_makes_it(
    endpoints: Endpoints, index_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The index deleted while the job runs: the next writes are refused (never written into
    an index OpenSearch would create with a dynamic mapping), the sink creates the index
    again with its mapping, settings and write alias, logs one WARNING and writes them; the
    documents it held stay gone (cdc verify --repair brings them back)."""
    fields = [
        {"type": "int32", "optional": False, "field": "id"},  # dynamic mapping: long
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "at"},
        {"type": "string", "optional": True, "field": "note"},
    ]
    sink = SearchSink(endpoints.search_url, index_prefix, schemas={T: fields}, refresh=True)
    other = SearchSink(endpoints.search_url, index_prefix, schemas={T: fields}, refresh=True)
    name = sink.index_for(T)
    write = f"{name}-W"

    def row(i: int, lsn: int) -> Change:
        return Change(T, str(i), lsn, i, {"id": i, "at": "2024-05-01T10:20:30Z", "note": "n"})

    def layout() -> dict[str, Any]:
        got = sink.client.indices.get(index=f"{index_prefix}-*")
        return {
            index: (
                sorted(body["aliases"]),
                body["mappings"]["properties"]["id"]["type"],
                body["mappings"]["properties"]["at"].get("format"),
                body["settings"]["index"]["gc_deletes"],
                body["settings"]["index"]["number_of_replicas"],
            )
            for index, body in got.items()
        }

    made = {name: ([write], "integer", "rfc3339_lenient", "24h", "0")}
    try:
        assert _outcomes(sink.apply([row(i, 100) for i in range(1, 4)])) == ["applied"] * 3
        assert _outcomes(other.apply([row(9, 100)])) == ["applied"]  # a second worker
        caplog.set_level(logging.WARNING, logger="sinks.search")
        sink.client.indices.delete(index=name)

        # New rows, a delete of a row the index held, and a change with an unchanged TOAST
        # column: none refused, none dead-lettered.
        held = {"id": 5, "at": "2024-05-01T10:20:30Z"}
        toast = Change(
            T, "5", 200, 9, {**held, "note": UNAVAILABLE_VALUE_PLACEHOLDER}, frozenset({"note"})
        )
        got = sink.apply([row(4, 200), Change(T, "2", 200, 1, None), toast])
        assert _outcomes(got) == ["applied"] * 3, got
        # The index the sink makes (id an integer, at a date of that format, no replica,
        # tombstones kept a day), not one OpenSearch makes on a write (long, a replica).
        assert {i: x[1:] for i, x in layout().items()} == {i: x[1:] for i, x in made.items()}
        assert layout() == made  # with its write alias
        assert set(_all_docs(sink)) == {"4", "5"}  # the rows held before are gone
        assert _doc(sink, "5") == {"version": 200, "source": held}
        # The other worker writes through the alias made again: no warning from it.
        assert _outcomes(other.apply([row(6, 300)])) == ["applied"]
        assert _outcomes(sink.apply([row(7, 300)])) == ["applied"]
        assert set(_all_docs(sink)) == {"4", "5", "6", "7"}
        # The writes sent again into the index made again keep their row digests.
        assert digests_missing(sink.client, name) == 0
        assert _lost_lines(caplog) == [
            f"index {name} {_LOST}: created it again as the follower creates it ({name}, "
            "version 1, the table's mapping) and wrote the changes it refused; the documents "
            "it held are gone until `cdc verify --repair` (or `cdc snapshot public.orders`) "
            "publishes them again"
        ]
        # Its write alias alone deleted: made again, nothing lost, nothing said.
        sink.client.indices.delete_alias(index=name, name=write)
        assert _outcomes(sink.apply([row(8, 400)])) == ["applied"]
        assert layout() == made and len(_all_docs(sink)) == 5
        assert len(_lost_lines(caplog)) == 1
    finally:
        sink.close()
        other.close()


def test_watermark_only_increases(sink: SearchSink) -> None:
    assert sink.read_watermark("job") is None
    sink.record_watermark("job", 0x16_B374_D848)
    sink.record_watermark("job", 0x16_B374_D847)
    assert sink.read_watermark("job") == 0x16_B374_D848
    sink.record_watermark("job", 0x17_0000_0000)
    assert sink.read_watermark("job") == 0x17_0000_0000
    assert sink.read_watermark("other") is None


def test_a_watermark_index_deleted_under_the_sink_is_made_again_as_the_sink_makes_it(
    sink: SearchSink, caplog: pytest.LogCaptureFixture
) -> None:
    index = sink.watermark_index
    sink.record_watermark("job", 0x17_0000_0000)
    sink.client.indices.delete(index=index)
    caplog.set_level(logging.WARNING, logger="sinks.search")
    sink.record_watermark("job", 0x16_0000_0000)  # lower than the lost one: it is all there is
    assert sink.read_watermark("job") == 0x16_0000_0000
    made = sink.client.indices.get(index=index)[index]
    props = made["mappings"]["properties"]
    # The sink's mapping (what OpenSearch would guess: job text, updated_at_ms a long).
    assert (props["job"]["type"], props["updated_at_ms"]["type"]) == ("keyword", "date")
    assert set(made["aliases"]) == {f"{index}-W"}
    assert [r.getMessage() for r in caplog.records if index in r.getMessage()] == [
        f"the watermark index {index} {_LOST}: created it again; each search job records its "
        "watermark again at its next batch (cdc verify and cdc status wait for that)"
    ]


def test_an_unchanged_watermark_is_no_warning(
    sink: SearchSink, caplog: pytest.LogCaptureFixture
) -> None:
    # A batch that did not move the watermark writes it again; OpenSearch answers 409
    # (version conflict), which is the expected outcome and must not log a WARNING.
    sink.record_watermark("job", 0x16_B374_D848)
    with caplog.at_level(logging.DEBUG):
        sink.record_watermark("job", 0x16_B374_D848)
        sink.record_watermark("job", 0x16_B374_D847)
    assert any("409" in r.getMessage() for r in caplog.records)  # the conflict was answered
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert sink.read_watermark("job") == 0x16_B374_D848


def _block_writes(sink: SearchSink, blocked: bool) -> None:
    # OpenSearch answers writes to an index with this block with 429, as when its disk fills.
    sink.client.indices.put_settings(
        index=sink.index_for(T),
        body={"index.blocks.read_only_allow_delete": True if blocked else None},
    )


def test_throttled_documents_are_retried_with_backoff(
    endpoints: Endpoints, index_prefix: str
) -> None:
    delays: list[float] = []
    sink_ref: list[SearchSink] = []

    def sleep(delay: float) -> None:
        # The block is lifted during the first backoff: the retry must then succeed.
        delays.append(delay)
        if len(delays) == 1:
            _block_writes(sink_ref[0], False)

    sink = SearchSink(endpoints.search_url, index_prefix, sleep=sleep, backoff_s=0.01)
    sink_ref.append(sink)
    try:
        sink.apply([Change(T, "1", 10, 0, {"id": 1})])
        _block_writes(sink, True)
        results = sink.apply(
            [Change(T, "1", 20, 0, {"id": 1, "n": 2}), Change(T, "2", 20, 1, {"id": 2})]
        )
        assert _outcomes(results) == ["applied", "applied"]
        assert len(delays) == 1
        assert _doc(sink, "1") == {"version": 20, "source": {"id": 1, "n": 2}}
    finally:
        _block_writes(sink, False)
        sink.close()


def test_documents_still_throttled_after_every_retry_fail_retryable(
    endpoints: Endpoints, index_prefix: str
) -> None:
    delays: list[float] = []
    sink = SearchSink(
        endpoints.search_url, index_prefix, max_attempts=3, backoff_s=0.01, sleep=delays.append
    )
    try:
        sink.apply([Change(T, "1", 10, 0, {"id": 1})])
        _block_writes(sink, True)
        (result,) = sink.apply([Change(T, "1", 20, 0, {"id": 1, "n": 2})])
        assert (result.outcome, result.retryable) == ("failed", True)
        assert result.reason and "cluster_block_exception" in result.reason
        assert len(delays) == 2 and delays[1] > delays[0] / 2  # exponential, with jitter
    finally:
        _block_writes(sink, False)
        sink.close()
    assert _doc(sink, "1") == {"version": 10, "source": {"id": 1}}


def test_an_unreachable_cluster_raises_retryable() -> None:
    delays: list[float] = []
    # Nothing listens on port 1: every attempt is refused at connect.
    sink = SearchSink("http://127.0.0.1:1", "cdc", max_attempts=3, sleep=delays.append)
    try:
        with pytest.raises(RetryableSinkError):
            sink.apply([Change(T, "1", 10, 0, {"id": 1})])
        assert len(delays) == 2
    finally:
        sink.close()


def test_every_document_pages_through_an_index_without_an_id_sort(
    sink: SearchSink, endpoints: Endpoints
) -> None:
    sink.apply([Change(T, str(i), 100 + i, 0, {"id": i, "n": i / 10}) for i in range(7)])
    index = sink.index_for(T)
    base = endpoints.search_url
    # Pages of 3: the scroll is followed past its first page.
    docs = {h["_id"]: h["_source"] for h in every_document(base, index, page=3)}
    assert docs == {str(i): {"id": i, "n": i / 10} for i in range(7)}
    assert list(every_document(base, index + "-absent")) == []


# -- row digests (issue 32) ------------------------------------------------------------------

_F = row_digest.FIELD


def _sources(sink: SearchSink, index: str) -> dict[str, dict[str, Any]]:
    """Every document's _source, by search, checked against a realtime GET of each."""
    sink.client.indices.refresh(index=index)
    hits = sink.client.search(index=index, body={"size": 1000, "query": {"match_all": {}}})
    found = {h["_id"]: h["_source"] for h in hits["hits"]["hits"]}
    for key, source in found.items():
        assert sink.client.get(index=index, id=key)["_source"] == source
    return found


def _keeps_recovery_source(sink: SearchSink, index: str, key: str) -> bool:
    """Whether OpenSearch stored a ``_recovery_source`` for document ``key``: asking for that
    stored field fails where one is (it is in the index but in no mapping), and finds the
    document where none is."""
    try:
        got = sink.client.get(index=index, id=key, params={"stored_fields": "_recovery_source"})
    except TransportError as e:
        if "_recovery_source" not in str(e.info):
            raise
        return True
    assert got["found"]
    return False


def test_each_document_keeps_its_row_digest_out_of_source(sink: SearchSink) -> None:
    """Inserts, an unchanged-TOAST merge and a delete: ``_source`` (search and GET) is
    exactly each row, and OpenSearch's folds of the kept digests per bucket equal those of
    the rows the test wrote; a partial _update by another writer drops the digest."""
    body = "word " * 5_000
    rows = {
        str(i): {
            "id": i,
            "title": f'row {i} \u00e9"',
            "n": i / 7,
            "tags": ["a", str(i)],
            "none": None,
            "ok": i % 2 == 0,
        }
        for i in range(300)
    }
    rows["toast"] = {"id": -1, "body": body, "n": 1}
    rows["empty"] = {}
    got = sink.apply([Change(T, k, 100, i, doc) for i, (k, doc) in enumerate(rows.items())])
    assert set(_outcomes(got)) == {"applied"}
    partial = Change(
        T,
        "toast",
        200,
        0,
        {"id": -1, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "n": 2},
        frozenset({"body"}),
    )
    assert [(r.outcome, r.reason) for r in sink.apply([partial])] == [("applied", None)]
    rows["toast"] = {"id": -1, "body": body, "n": 2}
    assert _outcomes(sink.apply([Change(T, "7", 300, 0, None)])) == ["applied"]
    del rows["7"]

    index = sink.index_for(T)
    assert _sources(sink, index) == rows  # no digest in any _source
    mapping = sink.client.indices.get_mapping(index=index)[index]["mappings"]
    # OpenSearch 2.15+ (the stack's 2.19) keeps no second copy of each document as sent.
    assert mapping["_source"] == {"excludes": [_F], "recovery_source_enabled": False}
    assert not _keeps_recovery_source(sink, index, "0")
    control = f"{index}-recovery-source"  # the layout before, on the same server: it keeps one
    sink.client.indices.create(index=control, body={"mappings": dynamic_mapping()})
    try:
        sink.client.index(index=control, id="0", body={**rows["0"], _F: {"b": 1, "h1": 2}})
        assert _keeps_recovery_source(sink, control, "0")
    finally:
        sink.client.indices.delete(index=control)
    assert set(mapping["properties"][_F]["properties"]) == {"b", "h1", "h2", "h3"}
    folds = digest_folds(sink.client, index)
    assert folds == python_folds(rows)
    assert sum(f[0] for f in folds.values()) == len(rows) and len(folds) > 100
    assert digests_missing(sink.client, index) == 0

    # Another writer's partial update rewrites the document from _source: the digest goes,
    # which is what tells verify to read that document back.
    sink.client.update(index=index, id="3", body={"doc": {"n": 0}}, params={"refresh": "true"})
    assert digests_missing(sink.client, index) == 1
    assert _sources(sink, index)["3"] == {**rows["3"], "n": 0}


def test_a_cluster_that_refuses_the_recovery_source_flag_gets_its_indices_as_before(
    endpoints: Endpoints,
    index_prefix: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that says 2.15+ in a cluster whose manager is older (a rolling upgrade) refuses
    the _source parameter as unknown. The real server refuses a parameter it does not know
    the same way, so the sink is given one under the flag's name: it makes each index
    without it (with its _recovery_source), says so once, and its documents fold as before."""
    unknown = "recovery_source_enabled_in_a_later_release"
    monkeypatch.setattr(search_index, "RECOVERY_SOURCE_FLAG", unknown)
    monkeypatch.setattr(search_module, "RECOVERY_SOURCE_FLAG", unknown)
    caplog.set_level(logging.INFO, logger="sinks.search")
    sink = SearchSink(endpoints.search_url, index_prefix)
    try:
        rows = {str(i): {"id": i, "name": f"n{i}"} for i in range(50)}
        for table in (T, "public.second"):
            changes = [Change(table, k, 100, i, d) for i, (k, d) in enumerate(rows.items())]
            assert set(_outcomes(sink.apply(changes))) == {"applied"}
            index = sink.index_for(table)
            mapping = sink.client.indices.get_mapping(index=index)[index]["mappings"]
            assert mapping["_source"] == {"excludes": [_F]}
            assert _keeps_recovery_source(sink, index, "0")
            assert _sources(sink, index) == rows
            assert digest_folds(sink.client, index) == python_folds(rows)
        refused = [r for r in caplog.records if f"refused _source.{unknown}" in r.getMessage()]
        assert len(refused) == 1  # the first index only: the sink then asks no more
    finally:
        sink.close()


def test_an_index_made_before_digests_gets_the_rows_alone(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """An index an older sink made (no _source excludes, no write alias yet): the sink
    writes rows into it without the digest, which _source would show, and OpenSearch maps
    no digest field in it."""
    sink = SearchSink(endpoints.search_url, index_prefix)
    try:
        index = sink.index_for(T)
        old = {"dynamic": True, "date_detection": False}
        sink.client.indices.create(
            index=index, body={"settings": index_settings(), "mappings": old}
        )
        rows = {str(i): {"id": i, "body": f"b{i}", "n": i} for i in range(20)}
        got = sink.apply([Change(T, k, 100, i, doc) for i, (k, doc) in enumerate(rows.items())])
        assert set(_outcomes(got)) == {"applied"}
        partial = Change(
            T,
            "4",
            200,
            0,
            {"id": 4, "body": UNAVAILABLE_VALUE_PLACEHOLDER, "n": 5},
            frozenset({"body"}),
        )
        assert _outcomes(sink.apply([partial])) == ["applied"]
        rows["4"] = {"id": 4, "body": "b4", "n": 5}
        assert _outcomes(sink.apply([Change(T, "9", 300, 0, None)])) == ["applied"]
        del rows["9"]
        assert _sources(sink, index) == rows
        mapping = sink.client.indices.get_mapping(index=index)[index]["mappings"]
        assert "_source" not in mapping and _F not in mapping["properties"]
        assert set(sink.client.indices.get_alias(index=index)[index]["aliases"]) == {f"{index}-W"}
    finally:
        sink.close()


def test_with_row_digests_off_the_indices_it_makes_keep_none(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """search.row_digests = false: a table's index, typed from its schema or by its first
    values, keeps no digest field and leaves nothing out of _source; its documents are the
    rows, written the general way and the rendered way alike."""
    settings = SearchSettings(
        url=endpoints.search_url, index_prefix=index_prefix, row_digests=False
    )
    typed = "public.typed"
    fields = [
        {"type": "int64", "optional": False, "field": "id"},
        {"type": "string", "optional": True, "field": "body"},
    ]
    sink = SearchSink.from_settings(settings, schemas={typed: fields})
    try:
        assert sink.row_digests is False
        rows = {str(i): {"id": i, "body": f"b{i}"} for i in range(20)}
        for table in (T, typed):
            general = [Change(table, k, 100, i, doc) for i, (k, doc) in enumerate(rows.items())]
            assert set(_outcomes(sink.apply(general))) == {"applied"}
            index = sink.index_for(table)
            mapping = sink.client.indices.get_mapping(index=index)[index]["mappings"]
            assert "_source" not in mapping and _F not in mapping["properties"]
            assert _sources(sink, index) == rows
        # As the native path renders them: with the digest, which the index does not take.
        rendered = [
            Change(typed, k, 200, i, doc, split=True, rendered=_rendered(k, 200, i, doc).rendered)
            for i, (k, doc) in enumerate(rows.items())
        ]
        before = sink.rendered_batches
        assert set(_outcomes(sink.apply(OnePerKey(rendered)))) == {"applied"}
        assert sink.rendered_batches == before + 1  # the rendered way wrote it
        assert _sources(sink, sink.index_for(typed)) == rows
        # cdc verify reads such an index back instead of folding it.
        follower = SearchFollower(sink)
        assert not follower.can_fold(T) and not follower.can_fold(typed)
        assert follower.digests(typed) == {k: follower.digest(k, d) for k, d in rows.items()}
    finally:
        sink.close()


def test_a_bulk_answer_without_errors_is_not_read_item_by_item(sink: SearchSink) -> None:
    """A bulk answer whose ``errors`` is false makes every change of the request applied,
    its items never parsed; one with an error is read item by item."""
    answers: list[Any] = []
    reader = sink.client.transport.serializer
    loads = reader.loads

    def kept(s: str) -> Any:
        answers.append(loads(s))
        return answers[-1]

    reader.loads = kept  # type: ignore[method-assign]
    try:
        # A new document, and a delete of one never held (404 not_found, no error).
        results = sink.apply([Change(T, "1", 100, 0, {"id": 1}), Change(T, "9", 100, 1, None)])
        assert _outcomes(results) == ["applied", "applied"]
        bulk = answers[-1]
        assert bulk["errors"] is False and bulk["items"]._answer is not None  # never parsed
        # Its items, read when asked for, are those OpenSearch answered.
        assert [next(iter(i.values()))["status"] for i in bulk["items"]] == [201, 404]
        # A stale write is an error (409): read item by item, it is skipped.
        results = sink.apply([Change(T, "1", 50, 0, {"id": 1}), Change(T, "2", 100, 0, {"id": 2})])
        assert _outcomes(results) == ["skipped", "applied"]
        assert answers[-1]["errors"] is True and isinstance(answers[-1]["items"], list)
    finally:
        reader.loads = loads  # type: ignore[method-assign]
    assert _doc(sink, "1") == {"version": 100, "source": {"id": 1}}


def _rendered(key: str, lsn: int, order: int, doc: dict[str, Any] | None) -> Change:
    """A change as the native path makes it: its document rendered with it."""
    if doc is None:
        return Change(T, key, lsn, order, None)
    rendered = (
        orjson.dumps(doc),
        hash_fields(doc),
        orjson.dumps(row_digest.stored(key, doc)),
    )
    return Change(T, key, lsn, order, doc, split=True, rendered=rendered)


def test_a_rendered_batch_is_written_as_the_general_way_writes_it(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """The native path's batches (one change a key, each document rendered with it) go in
    without bookkeeping a change: the same documents, versions and row digests as the same
    changes written the general way, with deletes of held and never-held documents."""
    fast = SearchSink(endpoints.search_url, index_prefix)
    general = SearchSink(endpoints.search_url, index_prefix + "-general")
    try:
        rows: dict[str, dict[str, Any] | None] = {
            str(i): {"id": i, "title": f"row {i} \u00e9", "n": i / 3, "ok": i % 2 == 0}
            for i in range(50)
        }
        rows["empty"] = {}
        first = [_rendered(k, 100, i, doc) for i, (k, doc) in enumerate(rows.items())]
        then = [_rendered("3", 200, 0, None), _rendered("never", 200, 1, None)]
        then.append(_rendered("4", 200, 2, {"id": 4, "title": "again"}))
        for batch in (first, then):
            got_fast = fast.apply(OnePerKey(batch))
            got_general = general.apply(list(batch))
            assert got_fast == got_general
            assert set(_outcomes(got_fast)) == {"applied"}
        assert (fast.rendered_batches, general.rendered_batches) == (2, 0)
        assert _all_docs(fast) == _all_docs(general)
        index = fast.index_for(T)
        assert digest_folds(fast.client, index) == digest_folds(
            general.client, general.index_for(T)
        )
        assert digests_missing(fast.client, index) == 0
    finally:
        general.client.indices.delete(index=f"{index_prefix}-general*", ignore_unavailable=True)
        fast.close()
        general.close()


def test_a_rendered_batch_with_a_refused_document_is_written_the_general_way(
    sink: SearchSink,
) -> None:
    """A document refused in a rendered batch: the batch is written again the general way,
    which fails that one alone and applies the others (each write carries its version, so
    the second write of a document is the same write)."""
    sink.apply(OnePerKey([_rendered("1", 10, 0, {"id": 1, "qty": 3})]))
    assert sink.rendered_batches == 1
    batch = [
        _rendered("2", 20, 0, {"id": 2, "qty": 5}),
        _rendered("3", 20, 1, {"id": 3, "qty": "three"}),
        _rendered("4", 20, 2, {"id": 4, "qty": 7}),
    ]
    results = sink.apply(OnePerKey(batch))
    assert _outcomes(results) == ["applied", "failed", "applied"]
    assert "mapper_parsing_exception" in (results[1].reason or "")
    assert sink.rendered_batches == 1  # this one went the general way
    assert _doc(sink, "3") is None
    assert [_doc(sink, k) for k in ("2", "4")] == [
        {"version": 20, "source": {"id": 2, "qty": 5}},
        {"version": 20, "source": {"id": 4, "qty": 7}},
    ]
