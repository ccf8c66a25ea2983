"""Dates and zoned timestamps are mapped with OpenSearch's ``rfc3339_lenient`` format
(sinks.search_index): every value the followers give those columns is indexed as
strict_date_optional_time, the format it replaced, indexes it, to the millisecond, but a
zoned timestamp before year 1 or after 9999 (a sign before its year), which stays in
``_source`` and out of the index (as 'infinity' does).

The values are PostgreSQL's own text of timestamptz and date values across their whole range
(years 4713 BC to 294276), through the reader's conversion (schemas.convert) and the jobs'
(spark_jobs.convert), at every fraction width."""

from __future__ import annotations

import logging
import random
from typing import Any

import orjson
import psycopg
import pytest
from opensearchpy import OpenSearch

from schemas.convert import timestamptz_converter
from sinks import search as search_module
from sinks import search_index
from sinks.base import Change, Outcome
from sinks.search import SearchSink
from sinks.search_index import field_mapping
from spark_jobs.convert import field_converter
from tests.conftest import Endpoints

pytestmark = pytest.mark.integration

_STRICT = {"type": "date", "format": "strict_date_optional_time", "ignore_malformed": True}
_ZONED = {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}
_DATE = {"type": "int32", "name": "io.debezium.time.Date"}
_LOCAL = "io.debezium.time.MicroTimestamp"


def _postgres_values(dsn: str) -> tuple[list[str], list[int]]:
    """PostgreSQL's text of timestamptz values (session zone UTC) and date values as days
    since the epoch (what the reader sends for a date): the ends of each range, the years
    around 1, 9999 and 10000, and random ones."""
    rng = random.Random(11)
    # Seconds since the epoch: 4713-11-24 BC .. 294276-12-31, PostgreSQL's timestamptz range.
    lo, hi = -210_866_803_200, 9_224_318_016_000 - 1
    edges = [lo, hi, 0, -1, -62_135_596_800, -62_135_596_801, 253_402_300_799, 253_402_300_800]
    seconds = edges + [rng.randint(lo, hi) for _ in range(300)]
    seconds += [rng.randint(-62_135_596_800, 253_402_300_799) for _ in range(300)]
    micros = [rng.choice([0, 1, 999_999, 120_000, rng.randint(0, 999_999)]) for _ in seconds]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        rows = conn.execute(
            "SELECT (to_timestamp(s) + make_interval(secs => m / 1e6))::text, "
            "(to_timestamp(s) AT TIME ZONE 'UTC')::date - date '1970-01-01' "
            "FROM unnest(%s::float8[], %s::int[]) AS t(s, m)",
            (seconds, micros),
        ).fetchall()
    return [r[0] for r in rows] + ["infinity", "-infinity"], [r[1] for r in rows]


def _indexed(client: OpenSearch, index: str, mapping: dict[str, Any], values: list[str]) -> dict:
    """Each value's indexed instant (epoch ms), None where the index left it out; the
    ``_source`` of each is the value as given."""
    client.indices.create(index=index, body={"mappings": {"properties": {"d": mapping}}})
    body = b"".join(
        orjson.dumps({"index": {"_index": index, "_id": str(i)}})
        + b"\n"
        + orjson.dumps({"d": v})
        + b"\n"
        for i, v in enumerate(values)
    )
    answer = client.bulk(body=body, refresh=True)
    assert not answer["errors"], answer["items"][:3]
    got = client.search(
        index=index,
        body={
            "size": len(values),
            "docvalue_fields": [{"field": "d", "format": "epoch_millis"}],
            "query": {"match_all": {}},
        },
    )["hits"]["hits"]
    assert len(got) == len(values)
    assert all(h["_source"] == {"d": values[int(h["_id"])]} for h in got)
    return {values[int(h["_id"])]: h.get("fields", {}).get("d", [None])[0] for h in got}


