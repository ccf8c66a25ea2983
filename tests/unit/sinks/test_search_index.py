"""OpenSearch index names and mappings from Debezium/Connect schemas.

The schemas below are the Connect field schemas Debezium's PostgreSQL connector writes for
these column types (time.precision.mode=adaptive, decimal.handling.mode=string/precise).
"""

from __future__ import annotations

from typing import Any

import pytest

from pgcdc.core import row_digest
from pgcdc.core.contract import table_id
from pgcdc.core.errors import ConfigError, SinkError
from sinks.search_index import (
    check_index_prefix,
    drops_recovery_source,
    dynamic_mapping,
    index_name,
    index_settings,
    keeps_digest,
    mapping_from_connect_schema,
    reads_rfc3339,
    refused_columns,
    row_fields,
    strict_dates,
    with_recovery_source,
    without_recovery_source,
)

pytestmark = pytest.mark.unit

ROW_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "int64", "optional": True, "field": "big"},
    {"type": "int16", "optional": True, "field": "small"},
    {"type": "float64", "optional": True, "field": "score"},
    {"type": "float32", "optional": True, "field": "ratio"},
    {"type": "boolean", "optional": True, "field": "active"},
    {"type": "string", "optional": True, "field": "title"},
    {"type": "bytes", "optional": True, "field": "blob"},
    {
        "type": "int32",
        "optional": True,
        "name": "io.debezium.time.Date",
        "version": 1,
        "field": "born",
    },
    {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroTimestamp",
        "version": 1,
        "field": "seen",
    },
    {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.Timestamp",
        "version": 1,
        "field": "at_ms",
    },
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.time.ZonedTimestamp",
        "version": 1,
        "field": "at",
    },
    {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroTime",
        "version": 1,
        "field": "t",
    },
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.data.Json",
        "version": 1,
        "field": "meta",
    },
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.data.Uuid",
        "version": 1,
        "field": "uid",
    },
    {
        "type": "string",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "price",
    },
    {
        "type": "array",
        "optional": True,
        "items": {"type": "string", "optional": True},
        "field": "tags",
    },
    {
        "type": "struct",
        "optional": True,
        "name": "io.debezium.data.geometry.Point",
        "fields": [
            {"type": "float64", "optional": False, "field": "x"},
            {"type": "float64", "optional": False, "field": "y"},
            {"type": "bytes", "optional": True, "field": "wkb"},
            {"type": "int32", "optional": True, "field": "srid"},
        ],
        "field": "where",
    },
    {
        "type": "map",
        "optional": True,
        "keys": {"type": "string"},
        "values": {"type": "string"},
        "field": "kv",
    },
    {"type": "mystery", "optional": True, "field": "odd"},
]


def test_mapping_types_every_column() -> None:
    m = mapping_from_connect_schema(ROW_FIELDS)
    p = m["properties"]
    assert m["dynamic"] is True and m["date_detection"] is False
    assert p["id"] == {"type": "integer"}
    assert p["big"] == {"type": "long"}
    assert p["small"] == {"type": "short"}
    assert p["score"] == {"type": "double"}
    assert p["ratio"] == {"type": "float"}
    assert p["active"] == {"type": "boolean"}
    assert p["title"]["type"] == "text"
    assert p["title"]["fields"]["keyword"]["type"] == "keyword"
    assert p["blob"] == {"type": "binary"}
    # Dates, timestamps and times arrive as ISO text from spark_jobs/convert.py.
    # Dates and zoned timestamps by OpenSearch's RFC 3339 parser; timestamps without a zone,
    # which it refuses, by java.time's.
    iso = {"type": "date", "format": "strict_date_optional_time", "ignore_malformed": True}
    rfc = {"type": "date", "format": "rfc3339_lenient", "ignore_malformed": True}
    assert p["born"] == rfc
    assert p["seen"] == iso
    assert p["at_ms"] == iso
    assert p["at"] == rfc
    assert p["t"] == {"type": "keyword"}
    assert p["meta"] == {"type": "text"}
    assert p["uid"] == {"type": "keyword"}
    assert p["price"] == {"type": "double", "ignore_malformed": True}  # exact text in _source
    assert p["tags"]["type"] == "text"  # arrays map as their items
    assert p["where"]["type"] == "object"
    assert p["where"]["properties"]["x"] == {"type": "double"}
    assert p["where"]["properties"]["wkb"] == {"type": "binary"}
    assert p["kv"] == {"type": "object", "enabled": False}
    assert p["odd"]["type"] == "text"  # unknown types pass through as strings
    assert set(p) == {f["field"] for f in ROW_FIELDS} | {row_digest.FIELD}


def test_mapping_entries_are_copies() -> None:
    a = mapping_from_connect_schema(ROW_FIELDS)
    a["properties"]["title"]["type"] = "keyword"
    b = mapping_from_connect_schema(ROW_FIELDS)
    assert b["properties"]["title"]["type"] == "text"
    assert a["properties"]["id"] is not b["properties"]["id"]


