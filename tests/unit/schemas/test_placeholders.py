"""Unchanged TOAST placeholders are typed per column, in every binary and decimal mode: text
where the column is text, the placeholder's bytes (as the binary mode writes bytes) where it
is bytes, a one-element array in arrays of text, and null where the type has no room."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from pgcdc.core.contract import (
    UNAVAILABLE_VALUE_PLACEHOLDER,
    UNAVAILABLE_VALUE_PLACEHOLDER_B64,
    UNAVAILABLE_VALUE_PLACEHOLDER_HEX,
)
from pgcdc.core.settings import BinaryHandling, DecimalHandling, SchemaSettings, ValueFormat
from pgcdc.core.values import UNCHANGED_TOAST, RawValue
from schemas.avro import decode_value
from schemas.envelope import EventEncoder
from schemas.model import Column, PgType, SourceInfo, TableSchema

pytestmark = pytest.mark.unit

INT4 = PgType(23, "int4", "b")
TEXT = PgType(25, "text", "b")
NUMERIC = PgType(1700, "numeric", "b")
BYTEA = PgType(17, "bytea", "b")
JSONB = PgType(3802, "jsonb", "b")
INT4_ARRAY = PgType(1007, "_int4", "b", element=INT4)
TEXT_ARRAY = PgType(1009, "_text", "b", element=TEXT)
NUMERIC_ARRAY = PgType(1231, "_numeric", "b", element=NUMERIC)
NUMERIC_10_2 = ((10 << 16) | 2) + 4
PH = UNAVAILABLE_VALUE_PLACEHOLDER
PH_BYTES_JSON = base64.b64encode(PH.encode()).decode()

COLUMNS = (
    Column("id", INT4, -1, False, True),
    Column("t", TEXT, -1, True, False),
    Column("n", NUMERIC, NUMERIC_10_2, True, False),
    Column("n_free", NUMERIC, -1, True, False),
    Column("b", BYTEA, -1, True, False),
    Column("j", JSONB, -1, True, False),
    Column("ints", INT4_ARRAY, -1, True, False),
    Column("texts", TEXT_ARRAY, -1, True, False),
    Column("nums", NUMERIC_ARRAY, NUMERIC_10_2, True, False),
)
TABLE = TableSchema("public", "toasty", COLUMNS, ("id",), "d")
SOURCE = SourceInfo(0, "false", 1, 2, 3)
ROW: tuple[RawValue, ...] = ("1", *[UNCHANGED_TOAST] * (len(COLUMNS) - 1))


def after(**settings: Any) -> dict[str, Any]:
    enc = EventEncoder(SchemaSettings(**settings), "cdc", "db")
    doc = orjson.loads(enc.encode_value(TABLE, "u", None, ROW, SOURCE))
    out: dict[str, Any] = doc["payload"]["after"]
    return out


@pytest.mark.parametrize(
    ("mode", "bytea"),
    [
        (BinaryHandling.BYTES, PH_BYTES_JSON),
        (BinaryHandling.BASE64, UNAVAILABLE_VALUE_PLACEHOLDER_B64),
        (BinaryHandling.HEX, UNAVAILABLE_VALUE_PLACEHOLDER_HEX),
    ],
)
def test_placeholders_are_typed_per_column_in_every_binary_mode(
    mode: BinaryHandling, bytea: str
) -> None:
    a = after(binary_handling_mode=mode)
    assert a["id"] == 1
    assert a["t"] == a["j"] == PH
    assert a["b"] == bytea
    assert a["n"] == PH_BYTES_JSON  # a Decimal is bytes: the placeholder's bytes
    assert a["n_free"] is None  # VariableScaleDecimal is a struct: no room
    assert a["texts"] == [PH]
    assert a["ints"] is None and a["nums"] is None  # arrays of numbers: no room


def test_decimal_modes_give_their_own_placeholder() -> None:
    as_string = after(decimal_handling_mode=DecimalHandling.STRING)
    assert as_string["n"] == as_string["n_free"] == PH
    assert as_string["nums"] == [PH]
    as_double = after(decimal_handling_mode=DecimalHandling.DOUBLE)
    assert as_double["n"] is None and as_double["n_free"] is None and as_double["nums"] is None


def test_avro_carries_the_same_placeholders() -> None:
    enc = EventEncoder(SchemaSettings(value_format=ValueFormat.AVRO), "cdc", "db")
    value = decode_value(enc.plan(TABLE), enc.encode_value(TABLE, "u", None, ROW, SOURCE))
    a = value["after"]
    assert a["t"] == a["j"] == PH and a["b"] == PH.encode()
    assert a["ints"] is None and a["n_free"] is None and a["texts"] == [PH]
    # The decimal's placeholder bytes are written too; Avro readers decode them as a number
    # (the logical type), so only the cdc.unchanged header tells a reader it is one.
    assert a["n"] is not None
