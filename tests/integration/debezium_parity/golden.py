"""The golden unit tests' fixture, regenerated from Debezium's own output.

tests/unit/schemas/fixtures/all_types.json holds the all_types table as the catalog describes
it, its rows as PostgreSQL renders them, and (``debezium``) what Debezium Server wrote for the
same rows when they were streamed: the row struct's schema, the key schema and each row's
``after`` (its non-null columns). The parity test checks that the committed fixture is still
Debezium's output; to write it again::

    .venv/bin/python -m tests.integration.debezium_parity.golden
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.debezium import VERSION
from benchmarks.env import BenchEnv
from tests.integration.debezium_parity.capture import Captured, capture
from tests.integration.debezium_parity.compare import events
from tests.integration.debezium_parity.peers import ParityDebezium
from tests.integration.debezium_parity.scenario import STREAM_ID_OFFSET
from tests.unit.schemas.capture import write_fixture

TABLE = ("public", "all_types")


def debezium_part(got: Captured) -> dict[str, Any]:
    """Debezium's streamed ``c`` records of all_types, by the fixture's row id."""
    topic = ParityDebezium.topic_of(got.debezium_prefix, ".".join(TABLE))
    records = [r for r in got.debezium if r.topic == topic]
    evs = events("debezium", records, got.debezium_prefix, {topic: TABLE})
    rows: dict[str, Any] = {}
    value_schema: Any = None
    key_schema: Any = None
    for e in evs:
        if e.table != TABLE or e.op != "c":
            continue
        after = e.payload["after"]
        rows[str(after["id"] - STREAM_ID_OFFSET)] = {
            k: v for k, v in after.items() if v is not None and k != "id"
        }
        fields = e.value["schema"]["fields"]
        value_schema = next(f for f in fields if f["field"] == "after")
        key_schema = e.key["schema"]
    if value_schema is None:
        raise ValueError("Debezium streamed no all_types row")
    value_schema = {k: v for k, v in value_schema.items() if k != "field"}
    return {
        "version": VERSION,
        "value_schema": value_schema,
        "key_schema": key_schema,
        "after": dict(sorted(rows.items(), key=lambda kv: int(kv[0]))),
    }


def fixture(got: Captured) -> dict[str, Any]:
    """The whole fixture from one parity run."""
    return {**got.golden_base, "debezium": debezium_part(got)}


def main() -> None:
    """Capture once and write the fixture."""
    logging.basicConfig(level=logging.INFO)
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        env = BenchEnv(out_dir=Path(tmp))
        try:
            got = capture(env, modes=False)
            if got.reader_errors:
                raise SystemExit("\n".join(got.reader_errors))
            write_fixture(fixture(got))
        finally:
            env.cleanup()


if __name__ == "__main__":
    main()
