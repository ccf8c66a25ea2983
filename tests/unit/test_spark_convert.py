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


_TYPED_SCHEMA = {
    "fields": [
        {"field": "d", "type": "int32", "name": "io.debezium.time.Date"},
        {"field": "ts", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        {
            "field": "n",
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2"},
        },
        {
            "field": "a",
            "type": "array",
            "items": {"type": "int32", "name": "io.debezium.time.Date"},
        },
    ]
}
_PLACEHOLDERS = st.sampled_from(
    [PLACEHOLDER, base64.b64encode(PLACEHOLDER.encode()).decode(), PLACEHOLDER.encode().hex()]
)
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    _PLACEHOLDERS,
    st.lists(st.integers(0, 1000) | _PLACEHOLDERS, max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
_COLUMNS = st.sampled_from(["d", "ts", "n", "a", "x", "y"])


@given(
    st.dictionaries(_COLUMNS, _VALUES, max_size=6),
    st.frozensets(_COLUMNS, max_size=2),
)
def test_the_row_converters_quick_way_gives_what_each_column_gives(
    row: dict[str, object], unchanged: frozenset[str]
) -> None:
    """A row with no unchanged column and no placeholder is converted in one step (the
    typed columns only); any row gives what looking at each column gives."""
    conv = RowConverter(_TYPED_SCHEMA)
    typed = {"d": 19723, "ts": 1_704_067_200_123_456, "n": _decimal_bytes(12345), "a": [0]}
    row = {k: typed[k] if k in typed and isinstance(v, int) else v for k, v in row.items()}
    try:
        expected = conv.each_column(row, unchanged)
    except Exception as e:  # a value its type cannot take: refused either way
        with pytest.raises(type(e)):
            conv(row, unchanged)
        return
    got = conv(row, unchanged)
    assert got == expected
    assert list(got[0]) == list(expected[0])  # the columns' order too


def test_only_a_row_that_may_hold_a_placeholder_is_looked_at_column_by_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conv = RowConverter(_TYPED_SCHEMA)
    looked: list[object] = []
    each_column = RowConverter.each_column

    def counted(self: RowConverter, row: dict[str, object], unchanged: frozenset[str]) -> object:
        looked.append(row)
        return each_column(self, row, unchanged)

    monkeypatch.setattr(RowConverter, "each_column", counted)
    assert conv({"d": 0, "x": "text", "y": None}) == (
        {"d": "1970-01-01", "x": "text", "y": None},
        frozenset(),
    )
    assert not looked
    assert conv({"x": PLACEHOLDER}) == ({}, frozenset({"x"}))
    assert conv({"a": [0]}) == ({"a": ["1970-01-01"]}, frozenset())  # a list: not hashable
    assert conv({"x": 1}, frozenset({"x"})) == ({}, frozenset({"x"}))
    assert len(looked) == 3
