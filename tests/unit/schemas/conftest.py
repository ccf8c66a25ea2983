"""Fixtures for the event-format tests: the all-types table captured from a real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas.model import Column, PgType, TableSchema

FIXTURE = Path(__file__).parent / "fixtures" / "all_types.json"


def pg_type_from_json(j: Any) -> PgType | None:
    if j is None:
        return None
    return PgType(
        j["oid"],
        j["name"],
        j["kind"],
        pg_type_from_json(j["element"]),
        pg_type_from_json(j["base"]),
        tuple(j["enum_values"]),
        j["typmod"],
    )


def load_fixture() -> tuple[TableSchema, list[list[str | None]]]:
    fx = orjson.loads(FIXTURE.read_bytes())
    t = fx["table"]
    cols = []
    for c in t["columns"]:
        pg_type = pg_type_from_json(c["type"])
        assert pg_type is not None
        cols.append(
            Column(
                c["name"],
                pg_type,
                c["type_modifier"],
                c["optional"],
                c["part_of_key"],
                c.get("default"),
                c.get("dims", 0),
            )
        )
    table = TableSchema(
        t["schema"], t["table"], tuple(cols), tuple(t["key_columns"]), t["replica_identity"]
    )
    return table, fx["rows"]


@pytest.fixture(scope="session")
def all_types() -> tuple[TableSchema, list[list[str | None]]]:
    return load_fixture()
