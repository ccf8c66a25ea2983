"""Helpers of the golden tests: encode a fixture row and look at one column of the event."""

from __future__ import annotations

from typing import Any

import orjson

from pgcdc.core.settings import SchemaSettings
from schemas.envelope import EventEncoder
from schemas.model import SourceInfo, TableSchema

SOURCE = SourceInfo(
    ts_us=1559033904863123, snapshot="false", txid=555, lsn=24023128, last_commit_lsn=24023119
)
PREFIX = "PostgreSQL_server"


def encoder(**kw: Any) -> EventEncoder:
    return EventEncoder(SchemaSettings(**kw), PREFIX, "postgres")


def value_json(table: TableSchema, row: list[str | None], **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(encoder(**kw).encode_value(table, "c", None, row, SOURCE))
    return out


def row_with(
    table: TableSchema, rows: list[list[str | None]], column: str, n: int = 0
) -> list[str | None]:
    """The n-th fixture row whose ``column`` is not NULL."""
    i = [c.name for c in table.columns].index(column)
    matches = [r for r in rows if r[i] is not None]
    return matches[n]


def field_schema(doc: dict[str, Any], column: str) -> dict[str, Any]:
    after = next(f for f in doc["schema"]["fields"] if f["field"] == "after")
    result: dict[str, Any] = next(f for f in after["fields"] if f["field"] == column)
    return result


def after(doc: dict[str, Any], column: str) -> Any:
    return doc["payload"]["after"][column]


def check(
    all_types: Any,
    column: str,
    expected_schema: dict[str, Any],
    expected_value: Any,
    n: int = 0,
    **kw: Any,
) -> None:
    table, rows = all_types
    doc = value_json(table, row_with(table, rows, column, n), **kw)
    assert field_schema(doc, column) == {**expected_schema, "field": column}
    assert after(doc, column) == expected_value