def test_mapping_refuses_a_nameless_field() -> None:
    with pytest.raises(SinkError, match="no name"):
        mapping_from_connect_schema([{"type": "int32"}])


def test_row_fields_reads_the_after_struct() -> None:
    envelope = {
        "type": "struct",
        "fields": [
            {"type": "struct", "fields": ROW_FIELDS[:2], "optional": True, "field": "before"},
            {"type": "struct", "fields": ROW_FIELDS[:3], "optional": True, "field": "after"},
            {"type": "string", "optional": False, "field": "op"},
        ],
    }
    assert row_fields(envelope) == ROW_FIELDS[:3]
    with pytest.raises(SinkError):
        row_fields({"type": "struct", "fields": []})


def test_index_names() -> None:
    # Plain lower-case names are unchanged; table ids come from topics (contract.table_id).
    assert index_name("cdc", "public.orders") == "cdc-public.orders"
    assert index_name("CDC", "public.orders") == "cdc-public.orders"
    # Was lower-cased (Orders and orders shared an index): upper case is escaped now.
    assert index_name("cdc", "public.Orders") == "cdc-public.-4frders"
    # Names OpenSearch would refuse as they are are encoded, not refused.
    awkward = [
        table_id("public", n) for n in ("a b", "a*", "a:b", '"x"', "a#b", "Orders", "orders")
    ]
    names = [index_name("cdc", t) for t in awkward]
    assert len(set(names)) == len(names)
    for name in names:
        assert name == name.lower() and not set(name) & set('\\/*?"<>| ,#:')
    # The pairs that collided before get indices of their own.
    pairs = [
        (table_id("public", "order.items"), table_id("public.order", "items")),
        (table_id("public", "Café"), table_id("public", "Caf_")),
        (table_id("public", "Orders"), table_id("public", "orders")),
    ]
    for a, b in pairs:
        assert index_name("cdc", a) != index_name("cdc", b)
    # A very long name is shortened (with a hash), never refused.
    long_name = index_name("cdc", table_id("public", "é" * 63))
    assert len(long_name.encode()) <= 255
    assert long_name != index_name("cdc", table_id("public", "é" * 62 + "e"))
    for bad in ("public", "a.b.c"):
        with pytest.raises(SinkError, match="table id"):
            index_name("cdc", bad)
    with pytest.raises(SinkError, match="starts with"):
        index_name("_cdc", "public.t")


def test_index_prefix_check() -> None:
    check_index_prefix("cdc")
    for bad in ("", "_x", "a b", "a/b"):
        with pytest.raises(ConfigError):
            check_index_prefix(bad)


def test_index_settings_keep_tombstones_longer_than_the_default() -> None:
    s = index_settings()["index"]
    assert s["number_of_shards"] == 1 and s["number_of_replicas"] == 0
    assert s["gc_deletes"] == "24h"
    assert s["refresh_interval"] == "1s"
    custom = index_settings(shards=3, replicas=1, refresh_interval="250ms")["index"]
    assert (custom["number_of_shards"], custom["number_of_replicas"]) == (3, 1)
    assert custom["refresh_interval"] == "250ms"
    assert dynamic_mapping() == {
        "dynamic": True,
        "date_detection": False,
        "_source": {"excludes": [row_digest.FIELD]},
        "properties": row_digest.mapping_properties(),
    }


def test_every_table_mapping_keeps_the_row_digest_out_of_source() -> None:
    """Both mappings of a table's index map the digest for aggregations and leave it out
    of ``_source``; the columns' mappings are untouched by it."""
    from sinks.search_versions import with_version

    typed = mapping_from_connect_schema(ROW_FIELDS)
    for mapping in (dynamic_mapping(), typed, with_version(typed, "cdc-public.t", 2, 7)):
        assert keeps_digest(mapping)
        assert mapping["_source"] == {"excludes": [row_digest.FIELD]}
        assert mapping["properties"][row_digest.FIELD] == {
            "properties": {
                "b": {"type": "long"},
                "h1": {"type": "long", "index": False},
                "h2": {"type": "long", "index": False},
                "h3": {"type": "long", "index": False},
            }
        }
    assert {k: v for k, v in typed["properties"].items() if k != row_digest.FIELD} == {
        f["field"]: typed["properties"][f["field"]] for f in ROW_FIELDS
    }
    # Mappings as an index made before the digest has them (or with other excludes).
    assert not keeps_digest({"dynamic": True, "properties": {"id": {"type": "long"}}})
    assert not keeps_digest({"_source": {"excludes": ["other"]}})
    assert not keeps_digest({"_source": {"enabled": True}})
    assert len(row_digest.FIELD.encode()) > 63  # never a PostgreSQL column's name


