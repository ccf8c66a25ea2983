"""Rows of the reduced frame → the sinks' :class:`~sinks.base.Change` objects.

Reduces nothing: every change row is already the newest event of its key
(:func:`spark_jobs.reduce.latest_per_key` is the one reduction of a batch). Runs inside
the Python workers. A row of the native path (``spark.apply = "native"``,
:mod:`spark_jobs.fast_changes`) carries its change built already (``built``): it is taken as
it is, its schema registered as the Python path's would be.

A record that cannot become a change (a key that is not a JSON object, a c/u/r event
without an ``after`` image, a value its schema cannot decode) raises :class:`RecordError`:
the caller dead-letters it with the reason and applies the rest of the batch. A commit LSN
beyond 2**63-1 raises :class:`~pgcdc.core.errors.SinkError` instead: no later change could be
ordered either, so the job stops with that one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from pgcdc.core.contract import VersionOrder, decode_unchanged_header
from pgcdc.core.errors import SinkError
from sinks.base import Change, fill_unchanged, key_id
from spark_jobs.convert import RowConverter, after_schema
from spark_jobs.parse import parsed_after

# Called with (table, Debezium value schema, the commit LSN of the change that uses it) the
# first time a schema is used.
OnNewSchema = Callable[[str, Mapping[str, Any], int], None]

# What a malformed record makes the decoding raise (JSON errors are ValueErrors; a value of
# an unexpected shape gives TypeError, AttributeError or KeyError; a number out of range,
# OverflowError).
_DECODE_ERRORS = (ValueError, TypeError, AttributeError, KeyError, OverflowError)


class RecordError(ValueError):
    """A record no follower can apply; the message says why (it goes to the dead letter)."""


class ChangeBuilder:
    """Builds a Change from a change row, decoding Debezium values with the event's own
    schema (the batch's ``schema`` rows, by id)."""

    def __init__(
        self, schemas: Mapping[int, str] | None = None, on_new_schema: OnNewSchema | None = None
    ) -> None:
        # Not `schemas or {}`: an empty mapping the caller fills as it reads must stay the one read.
        self._schemas = schemas if schemas is not None else {}
        # Per schema id: its converter and the schema itself (what its changes carry).
        self._converters: dict[int | None, tuple[RowConverter, Mapping[str, Any] | None]] = {}
        self._on_new_schema = on_new_schema

    def _converter(
        self, table: str, schema_id: int | None, commit_lsn: int
    ) -> tuple[RowConverter, Mapping[str, Any] | None]:
        known = self._converters.get(schema_id)
        if known is None:
            schema_json = self._schemas.get(schema_id) if schema_id is not None else None
            schema = orjson.loads(schema_json) if schema_json else None
            known = self._converters[schema_id] = (RowConverter(after_schema(schema)), schema)
            if schema is not None and self._on_new_schema is not None:
                self._on_new_schema(table, schema, commit_lsn)
        return known

    def __call__(self, r: Mapping[str, Any]) -> Change:
        """The change of row ``r``; RecordError if it holds none a follower can apply."""
        built = r.get("built") if type(r) is dict else None
        if built is not None:  # the native path's (spark_jobs.fast_changes)
            if built.doc is not None:
                self._converter(r["table"], r["schema_id"], built.commit_lsn)
            return built  # type: ignore[no-any-return]
        table: str = r["table"]
        if r["commit_lsn"] is None:
            raise SinkError(
                f"{r['topic']}[{r['partition']}]@{r['offset']}: the commit LSN header is beyond "
                "2**63-1, past what the followers can order"
            )
        try:
            key = _key(r["key_json"])
            if r["is_delete"]:
                return Change(table, key, r["commit_lsn"], r["tx_order"], None)
            conv, schema = self._converter(table, r["schema_id"], r["commit_lsn"])
            if not r["history"]:
                doc, unchanged = _row(conv, _after(r), r["op"], r["unchanged"])
                return Change(
                    table, key, r["commit_lsn"], r["tx_order"], doc, unchanged, True, schema=schema
                )
            return self._folded(r, table, key)
        except RecordError:
            raise
        except _DECODE_ERRORS as e:
            raise RecordError(f"cannot decode the event: {type(e).__name__}: {e}") from e

    def _folded(self, r: Mapping[str, Any], table: str, key: str) -> Change:
        # The newest event left TOASTed columns out: fold the batch's older events of the key
        # in, oldest first, so a value written earlier in the same batch is not lost. Each is
        # decoded with its own schema (a column's type may differ between them).
        history = sorted(
            r["history"],
            key=lambda h: (VersionOrder(h["commit_lsn"], h["tx_order"]), h["offset"]),
        )
        changes = []
        for h in history:
            after = None if h["is_delete"] else _after(h)
            if after is None:
                changes.append(Change(table, key, h["commit_lsn"], h["tx_order"], None))
            else:
                # A history from before schema ids were kept: the newest event's schema.
                conv, schema = self._converter(
                    table, h.get("schema_id", r["schema_id"]), h["commit_lsn"]
                )
                doc, unchanged = _row(conv, after, None, h["unchanged"])
                lsn, order = h["commit_lsn"], h["tx_order"]
                changes.append(Change(table, key, lsn, order, doc, unchanged, True, schema=schema))
        return fill_unchanged(changes)


def _key(key_json: str | None) -> str:
    """The document id of a record key (its payload), RecordError if it is none."""
    if key_json is None:
        raise RecordError("the record has no key")
    try:
        payload = orjson.loads(key_json)
    except orjson.JSONDecodeError as e:
        raise RecordError(f"the key is not JSON: {e}") from e
    if not isinstance(payload, dict) or not payload:
        raise RecordError("the key is not a JSON object of key columns")
    return key_id(payload)


def _after(r: Mapping[str, Any]) -> Any:
    """The row's ``after`` image (None if null): parsed in the task already (``after``,
    :mod:`spark_jobs.parse`) or JSON text (``after_json``, the JVM's parse)."""
    after = parsed_after(r)
    if after is not None:
        return after
    text = r["after_json"]
    return None if text is None else orjson.loads(text)


def _row(
    conv: RowConverter, after: Any, op: str | None, unchanged_header: str | None
) -> tuple[dict[str, Any], frozenset[str]]:
    """The ``after`` image as a document and its unchanged columns, split: the document holds
    neither those columns nor a placeholder (:class:`RowConverter`), so the Change built from
    them is marked ``split``."""
    if after is None:
        raise RecordError(f"a {op or 'c/u/r'} event without an 'after' image")
    if not isinstance(after, dict):
        raise RecordError("the 'after' image is not a JSON object")
    return conv(after, decode_unchanged_header(unchanged_header))
