"""Which column changes a live search index cannot take (issue 38): the rule behind the
``cdc status`` line for a table whose index no longer follows it."""

from __future__ import annotations

from typing import Any

import pytest

from sinks.search_index import field_mapping, refused_columns, takes

pytestmark = pytest.mark.unit


def _m(connect_type: str, **extra: Any) -> dict[str, Any]:
    return field_mapping({"type": connect_type, **extra})


@pytest.mark.parametrize(
    ("held", "now", "ok"),
    [
        ("int32", "int32", True),
        ("int64", "int32", True),  # narrower whole numbers fit
        ("int32", "int64", False),  # 2**40 does not fit an integer field
        ("double", "int32", True),
        ("float", "double", False),
        ("int32", "double", False),  # 1.5 into an integer field
        ("string", "int32", True),  # a text field takes any scalar as text
        ("int32", "string", False),  # 'many-3' into an integer field
        ("boolean", "string", False),
    ],
)
def test_what_an_index_field_takes(held: str, now: str, ok: bool) -> None:
    assert takes(_m(held), _m(now)) is ok


_ZONED = {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}
_DATE = {"type": "int32", "name": "io.debezium.time.Date"}
_LOCAL = {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}


@pytest.mark.parametrize(
    ("held", "now", "ok"),
    [
        (_ZONED, _ZONED, True),
        (_DATE, _ZONED, True),  # ALTER COLUMN d TYPE timestamptz: both RFC 3339
        (_LOCAL, _ZONED, True),  # java.time's parser reads every RFC 3339 value
        (_LOCAL, _DATE, True),
        # ALTER COLUMN TYPE timestamp: a timestamp without a zone is no RFC 3339 date, each
        # would be left out of the index: the index's next version maps it.
        (_ZONED, _LOCAL, False),
        (_DATE, _LOCAL, False),
    ],
)
def test_an_rfc3339_date_field_takes_only_values_with_a_zone(
    held: dict[str, Any], now: dict[str, Any], ok: bool
) -> None:
    assert takes(field_mapping(held), field_mapping(now)) is ok


def test_a_struct_is_judged_field_by_field() -> None:
    point = {"type": "struct", "fields": [{"field": "x", "type": "double"}]}
    wider = {"type": "struct", "fields": [{"field": "x", "type": "string"}]}
    assert takes(field_mapping(point), field_mapping(point))
    assert not takes(field_mapping(point), field_mapping(wider))
    assert not takes(field_mapping(point), _m("string"))


def test_refused_columns_name_each_column_the_index_refuses() -> None:
    live = {"id": _m("int32"), "qty": _m("int32"), "name": _m("string")}
    fields = [
        {"field": "id", "type": "int32"},
        {"field": "qty", "type": "string"},  # ALTER COLUMN qty TYPE text
        {"field": "tags", "type": "array", "items": {"type": "string"}},  # added: dynamic
    ]
    assert refused_columns(live, fields) == [("qty", "integer", "text")]
    assert refused_columns(live, fields[:1]) == []


def test_a_schema_of_a_table_no_index_can_hold_never_stops_the_job() -> None:
    from sinks.search import SearchSink

    # No server is asked: the table id gives no index name, so there is nothing to check
    # (its changes are refused with the reason when applied).
    sink = SearchSink("http://127.0.0.1:9", "cdc")
    try:
        sink.register_schema("not-a-table-id", {"fields": [{"field": "after", "fields": []}]})
    finally:
        sink.close()
