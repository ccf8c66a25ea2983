"""Kafka Connect's vocabulary: schemas as JsonConverter writes them, and a column's codec."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A PostgreSQL text value → its Connect value.
Converter = Callable[[str], Any]
ConnectSchema = dict[str, Any]
# The logical type of a fixed-scale decimal (BYTES holding the unscaled integer).
DECIMAL_NAME = "org.apache.kafka.connect.data.Decimal"
# FLOAT32 and FLOAT64 as JsonConverter names them in a schema ("float32" is refused).
FLOAT = "float"
DOUBLE = "double"


class NonFiniteFloat(float):
    """NaN or ±Infinity. Kafka's JsonConverter (Jackson) writes them as strings."""

    __slots__ = ()

    def json(self) -> str:
        """The string JsonConverter writes for this value."""
        if self != self:
            return "NaN"
        return "Infinity" if self > 0 else "-Infinity"


def connect_schema(
    type_: str,
    optional: bool,
    *,
    name: str | None = None,
    version: int | None = None,
    doc: str | None = None,
    parameters: dict[str, str] | None = None,
    fields: list[ConnectSchema] | None = None,
    items: ConnectSchema | None = None,
    keys: ConnectSchema | None = None,
    values: ConnectSchema | None = None,
) -> ConnectSchema:
    """A Connect schema as JsonConverter writes it, keys in JsonConverter's order."""
    s: ConnectSchema = {"type": type_}
    if fields is not None:
        s["fields"] = fields
    if items is not None:
        s["items"] = items
    if keys is not None:
        s["keys"] = keys
    if values is not None:
        s["values"] = values
    s["optional"] = optional
    if name is not None:
        s["name"] = name
    if version is not None:
        s["version"] = version
    if doc is not None:
        s["doc"] = doc
    if parameters is not None:
        s["parameters"] = parameters
    return s


def with_field(schema: ConnectSchema, field: str) -> ConnectSchema:
    """The schema as a struct member named ``field``."""
    out = dict(schema)
    out["field"] = field
    return out


@dataclass(frozen=True, slots=True)
class Codec:
    """How one column's values become Connect values."""

    schema: ConnectSchema  # without "field"
    convert: Converter | None  # None: the text is the value
    placeholder: Any  # what an unchanged TOAST value becomes
