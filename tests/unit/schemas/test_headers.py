"""Key-change headers as Kafka Connect's SimpleHeaderConverter writes them.

Kafka Connect is the oracle: ``fixtures/simple_headers.json`` holds key structs of every
Connect type a key can have (strings that need escaping, Java's float and double layouts,
decimals small and huge, dates and timestamps before and after 1970, arrays) with what
Connect 4.1.2's ``SimpleHeaderConverter`` wrote for each (``SimpleHeaderCapture.java``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pgcdc.core.settings import HeaderFormat, SchemaSettings
from schemas.envelope import EventEncoder
from schemas.headers import java_big_decimal, java_double, java_float, simple_header
from schemas.model import TableSchema

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent / "fixtures" / "simple_headers.json"
CASES: list[dict[str, Any]] = orjson.loads(FIXTURE.read_bytes())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[orjson.dumps(c["payload"]).decode() for c in CASES])
def test_a_key_renders_as_connect_writes_it(case: dict[str, Any]) -> None:
    assert simple_header(case["schema"], case["payload"]).decode() == case["connect"]


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
    from decimal import Decimal

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
