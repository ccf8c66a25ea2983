"""Debezium payload values → follower values (spark_jobs/convert.py)."""

from __future__ import annotations

import base64
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER as PLACEHOLDER
from spark_jobs.convert import RowConverter, after_schema, field_converter

pytestmark = pytest.mark.unit


def _decimal_bytes(unscaled: int) -> str:
    n = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(n, "big", signed=True)).decode()


@given(st.integers(min_value=-(10**30), max_value=10**30), st.integers(min_value=0, max_value=12))
def test_decimal_bytes_decode_exactly(unscaled: int, scale: int) -> None:
    conv = field_converter(
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": str(scale)},
        }
    )
    assert Decimal(conv(_decimal_bytes(unscaled))) == Decimal(unscaled).scaleb(-scale)


def test_known_debezium_encodings() -> None:
    # Values as Debezium's PostgreSQL connector documents them (Data type mappings).
    assert (
        field_converter({"type": "int32", "name": "io.debezium.time.Date"})(19723) == "2024-01-01"
    )
    ts = field_converter({"type": "int64", "name": "io.debezium.time.MicroTimestamp"})
    assert ts(1_704_067_200_123_456) == "2024-01-01T00:00:00.123456"
    ms = field_converter({"type": "int64", "name": "io.debezium.time.Timestamp"})
    assert ms(1_704_067_200_123) == "2024-01-01T00:00:00.123000"
    t = field_converter({"type": "int64", "name": "io.debezium.time.MicroTime"})
    assert t(3_723_000_001) == "01:02:03.000001"
    var = field_converter({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"})
    assert var({"scale": 2, "value": _decimal_bytes(-12345)}) == "-123.45"
    arr = field_converter(
        {"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}}
    )
    assert arr([0, 1]) == ["1970-01-01", "1970-01-02"]
    plain = field_converter({"type": "string"})
    assert plain("x") == "x"


def test_row_converter_marks_unchanged_toast_and_never_keeps_the_placeholder() -> None:
    envelope = {
        "type": "struct",
        "fields": [
            {"field": "before", "type": "struct", "fields": []},
            {
                "field": "after",
                "type": "struct",
                "fields": [
                    {"field": "id", "type": "int32"},
                    {"field": "body", "type": "string"},
                    {"field": "blob", "type": "bytes"},
                    {"field": "tags", "type": "array", "items": {"type": "string"}},
                    {"field": "day", "type": "int32", "name": "io.debezium.time.Date"},
                ],
            },
        ],
    }
    conv = RowConverter(after_schema(envelope))
    placeholder_b64 = base64.b64encode(PLACEHOLDER.encode()).decode()
    doc, unchanged = conv(
        {"id": 1, "body": PLACEHOLDER, "blob": placeholder_b64, "tags": [PLACEHOLDER], "day": None}
    )
    assert doc == {"id": 1, "day": None}
    assert unchanged == frozenset({"body", "blob", "tags"})


def test_schemaless_rows_pass_through() -> None:
    doc, unchanged = RowConverter(None)({"id": 7, "name": "n"})
    assert doc == {"id": 7, "name": "n"} and unchanged == frozenset()
