"""A key's older events in one micro-batch, folded in for a TOASTed column the newest event
left out, are decoded each with its own schema (issue 20, finding 8): a column's type may
have changed between them (here numeric(10,0) to numeric(12,2), the value's scale with it).
Pure code: the reduction and the change builder, no Spark session."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from pgcdc.core.contract import encode_unchanged_header
from spark_jobs.changes import ChangeBuilder
from spark_jobs.reduce import latest_per_key
from spark_jobs.transforms import CHANGE, SCHEMA

pytestmark = pytest.mark.unit


def _schema(scale: int) -> dict[str, Any]:
    body = {
        "field": "body",
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": str(scale), "connect.decimal.precision": "40"},
    }
    after = {
        "field": "after",
        "type": "struct",
        "optional": True,
        "fields": [{"field": "id", "type": "int32"}, body, {"field": "n", "type": "int32"}],
    }
    return {"type": "struct", "fields": [after]}


def _decimal(unscaled: int) -> str:
    return base64.b64encode(unscaled.to_bytes(8, "big", signed=True)).decode()


def _event(offset: int, lsn: int, schema_id: int, after: dict[str, Any], unchanged: str | None):
    return {
        "kind": CHANGE,
        "topic": "shop.public.docs",
        "table": "public.docs",
        "partition": 0,
        "offset": offset,
        "key_json": '{"id":1}',
        "is_delete": False,
        "op": "u",
        "after_json": orjson.dumps(after).decode(),
        "unchanged": unchanged,
        "schema_id": schema_id,
        "value_schema_json": orjson.dumps(_schema(0 if schema_id == 1 else 2)).decode(),
        "commit_lsn": lsn,
        "tx_order": 0,
        "source_ts_ms": 0,
        "raw_value": None,
        "parse_error": None,
        "heartbeat_lsn": None,
    }


def test_older_events_of_a_key_are_decoded_with_their_own_schema() -> None:
    held = encode_unchanged_header(["body"]).decode()
    rows = [
        # Before the ALTER: body = 1234 (numeric(10,0)).
        _event(5, 100, 1, {"id": 1, "body": _decimal(1234), "n": 1}, None),
        # After it (numeric(12,2)): an UPDATE of n only, body left out (unchanged TOAST).
        _event(6, 200, 2, {"id": 1, "body": None, "n": 2}, held),
    ]
    reduced = latest_per_key(rows)
    schemas = {r["schema_id"]: r["schema_json"] for r in reduced if r["kind"] == SCHEMA}
    [change_row] = [r for r in reduced if r["kind"] == CHANGE]
    seen: list[tuple[str, int, int]] = []

    def on_new_schema(table: str, schema: object, since_lsn: int) -> None:
        seen.append((table, len(str(schema)), since_lsn))

    change = ChangeBuilder(schemas, on_new_schema)(change_row)
    # Read with the newest schema (scale 2) the old value would be "12.34".
    assert change.doc == {"id": 1, "body": "1234", "n": 2}
    # Each schema is registered with the commit LSN of the event that uses it (a search
    # follower's next index version records it: sinks.search._older_shape), the newest first.
    assert [lsn for _, _, lsn in seen] == [200, 100]
    assert [h["schema_id"] for h in change_row["history"]] == [1, 2]
