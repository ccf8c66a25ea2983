"""Key-change headers as Kafka Connect's SimpleHeaderConverter writes them.

Kafka Connect is the oracle: ``fixtures/simple_headers.json`` holds key structs of every
Connect type a key can have (strings that need escaping, Java's float and double layouts,
decimals small and huge, dates and timestamps before and after 1970, arrays) with what
Connect 4.1.2's ``SimpleHeaderConverter`` wrote for each (``SimpleHeaderCapture.java``).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgcdc.core.settings import HeaderFormat, SchemaSettings
from schemas.envelope import EventEncoder
from schemas.headers import (
    connect_text,
    java_big_decimal,
    java_double,
    java_float,
    reads_back_as_map,
    simple_header,
)
from schemas.model import TableSchema

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent / "fixtures" / "simple_headers.json"
CASES: list[dict[str, Any]] = orjson.loads(FIXTURE.read_bytes())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[orjson.dumps(c["payload"]).decode() for c in CASES])
def test_a_key_renders_as_connect_writes_it(case: dict[str, Any]) -> None:
    assert connect_text(case["schema"], case["payload"]) == case["connect"]
    header = simple_header(case["schema"], case["payload"]).decode()
    if reads_back_as_map(case["schema"], case["payload"]):
        assert header == case["connect"]
    else:  # Connect's form as a JSON string: Connect's parser reads it as that string
        assert header.startswith('"') and orjson.loads(header) == case["connect"]


def _key(*fields: tuple[str, dict[str, Any], Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = {
        "type": "struct",
        "fields": [{**s, "optional": False, "field": name} for name, s, _ in fields],
    }
    return schema, {name: value for name, _, value in fields}


DATE = {"type": "int32", "name": "org.apache.kafka.connect.data.Date"}
DECIMAL = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal"}


@pytest.mark.parametrize(
    ("fields", "connects_form"),
    [
        ((("id", {"type": "int32"}, 5),), True),
        ((("a", {"type": "int64"}, 1), ("b", {"type": "int16"}, -2)), True),
        ((("a", {"type": "string"}, 'q"uote, {x}'), ("b", {"type": "string"}, "y")), True),
        ((("a", {"type": "boolean"}, True), ("b", {"type": "boolean"}, False)), True),
        ((("day", DATE, 19_000),), True),
        # Mixed kinds: Connect's parser leaves the map without a value schema.
        ((("region", {"type": "string"}, "us"), ("seq", {"type": "int32"}, 1001)), False),
        (
            (
                ("id", {"type": "string"}, "6f1ed002-ab5b-4f6e-b56b-8a1b8a7e8b8e"),
                ("day", DATE, 19_000),
            ),
            False,
        ),
        # Texts the parser may take for a date (by length: 10, 13 or 24), or a time.
        ((("a", {"type": "string"}, "2024-01-01"), ("b", {"type": "string"}, "x")), False),
        ((("a", {"type": "string"}, "12:00:00.000Z"), ("b", {"type": "string"}, "x")), False),
        # Escaped as Values escapes it, a backslash before a colon ("\\\\:") is one unit
        # shorter to the parser ("\\:" becomes ":"): 12 units here, a text, not 13.
        ((("a", {"type": "string"}, "abcdefghij\\:"), ("b", {"type": "string"}, "x")), True),
        ((("2024-01-01", {"type": "int32"}, 1), ("id", {"type": "int32"}, 2)), False),
        # Outside the long range an integer is a Decimal to Connect's parser.
        ((("a", {"type": "int64"}, 1), ("b", DECIMAL, Decimal(2**63))), False),
        ((("a", {"type": "int64"}, 1), ("b", DECIMAL, Decimal(2**63 - 1))), True),
    ],
)
def test_connects_form_is_kept_only_where_connect_reads_it_back(
    fields: tuple[tuple[str, dict[str, Any], Any], ...], connects_form: bool
) -> None:
    schema, payload = _key(*fields)
    assert reads_back_as_map(schema, payload) is connects_form
    header = simple_header(schema, payload).decode()
    text = connect_text(schema, payload)
    assert header == (text if connects_form else orjson.dumps(text).decode())


def test_the_fixture_covers_every_kind_of_key_field() -> None:
    kinds = {
        f.get("name") or f["type"] for c in CASES for f in c["schema"]["fields"] if "field" in f
    }
    assert {
        "int16",
        "int32",
        "int64",
        "boolean",
        "string",
        "double",
        "float",
        "bytes",
        "array",
        "org.apache.kafka.connect.data.Decimal",
        "io.debezium.data.VariableScaleDecimal",
        "org.apache.kafka.connect.data.Date",
        "org.apache.kafka.connect.data.Time",
        "org.apache.kafka.connect.data.Timestamp",
    } <= kinds, kinds


def test_java_number_layouts() -> None:
    # Java's documented outputs, beside what the fixture covers.
    assert [java_double(x) for x in (float("nan"), float("inf"), -0.0, 1e7, 1e-3, 123.0)] == [
        "NaN",
        "Infinity",
        "-0.0",
        "1.0E7",
        "0.001",
        "123.0",
    ]
    assert java_float(0.1) == "0.1" and java_float(1e10) == "1.0E10"
    assert [java_big_decimal(Decimal(t)) for t in ("1E+3", "0.0000001", "-12.50")] == [
        "1E+3",
        "1E-7",
        "-12.50",
    ]


def test_a_key_change_header_follows_header_format(
    all_types: tuple[TableSchema, list[list[str | None]]],
) -> None:
    table, rows = all_types
    row = rows[0]
    simple = EventEncoder(SchemaSettings(), "p", "db")
    key = simple.encode_key(table, row)
    header = simple.key_header(table, row, key)
    assert header is not None and key is not None
    payload = orjson.loads(key)["payload"]
    # The same fields as the key's payload, without JsonConverter's schema envelope.
    assert header.startswith(b"{") and b'"schema"' not in header
    assert all(f'"{name}":'.encode() in header for name in payload)
    as_json = EventEncoder(SchemaSettings(header_format=HeaderFormat.JSON), "p", "db")
    assert as_json.key_header(table, row, key) == key
