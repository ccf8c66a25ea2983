"""Capture the golden fixture from a real server: the table's catalog description (what
cdc.catalog.load_table returns) and every row as COPY TO STDOUT text. Debezium's records of
the same rows are added by ``python -m tests.integration.debezium_parity.golden``.

    .venv/bin/python -m tests.unit.schemas.capture postgresql://cdc:cdc@127.0.0.1:55432/cdc
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg

from cdc.catalog import load_table
from schemas.model import PgType
from tests.unit.schemas.all_types import SETUP_SQL, create_table_sql, insert_sql

FIXTURE = Path(__file__).parent / "fixtures" / "all_types.json"


def pg_type_to_json(t: PgType | None) -> Any:
    if t is None:
        return None
    return {
        "oid": t.oid,
        "name": t.name,
        "kind": t.kind,
        "element": pg_type_to_json(t.element),
        "base": pg_type_to_json(t.base),
        "enum_values": list(t.enum_values),
        "typmod": t.typmod,
    }


def copy_rows(conn: psycopg.Connection[Any], table: str) -> list[list[str | None]]:
    """COPY text rows, unescaped into values (None for NULL)."""
    rows: list[list[str | None]] = []
    with conn.cursor() as cur, cur.copy(f"COPY {table} TO STDOUT") as copy:
        data = b"".join(bytes(b) for b in copy)
    for line in data.decode().split("\n"):
        if line:
            rows.append([None if f == "\\N" else _unescape(f) for f in line.split("\t")])
    return rows


def _unescape(field: str) -> str:
    out, i = [], 0
    table = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "b": "\b", "f": "\f", "v": "\v"}
    while i < len(field):
        c = field[i]
        if c == "\\" and i + 1 < len(field):
            out.append(table.get(field[i + 1], field[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def describe(
    conn: psycopg.Connection[Any], name: str = "all_types", schema: str = "public"
) -> dict[str, Any]:
    """The fixture's server part: the table as cdc.catalog describes it (named as in
    ``public``) and its rows (as the reader's sessions render them: UTC)."""
    conn.execute("SET TimeZone = 'UTC'")
    table = load_table(conn, name, schema)
    return {
        "server_version": conn.info.server_version,
        "table": {
            "schema": "public",
            "table": table.table,
            "key_columns": list(table.key_columns),
            "replica_identity": table.replica_identity,
            "columns": [
                {
                    "name": c.name,
                    "type": pg_type_to_json(c.type),
                    "type_modifier": c.type_modifier,
                    "optional": c.optional,
                    "part_of_key": c.part_of_key,
                    "default": c.default,
                    "dims": c.dims,
                }
                for c in table.columns
            ],
        },
        "rows": copy_rows(conn, f'"{schema}".{name}'),
    }


def write_fixture(fixture: dict[str, Any]) -> None:
    """Write the fixture: objects indented three levels deep, one line per list item (a
    column, a row, a schema field), so a regenerated fixture reads as a short diff."""
    FIXTURE.write_text(_layout(fixture, 0) + "\n")


def _layout(value: Any, depth: int) -> str:
    expand = isinstance(value, list) if depth == 3 else depth < 3 and isinstance(value, dict | list)
    if not value or not expand:
        return orjson.dumps(value).decode()
    pad = "  " * (depth + 1)
    if isinstance(value, dict):
        items = [
            f"{pad}{orjson.dumps(k).decode()}: {_layout(v, depth + 1)}" for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + "  " * depth + "}"
    items = [f"{pad}{orjson.dumps(v).decode()}" for v in value]  # one line per item
    return "[\n" + ",\n".join(items) + "\n" + "  " * depth + "]"


def main(admin_dsn: str) -> None:
    """Capture the server part only, keeping the Debezium part of the current fixture (that
    one comes from Debezium itself: ``python -m tests.integration.debezium_parity.golden``)."""
    db = f"capture_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {db}")
    try:
        base = admin_dsn.rsplit("/", 1)[0]
        with psycopg.connect(f"{base}/{db}", autocommit=True) as conn:
            for sql in [*SETUP_SQL, create_table_sql(), *insert_sql()]:
                conn.execute(sql)
            fixture = describe(conn)
        old = orjson.loads(FIXTURE.read_bytes()) if FIXTURE.exists() else {}
        if "debezium" in old:
            fixture["debezium"] = old["debezium"]
        write_fixture(fixture)
        print(f"wrote {FIXTURE}")
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {db}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "postgresql://cdc:cdc@127.0.0.1:55432/cdc")
