"""Avro schema names, sanitised the way Debezium does it (topic names: ``pgcdc.core.contract``)."""

from __future__ import annotations

import re

_INVALID_SCHEMA_CHARS = re.compile(r"[^A-Za-z0-9_]")


def schema_name_part(part: str) -> str:
    """One dot-separated part of an Avro-compatible schema name (invalid characters → ``_``)."""
    out = _INVALID_SCHEMA_CHARS.sub("_", part)
    if not out or out[0].isdigit():
        out = "_" + out
    return out


def record_name(prefix: str, schema: str, table: str, suffix: str) -> str:
    """``<prefix>.<schema>.<table>.<suffix>`` as Debezium names Key, Value and Envelope."""
    parts = [*prefix.split("."), schema, table]
    return ".".join(schema_name_part(p) for p in parts) + "." + suffix