def test_the_digest_field_is_never_compared_as_a_column() -> None:
    """An index's live properties hold the digest's object: no column is judged by it."""
    live = mapping_from_connect_schema(ROW_FIELDS)["properties"]
    assert refused_columns(live, ROW_FIELDS) == []
    # A row struct that named it (no PostgreSQL table can) is still not refused by it.
    odd = [{"field": row_digest.FIELD, "type": "string"}]
    assert refused_columns(live, odd) == []


# GET / as servers answer it: OpenSearch 2.19.6 (the stack's, captured), 2.11.1, and
# Elasticsearch 7.10.2 (no distribution field).
_OPENSEARCH_2_19 = {
    "name": "stack-1",
    "cluster_name": "cdc-stack",
    "cluster_uuid": "48OXMl03Qkq7Ulj3KFZLXQ",
    "version": {
        "distribution": "opensearch",
        "number": "2.19.6",
        "build_type": "zip",
        "build_hash": "97d3c13bf22a4a72ac11dc503fe44c97662b9161",
        "build_date": "2026-07-01T04:27:16.038403104Z",
        "build_snapshot": False,
        "lucene_version": "9.12.3",
        "minimum_wire_compatibility_version": "7.10.0",
        "minimum_index_compatibility_version": "7.0.0",
    },
    "tagline": "The OpenSearch Project: https://opensearch.org/",
}


@pytest.mark.parametrize(
    ("version", "reads"),
    [
        (_OPENSEARCH_2_19["version"], True),
        ({"distribution": "opensearch", "number": "2.12.0"}, True),
        ({"distribution": "opensearch", "number": "3.0.0"}, True),
        ({"distribution": "opensearch", "number": "2.11.1"}, False),
        ({"distribution": "opensearch", "number": "1.3.20"}, False),
        ({"number": "7.10.2", "build_flavor": "oss"}, False),  # Elasticsearch
        ({"distribution": "opensearch", "number": "unknown"}, False),
        ({}, False),
    ],
)
def test_the_rfc3339_date_format_is_used_where_the_server_has_it(
    version: dict[str, Any], reads: bool
) -> None:
    assert reads_rfc3339({**_OPENSEARCH_2_19, "version": version}) is reads


@pytest.mark.parametrize(
    ("version", "drops"),
    [
        (_OPENSEARCH_2_19["version"], True),
        ({"distribution": "opensearch", "number": "2.15.0"}, True),
        ({"distribution": "opensearch", "number": "3.0.0"}, True),
        ({"distribution": "opensearch", "number": "2.14.0"}, False),
        ({"distribution": "opensearch", "number": "2.12.0"}, False),
        ({"number": "8.15.0", "build_flavor": "default"}, False),  # Elasticsearch
        ({}, False),
    ],
)
def test_an_index_keeps_no_recovery_source_where_the_server_takes_that(
    version: dict[str, Any], drops: bool
) -> None:
    assert drops_recovery_source({**_OPENSEARCH_2_19, "version": version}) is drops


def test_only_a_mapping_that_filters_source_is_told_to_keep_no_recovery_source() -> None:
    ours = dynamic_mapping()
    kept = without_recovery_source(ours)
    assert kept["_source"] == {"excludes": [row_digest.FIELD], "recovery_source_enabled": False}
    assert {k: v for k, v in kept.items() if k != "_source"} == {
        k: v for k, v in ours.items() if k != "_source"
    }
    assert ours["_source"] == {"excludes": [row_digest.FIELD]}  # the mapping given is left
    assert keeps_digest(kept)
    assert with_recovery_source(kept) == ours  # what a cluster that refuses the flag is sent
    assert with_recovery_source(ours) == ours
    # A mapping whose _source is the document sent has no second copy to drop.
    assert without_recovery_source(dynamic_mapping(digest=False)) == dynamic_mapping(digest=False)
    typed = mapping_from_connect_schema(ROW_FIELDS, digest=False)
    assert without_recovery_source(typed) == typed


def _field(name: str) -> dict[str, Any]:
    return next(f for f in ROW_FIELDS if f["field"] == name)


def test_a_server_without_the_rfc3339_format_gets_strict_dates_nested_ones_too() -> None:
    fields = [
        *ROW_FIELDS,
        {"type": "struct", "field": "span", "fields": [{**_field("born"), "field": "since"}]},
    ]
    m = mapping_from_connect_schema(fields)
    assert m["properties"]["span"]["properties"]["since"]["format"] == "rfc3339_lenient"
    strict = strict_dates(m)
    iso = {"type": "date", "format": "strict_date_optional_time", "ignore_malformed": True}
    p = strict["properties"]
    assert p["born"] == p["seen"] == p["at"] == p["span"]["properties"]["since"] == iso
    # Nothing else changes, and the mapping given is left as it was.
    assert {k: v for k, v in p.items() if k not in ("born", "at", "span")} == {
        k: v for k, v in m["properties"].items() if k not in ("born", "at", "span")
    }
    assert m["properties"]["born"]["format"] == "rfc3339_lenient"