def test_dates_and_zoned_timestamps_index_as_strict_dates_did(
    endpoints: Endpoints, index_prefix: str
) -> None:
    texts, days = _postgres_values(endpoints.postgres_dsn)
    to_date = field_converter(_DATE)
    zoned = sorted({timestamptz_converter(w)(t) for t in texts for w in (0, 1, 3, 6)})
    dates = sorted({to_date(d) for d in days} | {"infinity", "-infinity"})
    assert any(v.startswith("+") for v in zoned) and any(v.startswith("-") for v in zoned)
    assert any(v.endswith(" BC") for v in dates) and any(len(v) > 10 for v in dates)

    client = OpenSearch(endpoints.search_url)
    try:
        for name, schema, values in (("zoned", _ZONED, zoned), ("date", _DATE, dates)):
            mapping = field_mapping(schema)
            assert mapping["format"] == "rfc3339_lenient"
            now = _indexed(client, f"{index_prefix}-{name}-rfc", mapping, values)
            before = _indexed(client, f"{index_prefix}-{name}-strict", _STRICT, values)
            differ = {v for v in values if now[v] != before[v]}
            # Only zoned years before 1 or past 9999 ("-0914-07-02T21:41:18Z",
            # "+10000-01-01T00:00:00Z"): out of the index now.
            odd = differ ^ {v for v in values if v[0] in "+-" and v[1].isdigit()}
            assert not odd, [(v, now[v], before[v]) for v in sorted(odd)[:8]]
            assert all(now[v] is None for v in differ)
            # Every other value that is a date in the index is still one.
            assert sum(now[v] is not None for v in values) > len(values) // 2
    finally:
        client.close()


T = "public.events"


def _schema(at: dict[str, Any], *more: dict[str, Any]) -> dict[str, Any]:
    """A Debezium value schema whose row has id (int32), ``at`` and the ``more`` fields."""
    row = {
        "type": "struct",
        "field": "after",
        "optional": True,
        "fields": [{"field": "id", "type": "int32"}, {**at, "field": "at"}, *more],
    }
    return {"type": "struct", "fields": [{**row, "field": "before"}, row]}


def _mapped(sink: SearchSink, field: str) -> list[str | None]:
    """The format of ``field`` in each index of the sink's table, oldest first."""
    got = sink.client.indices.get_mapping(index=f"{sink.index_for(T)}*")
    return [
        body["mappings"]["properties"].get(field, {}).get("format")
        for _, body in sorted(got.items())
    ]


def _indexed_at(sink: SearchSink, key: str) -> list[Any]:
    """The instant (epoch ms) the serving index holds for the row ``key``'s ``at``."""
    sink.client.indices.refresh(index=sink.index_for(T))
    hits = sink.client.search(
        index=sink.index_for(T),
        body={
            "query": {"ids": {"values": [key]}},
            "docvalue_fields": [{"field": "at", "format": "epoch_millis"}],
        },
    )["hits"]["hits"]
    return [h.get("fields", {}).get("at", [None])[0] for h in hits]


