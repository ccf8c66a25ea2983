"""Rows of the reduced frame → the sinks' :class:`~sinks.base.Change` objects.

Reduces nothing: every change row is already the newest event of its key
(:func:`spark_jobs.transforms.latest_per_key` is the one reduction of a batch). Runs inside
the Python workers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
from pyspark.sql import Row

from pgcdc.core.contract import VersionOrder
from sinks.base import Change, fill_unchanged, key_id
from spark_jobs.convert import RowConverter, after_schema

# Called with (table, Debezium value schema) the first time a schema is used.
OnNewSchema = Callable[[str, Mapping[str, Any]], None]


class ChangeBuilder:
    """Builds a Change from a change row, decoding Debezium values with the event's own
    schema (the batch's ``schema`` rows, by id)."""

    def __init__(
        self, schemas: Mapping[int, str] | None = None, on_new_schema: OnNewSchema | None = None
    ) -> None:
        self._schemas = schemas or {}
        self._converters: dict[int | None, RowConverter] = {}
        self._on_new_schema = on_new_schema

    def _converter(self, table: str, schema_id: int | None) -> RowConverter:
        conv = self._converters.get(schema_id)
        if conv is None:
            schema_json = self._schemas.get(schema_id) if schema_id is not None else None
            schema = orjson.loads(schema_json) if schema_json else None
            conv = self._converters[schema_id] = RowConverter(after_schema(schema))
            if schema is not None and self._on_new_schema is not None:
                self._on_new_schema(table, schema)
        return conv

    def __call__(self, r: Row) -> Change:
        key = key_id(orjson.loads(r["key_json"]))
        table: str = r["table"]
        if r["is_delete"]:
            return Change(table, key, r["commit_lsn"], r["tx_order"], None)
        conv = self._converter(table, r["schema_id"])
        if not r["history"]:
            doc, unchanged = conv(orjson.loads(r["after_json"]))
            return Change(table, key, r["commit_lsn"], r["tx_order"], doc, unchanged)
        # The newest event left TOASTed columns out: fold the batch's older events of the key
        # in, oldest first, so a value written earlier in the same batch is not lost.
        history = sorted(
            r["history"],
            key=lambda h: (VersionOrder(h["commit_lsn"], h["tx_order"]), h["offset"]),
        )
        changes = []
        for h in history:
            if h["is_delete"] or h["after_json"] is None:
                changes.append(Change(table, key, h["commit_lsn"], h["tx_order"], None))
            else:
                doc, unchanged = conv(orjson.loads(h["after_json"]))
                changes.append(Change(table, key, h["commit_lsn"], h["tx_order"], doc, unchanged))
        return fill_unchanged(changes)
