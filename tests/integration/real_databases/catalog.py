"""The database of test_followers_real.py: the tables of cases 4, 7 and 8 and a keyless
table, the rows the snapshot finds, and the changes streamed after it."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

from tests.integration.real_databases.support import Table
from tests.unit.schemas.all_types import COLUMNS, SETUP_SQL

# -- case 4: a bulk transaction that deletes and re-inserts the same keys ------------------

BULK = Table("public", "bulk")
# The transaction holds 2 x 33.5k changes (and 33.5k tombstones): the re-inserts' orders run
# from 33,500 to 66,999, the last 1,464 past the 65,535 that once shared one OpenSearch
# version (the tests assert a re-insert past it was applied: the path is hit at 33.5k as it
# was at 100k; at 40k the module's job read 161,178 records, 2,300 a second).
BULK_ROWS = 33_500
ORDER_ONCE_SHARED = 65_535

# -- case 7: a hostile catalog -------------------------------------------------------------

HOSTILE = [
    # Collided before: one topic for both.
    Table("public", "order.items"),
    Table("public.order", "items"),
    Table("public", "Café"),
    Table("public", "Caf_"),
    # Shared one index (OpenSearch lower-cases).
    Table("public", "Orders"),
    Table("public", "orders"),
    Table("UPPER", "T"),
    Table("upper", "t"),
    # Quotes, spaces, escapes that look like our own, unicode, a 63-byte name.
    Table("My Schema", 'we"ird tab'),
    Table("public", "a-b"),
    Table("public", "a-2Db"),
    Table("public", " lead space"),
    Table("日本語", "表"),
    Table("public", "表" * 21),
    Table("public", "emoji 😀"),
]
HOSTILE_ROWS = 30

# -- case 8: every type with edge values ---------------------------------------------------

TYPES = Table("public", "every_type")
# Edge values beyond the shared all-types list (tests/unit/schemas/all_types.py).
EDGE_COLUMNS: list[tuple[str, str, list[str]]] = [
    ("e_text", "text", ["''", "'😀 e\u0301 עברית \u200d \ufeff \u2028 \uffff'", "'NULL'"]),
    ("e_text_10mb", "text", ["repeat('0123456789', 1024 * 1024)"]),
    ("e_date", "date", ["'10000-01-01'", "'0001-01-01'", "'0001-12-31 BC'"]),
    ("e_ts", "timestamp", ["'10000-01-01 00:00:00.5'", "'0044-03-15 12:00:00 BC'"]),
    ("e_tstz", "timestamptz", ["'-infinity'", "'10000-01-01 00:00:00+00'"]),
    ("e_int_arr", "int4[]", ["'{NULL,NULL}'", "'{{1,2},{3,4}}'", "'{{{7}}}'"]),
    ("e_text_arr", "text[]", ["'{}'", "'{\"\"}'", "'{NULL}'"]),
    ("e_float8", "float8", ["'Infinity'", "'-0'", "2.2250738585072014e-308", "4.9e-324"]),
    ("e_numeric", "numeric", ["'1e400'", "'-1e-400'", "'99999999999999999999.5'"]),
    ("e_jsonb", "jsonb", ["'{\"big\": 1e400}'", "'\"\"'", "'[]'", '\'{"a": {"b": [null]}}\'']),
    ("e_int8", "int8", ["9223372036854775807"]),
]


def type_literals() -> list[tuple[str, str]]:
    """(column, literal) of every type row. Numeric NaN/±Infinity are left out: in the
    default decimal_handling_mode=precise the reader refuses them with one line naming
    the setting (Debezium cannot encode them either)."""
    out = []
    for name, typ, literals in [*COLUMNS, *EDGE_COLUMNS]:
        numeric = "numeric" in typ or typ == "price"
        for lit in literals:
            if numeric and any(s in lit for s in ("NaN", "Infinity")):
                continue
            out.append((name, lit))
    return out


def row_label(key: str) -> str:
    """The column a type row holds its value in (row ids count the literals, twice)."""
    lits = type_literals()
    return lits[(int(key) - 1) % len(lits)][0]


# Rows a follower cannot hold and dead-letters with the reason, by job and column
# (counted): the reader caps timestamps past 294247-01-10 at the int64 range (as Debezium
# does), so the value is unknown; once from the snapshot, once streamed.
EXPECTED_DEAD_LETTERS: dict[str, Counter[str]] = {
    "cache_sync": Counter({"c_ts_edge": 2}),
    # OpenSearch maps float4/float8 (Connect float/double) as numeric fields, which cannot hold
    # NaN or ±Infinity: exactly the rows with a non-finite float are refused, with the reason
    # (c_float4: NaN, Infinity, -Infinity; c_float8: NaN, -Infinity; the float8[] holding NaN;
    # e_float8: Infinity; two rows each). Redis holds them.
    "search_sync": Counter(
        {"c_ts_edge": 2, "c_float4": 6, "c_float8": 4, "c_float8_arr": 2, "e_float8": 2}
    ),
}

# Values the reader's event already carries inexactly, by Debezium's own encoding (what a
# follower holds is that encoding, exactly): a timetz of 24:00:00 wraps to 00:00:00Z
# (java.time.OffsetTime), and an array with more dimensions than its column declares is
# flattened to the declared ones (Connect arrays have fixed depth). Pinned here, so that a
# change on either side shows.
_READER_LOSSY = {
    "c_timetz": "c_timetz: '86400000000' vs '0'",
    "e_int_arr": "e_int_arr: '[[",
}
EXPECTED_READER_LOSSY: dict[str, Counter[str]] = {
    job: Counter({"c_timetz": 2, "e_int_arr": 4}) for job in ("cache_sync", "search_sync")
}


def reader_lossy(label: str, how: str) -> bool:
    """Whether a difference is one of the reader's known inexact encodings."""
    known = _READER_LOSSY.get(label)
    return known is not None and how.startswith(known)