def test_a_timestamptz_column_altered_to_timestamp_gets_the_index_s_next_version(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """ALTER COLUMN at TYPE timestamp: its values lose their zone, which the RFC 3339 field
    would leave out of the index, each of them: the follower builds the index's next version
    with a strict_date_optional_time field (sinks.search_index.takes), and the rows written
    since are dates in it."""
    sink = SearchSink(endpoints.search_url, index_prefix, evolve_indices=True, refresh=True)
    try:
        sink.register_schema(T, _schema(_ZONED))
        got = sink.apply([Change(T, "1", 100, 0, {"id": 1, "at": "2024-05-01T10:20:30Z"})])
        assert {r.outcome for r in got} == {Outcome.APPLIED}
        assert _mapped(sink, "at") == ["rfc3339_lenient"]
        sink.register_schema(T, _schema({"type": "int64", "name": _LOCAL}))
        assert _mapped(sink, "at") == ["rfc3339_lenient", "strict_date_optional_time"]
        got = sink.apply([Change(T, "2", 200, 0, {"id": 2, "at": "2024-05-01T10:20:30"})])
        assert {r.outcome for r in got} == {Outcome.APPLIED}
        assert sink.advance_builds(force=True) == []  # row 1 is not in the next version yet
        sink.apply([Change(T, "1", 300, 0, {"id": 1, "at": "2024-05-01T10:20:31"})])
        assert sink.advance_builds(force=True) != []  # switched: searches read version 2
        assert _indexed_at(sink, "2") == ["1714558830000"]
        assert _indexed_at(sink, "1") == ["1714558831000"]
    finally:
        sink.close()


def test_a_server_without_the_rfc3339_format_gets_strict_dates(
    endpoints: Endpoints, index_prefix: str
) -> None:
    """Where the server has no rfc3339_lenient (older OpenSearch, Elasticsearch, a version
    the follower may not read: it is told so here, the rest is this server), the index and
    the columns mapped later take strict_date_optional_time."""
    sink = SearchSink(endpoints.search_url, index_prefix, refresh=True)
    sink._rfc3339 = False  # what _reads_rfc3339 concludes from such a server's answer
    try:
        sink.register_schema(T, _schema(_ZONED))
        got = sink.apply([Change(T, "1", 100, 0, {"id": 1, "at": "2024-05-01T10:20:30Z"})])
        assert {r.outcome for r in got} == {Outcome.APPLIED}
        sink.register_schema(T, _schema(_ZONED, {**_DATE, "field": "born"}))  # ADD COLUMN
        assert _mapped(sink, "at") == _mapped(sink, "born") == ["strict_date_optional_time"]
        assert _indexed_at(sink, "1") == ["1714558830000"]
    finally:
        sink.close()


def _format_of(sink: SearchSink, table: str, field: str) -> str | None:
    """The format ``table``'s index maps ``field`` with."""
    index = sink.index_for(table)
    props = sink.client.indices.get_mapping(index=index)[index]["mappings"]["properties"]
    return props.get(field, {}).get("format")


def test_a_cluster_that_refuses_the_rfc3339_format_gets_strict_dates(
    endpoints: Endpoints,
    index_prefix: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that says 2.12+ in a cluster whose manager is older (a rolling upgrade) refuses
    rfc3339_lenient as an invalid format. The real server refuses a format it does not know
    the same way, so the sinks are given one under the format's name: a column mapped later
    (ADD COLUMN) and an index made later take strict_date_optional_time, each sink says so
    once, and the dates index as before."""
    caplog.set_level(logging.INFO, logger="sinks.search")
    first = SearchSink(endpoints.search_url, index_prefix, refresh=True)
    second = SearchSink(endpoints.search_url, index_prefix, refresh=True)
    try:
        first.register_schema(T, _schema(_ZONED))
        got = first.apply([Change(T, "1", 100, 0, {"id": 1, "at": "2024-05-01T10:20:30Z"})])
        assert {r.outcome for r in got} == {Outcome.APPLIED}
        assert _format_of(first, T, "at") == "rfc3339_lenient"  # taken until now
        unknown = "rfc3339_in_a_later_release"
        monkeypatch.setattr(search_index, "RFC3339_FORMAT", unknown)
        monkeypatch.setattr(search_module, "RFC3339_FORMAT", unknown)
        monkeypatch.setitem(search_index._RFC3339_DATE, "format", unknown)
        first.register_schema(T, _schema(_ZONED, {**_DATE, "field": "born"}))  # ADD COLUMN
        assert _format_of(first, T, "born") == "strict_date_optional_time"
        assert _format_of(first, T, "at") == "rfc3339_lenient"  # the index keeps its own
        other = "public.other"
        second.register_schema(other, _schema(_ZONED, {**_DATE, "field": "born"}))
        got = second.apply(
            [Change(other, "1", 100, 0, {"id": 1, "at": "2024-05-01T10:20:30Z", "born": 19844})]
        )
        assert {r.outcome for r in got} == {Outcome.APPLIED}
        assert _format_of(second, other, "at") == "strict_date_optional_time"
        assert _format_of(second, other, "born") == "strict_date_optional_time"
        second.client.indices.refresh(index=second.index_for(other))
        found = second.client.search(
            index=second.index_for(other),
            body={"query": {"range": {"at": {"gte": "2024-05-01T10:20:30Z"}}}},
        )["hits"]["hits"]
        assert [h["_id"] for h in found] == ["1"]
        refused = [r for r in caplog.records if f"refused the {unknown} date" in r.getMessage()]
        assert len(refused) == 2  # once a sink: each then maps strict dates without asking
    finally:
        first.close()
        second.close()
