"""Debezium's ``message.key.columns``: the Kafka key of tables without a usable key (or
another key than theirs), as ``postgres.message_key_columns`` writes it. :mod:`cdc.keys`
applies the entries to a table and checks them against it."""

from __future__ import annotations

import re
from typing import NamedTuple


class KeyColumns(NamedTuple):
    """One ``message_key_columns`` entry: tables whose ``schema.table`` matches the regular
    expression ``table_pattern`` (the whole name) are keyed by ``columns``, in that order."""

    table_pattern: str
    columns: tuple[str, ...]


def parse_message_key_columns(text: str) -> tuple[KeyColumns, ...]:
    """Debezium's ``message.key.columns`` syntax: ``<table>:<col>,<col>;<table>:<col>``,
    where each ``<table>`` is a regular expression matched against ``schema.table``."""
    rules = []
    for entry in text.split(";"):
        if not entry.strip():
            continue
        pattern, sep, cols = entry.rpartition(":")
        columns = tuple(c.strip() for c in cols.split(",") if c.strip())
        if not sep or not pattern.strip() or not columns:
            raise ValueError(
                f"entry {entry.strip()!r} is not <schema>.<table>:<column>[,<column>...]"
            )
        try:
            re.compile(pattern.strip())
        except re.error as e:
            raise ValueError(
                f"table pattern {pattern.strip()!r} is not a regular expression: {e}"
            ) from e
        rules.append(KeyColumns(pattern.strip(), columns))
    return tuple(rules)