# -- keyless -------------------------------------------------------------------------------

KEYLESS = Table("public", "event_log", key=())


# -- building it ---------------------------------------------------------------------------


def create_bulk(conn: psycopg.Connection[Any], rows: int | None = None) -> None:
    """Case 4's table; with ``rows``, filled with them (generation 1)."""
    conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text, gen int)").format(BULK.ident)
    )
    if rows:
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT g, 'first', 1 FROM generate_series(1, %s) g").format(
                BULK.ident
            ),
            (rows,),
        )


def delete_and_reinsert_bulk(conn: psycopg.Connection[Any], rows: int = BULK_ROWS) -> None:
    """Case 4's transaction: delete every row, re-insert the same keys (generation 2)."""
    with conn.transaction():
        conn.execute(sql.SQL("DELETE FROM {}").format(BULK.ident))
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT g, 'second', 2 FROM generate_series(1, %s) g").format(
                BULK.ident
            ),
            (rows,),
        )


def create_all(conn: psycopg.Connection[Any]) -> None:
    """Every table, empty."""
    create_bulk(conn)
    for t in HOSTILE:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(t.schema)))
        conn.execute(
            sql.SQL('CREATE TABLE {} (id int PRIMARY KEY, v text, "Mixed Case" int)').format(
                t.ident
            )
        )
    for stmt in SETUP_SQL:
        conn.execute(stmt)
    columns = {name: typ for name, typ, _ in [*COLUMNS, *EDGE_COLUMNS] if name != "id"}
    conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, {})").format(
            TYPES.ident,
            sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns.items()
            ),
        )
    )
    conn.execute(sql.SQL("CREATE TABLE {} (at int, msg text)").format(KEYLESS.ident))
    # Without a key, PostgreSQL refuses deletes on a published table unless identity is FULL.
    conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(KEYLESS.ident))


def _insert_types(conn: psycopg.Connection[Any], first_id: int) -> None:
    for i, (column, literal) in enumerate(type_literals()):
        conn.execute(
            sql.SQL("INSERT INTO {} (id, {}) VALUES (%s, {})").format(
                TYPES.ident,
                sql.Identifier(column),
                sql.SQL(literal),
            ),
            (first_id + i,),
        )


def snapshot_rows(conn: psycopg.Connection[Any]) -> None:
    """What the snapshot finds."""
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'first', 1 FROM generate_series(1, %s) g").format(
            BULK.ident
        ),
        (BULK_ROWS,),
    )
    for n, t in enumerate(HOSTILE):
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, %s || g, g * %s FROM generate_series(1, %s) g"
            ).format(t.ident),
            (f"{t.schema}.{t.name} ", n, HOSTILE_ROWS),
        )
    _insert_types(conn, 1)
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'before the snapshot')").format(KEYLESS.ident))


def stream_changes(conn: psycopg.Connection[Any]) -> None:
    """What is streamed after it."""
    delete_and_reinsert_bulk(conn)  # case 4: one transaction of 200k changes
    for t in HOSTILE:
        conn.execute(sql.SQL("UPDATE {} SET v = v || ' updated' WHERE id % 3 = 0").format(t.ident))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id % 5 = 0").format(t.ident))
        conn.execute(sql.SQL("UPDATE {} SET id = id + 1000 WHERE id = 7").format(t.ident))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (100, 'streamed', -1)").format(t.ident))
    _insert_types(conn, 1 + len(type_literals()))
    conn.execute(
        sql.SQL("INSERT INTO {} VALUES (2, 'streamed'), (2, 'streamed')").format(KEYLESS.ident)
    )
    conn.execute(sql.SQL("DELETE FROM {} WHERE at = 1").format(KEYLESS.ident))
