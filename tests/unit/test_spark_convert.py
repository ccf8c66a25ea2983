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


@given(st.integers(min_value=-(10**60), max_value=10**60), st.integers(min_value=-5, max_value=40))
def test_decimal_bytes_decode_exactly(unscaled: int, scale: int) -> None:
    """Exact at any precision: 36-digit values were rounded to 28 digits before (found by
    the real-databases suite: -123456789012345678901234567890.000123)."""
    conv = field_converter(
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": str(scale)},
        }
    )
    text = conv(_decimal_bytes(unscaled))
    exact = Decimal((0 if unscaled >= 0 else 1, tuple(map(int, str(abs(unscaled)))), -scale))
    assert Decimal(text).compare_total(exact) == 0 or Decimal(text) == exact
    assert Decimal(text).as_tuple().digits == exact.as_tuple().digits or unscaled == 0
    var = field_converter({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"})
    if scale >= 0:
        assert Decimal(var({"scale": scale, "value": _decimal_bytes(unscaled)})) == exact


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


def test_connect_temporal_types() -> None:
    # time.precision.mode=connect: Kafka Connect's Date (days), Time and Timestamp (ms), the
    # same follower forms as Debezium's own types.
    date = field_converter({"type": "int32", "name": "org.apache.kafka.connect.data.Date"})
    assert date(19723) == "2024-01-01"
    ts = field_converter({"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"})
    assert ts(1_704_067_200_123) == "2024-01-01T00:00:00.123000"
    t = field_converter({"type": "int32", "name": "org.apache.kafka.connect.data.Time"})
    assert t(86_399_999) == "23:59:59.999000"


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


def test_dates_and_timestamps_of_any_year_take_postgresql_json_form() -> None:
    """Out of Python's years 1..9999 the converters raised OverflowError, which stopped the
    job; the follower now holds what PostgreSQL's to_jsonb writes."""
    from schemas.convert import timestamp_micros, timestamp_millis, to_epoch_days

    date = field_converter({"type": "int32", "name": "io.debezium.time.Date"})
    for text, expected in [
        ("infinity", "infinity"),
        ("-infinity", "-infinity"),
        ("0044-03-15 BC", "0044-03-15 BC"),
        ("4713-01-01 BC", "4713-01-01 BC"),
        ("10000-01-01", "10000-01-01"),
        ("5874897-12-31", "5874897-12-31"),
        ("0001-01-01", "0001-01-01"),
        ("9999-12-31", "9999-12-31"),
    ]:
        assert date(to_epoch_days(text)) == expected, text
    micros = field_converter({"type": "int64", "name": "io.debezium.time.MicroTimestamp"})
    millis = field_converter({"type": "int64", "name": "io.debezium.time.Timestamp"})
    for text, expected in [
        ("infinity", "infinity"),
        ("-infinity", "-infinity"),
        ("0001-01-01 00:00:00 BC", "0001-01-01T00:00:00 BC"),
        ("4713-11-24 00:00:00 BC", "4713-11-24T00:00:00 BC"),
        ("294246-12-31 23:59:59.999999", "294246-12-31T23:59:59.999999"),
        ("10000-01-01 00:00:00.25", "10000-01-01T00:00:00.250000"),
    ]:
        assert micros(timestamp_micros(text)) == expected, text
        ms = expected.replace(".999999", ".999000")
        assert millis(timestamp_millis(text)) == ms, text
    # Past 294247-01-10 the reader caps microseconds at the int64 range, as Debezium does:
    # the value is lost, so the change is refused (dead-lettered), never held wrong.
    with pytest.raises(ValueError, match="capped"):
        micros(2**63 - 1)
    with pytest.raises(ValueError, match="capped"):
        micros(-(2**63))
    assert (
        millis(timestamp_millis("294276-12-31 23:59:59.999999")) == "294276-12-31T23:59:59.999000"
    )


def test_row_converter_takes_the_unchanged_header_and_every_placeholder_form() -> None:
    raw = PLACEHOLDER.encode()
    conv = RowConverter(None)
    doc, unchanged = conv(
        {
            "id": 1,
            "n": None,  # a numeric's placeholder is null: only the header tells
            "hex": raw.hex(),  # binary.handling.mode=hex
            "b64_arr": [base64.b64encode(raw).decode()],
            "text": "plain",
        },
        frozenset({"n", "not_in_row"}),
    )
    assert doc == {"id": 1, "text": "plain"}
    assert unchanged == frozenset({"n", "hex", "b64_arr"})
