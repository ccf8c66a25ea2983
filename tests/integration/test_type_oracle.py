"""PostgreSQL is the oracle: the server renders each value as text (what pgoutput and COPY
send), we convert it, and the result must mean what the server says it means (epoch,
scale, components, lengths...). Also checks cdc.catalog against the same server."""

from __future__ import annotations

import base64
import struct
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from decimal import Context, Decimal
from typing import Any

import orjson
import psycopg
import pytest

from cdc.catalog import load_table, load_types, table_from_relation
from pgcdc.core.settings import DecimalHandling, IntervalHandling, SchemaSettings
from schemas.convert import bytes_to_unscaled
from schemas.model import TableSchema
from schemas.typemap import codec_for
from tests.unit.schemas.all_types import COLUMNS, SETUP_SQL, create_table_sql, insert_sql

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def conn(endpoints: Any) -> Iterator[psycopg.Connection[Any]]:
    """A database of this module's own, with the all-types table filled."""
    db = f"type_oracle_{uuid.uuid4().hex[:8]}"
    admin_dsn = endpoints.postgres_dsn
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {db}")
    try:
        with psycopg.connect(endpoints.postgres_dsn_for(db), autocommit=True) as c:
            c.execute("SET TimeZone = 'UTC'")
            for sql in [*SETUP_SQL, create_table_sql(), *insert_sql()]:
                c.execute(sql)
            yield c
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {db} WITH (FORCE)")


@pytest.fixture(scope="module")
def table(conn: psycopg.Connection[Any]) -> TableSchema:
    return load_table(conn, "all_types")


def converted(table: TableSchema, column: str, text: str, **kw: Any) -> Any:
    col = next(c for c in table.columns if c.name == column)
    codec = codec_for(col, SchemaSettings(**kw))
    return text if codec.convert is None else codec.convert(text)


def samples(conn: psycopg.Connection[Any], column: str, oracle: str) -> list[tuple[str, Any]]:
    """(server text, oracle expression) for every non-null value of ``column``."""
    rows = conn.execute(
        f"SELECT {column}::text, {oracle} FROM all_types WHERE {column} IS NOT NULL ORDER BY id"
    ).fetchall()
    literals = next(lits for name, _, lits in COLUMNS if name == column)
    assert len(rows) == len(literals), f"{column}: expected {len(literals)} rows"
    return [(r[0], r[1]) for r in rows]


def test_catalog_describes_the_table(conn: psycopg.Connection[Any], table: TableSchema) -> None:
    assert table.key_columns == ("id",) and table.replica_identity == "d"
    cols = {c.name: c for c in table.columns}
    assert cols["id"].part_of_key and not cols["id"].optional
    assert cols["c_mood"].type.kind == "e" and cols["c_mood"].type.enum_values == (
        "sad",
        "ok",
        "happy",
    )
    assert (
        cols["c_int4_arr"].type.element is not None
        and cols["c_int4_arr"].type.element.name == "int4"
    )
    price = cols["c_price"].type
    assert price.kind == "d" and price.base is not None and price.base.name == "numeric"
    assert price.typmod == ((10 << 16) | 2) + 4
    assert cols["c_point"].type.element is None  # subscriptable, not an array
    # Same table from a Relation message's columns (flags, name, type OID, typmod).
    rel = [(1 if c.part_of_key else 0, c.name, c.type.oid, c.type_modifier) for c in table.columns]
    types = load_types(conn, {c.type.oid for c in table.columns})
    nn = frozenset(c.name for c in table.columns if not c.optional)
    # A Relation message carries no defaults nor declared dimensions (from_relation adds them
    # from the catalog).
    bare = replace(table, columns=tuple(replace(c, default=None, dims=0) for c in table.columns))
    assert table_from_relation("public", "all_types", "d", rel, types, nn) == bare


def test_catalog_replica_identity_index(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE ri (a int NOT NULL, b text NOT NULL, c text)")
    conn.execute("CREATE UNIQUE INDEX ri_ab ON ri (b, a)")
    conn.execute("ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_ab")
    t = load_table(conn, "ri")
    assert t.key_columns == ("b", "a") and t.replica_identity == "i"
    oid = conn.execute("SELECT 'ri'::regclass::oid::int8").fetchone()
    assert oid is not None and load_table(conn, int(oid[0])) == t


@pytest.mark.parametrize("column", ["c_int2", "c_int4", "c_int8", "c_oid"])
def test_integers(conn: Any, table: TableSchema, column: str) -> None:
    for text, oracle in samples(conn, column, f"{column}::int8"):
        assert converted(table, column, text) == int(oracle)


def test_bool(conn: Any, table: TableSchema) -> None:
    for text, oracle in samples(conn, "c_bool", "c_bool"):
        assert converted(table, "c_bool", text) is oracle


def test_floats(conn: Any, table: TableSchema) -> None:
    for text, oracle in samples(conn, "c_float8", "c_float8"):
        ours = converted(table, "c_float8", text)
        assert ours == oracle or (ours != ours and oracle != oracle)
    for text, oracle in samples(conn, "c_float4", "c_float4::float8"):
        ours = converted(table, "c_float4", text)
        assert struct.pack("<f", ours) == struct.pack("<f", oracle)


@pytest.mark.parametrize("column", ["c_numeric", "c_numeric_neg_scale", "c_price", "c_money"])
def test_fixed_decimals(conn: Any, table: TableSchema, column: str) -> None:
    col = next(c for c in table.columns if c.name == column)
    scale = int(codec_for(col, SchemaSettings()).schema["parameters"]["scale"])
    as_numeric = f"{column}::numeric"
    for text, oracle in samples(
        conn, column, f"({as_numeric} * power(10::numeric, {scale}))::numeric(1000,0)::text"
    ):
        assert bytes_to_unscaled(converted(table, column, text)) == int(oracle)
    for text, oracle in samples(conn, column, f"{as_numeric}::text"):
        assert Decimal(
            converted(table, column, text, decimal_handling_mode=DecimalHandling.STRING)
        ) == Decimal(oracle)


def test_variable_scale_decimal(conn: Any, table: TableSchema) -> None:
    for text, oracle in samples(
        conn, "c_numeric_any", "(c_numeric_any = 'NaN'), scale(trim_scale(c_numeric_any))"
    ):
        if oracle:  # NaN: only string/double can carry it
            assert (
                converted(
                    table, "c_numeric_any", text, decimal_handling_mode=DecimalHandling.STRING
                )
                == "NAN"
            )
            continue
        v = converted(table, "c_numeric_any", text)
        exact = Context(prec=1000)
        assert Decimal(bytes_to_unscaled(v["value"])).scaleb(-v["scale"], exact) == Decimal(text)
    scales = conn.execute(
        "SELECT c_numeric_any::text, scale(trim_scale(c_numeric_any)) FROM all_types "
        "WHERE c_numeric_any IS NOT NULL AND c_numeric_any <> 'NaN'"
    ).fetchall()
    for text, scale in scales:
        assert converted(table, "c_numeric_any", text)["scale"] == scale


def test_dates(conn: Any, table: TableSchema) -> None:
    for text, oracle in samples(
        conn, "c_date", "CASE WHEN isfinite(c_date) THEN c_date - date '1970-01-01' END"
    ):
        ours = converted(table, "c_date", text)
        if oracle is None:  # ±infinity: Debezium's values
            assert ours in (-2147472692, -2147472691)
        else:
            assert ours == oracle


@pytest.mark.parametrize(("column", "unit"), [("c_time3", 1000), ("c_time", 1)])
def test_times(conn: Any, table: TableSchema, column: str, unit: int) -> None:
    for text, oracle in samples(conn, column, f"(extract(epoch from {column}) * 1000000)::int8"):
        assert converted(table, column, text) == oracle // unit


def test_timetz(conn: Any, table: TableSchema) -> None:
    for text, oracle in samples(conn, "c_timetz", "(extract(epoch from c_timetz) * 1000000)::int8"):
        ours = converted(table, "c_timetz", text)
        t = datetime.strptime(ours.rstrip("Z"), "%H:%M:%S.%f" if "." in ours else "%H:%M:%S")
        micros = ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond
        assert micros == oracle % 86_400_000_000


@pytest.mark.parametrize(("column", "unit"), [("c_ts0", 1000), ("c_ts3", 1000), ("c_ts", 1)])
def test_timestamps(conn: Any, table: TableSchema, column: str, unit: int) -> None:
    oracle_sql = (
        f"CASE WHEN isfinite({column}) THEN (extract(epoch from {column}) * 1000000)::int8 END"
    )
    for text, oracle in samples(conn, column, oracle_sql):
        ours = converted(table, column, text)
        if oracle is None:
            assert ours in (9223372036825200000, -9223372036832400000)
        else:
            assert ours == oracle // unit


@pytest.mark.parametrize("column", ["c_tstz", "c_tstz3"])
def test_timestamptz(conn: Any, table: TableSchema, column: str) -> None:
    oracle_sql = (
        f"CASE WHEN isfinite({column}) THEN (extract(epoch from {column}) * 1000000)::int8 END"
    )
    for text, oracle in samples(conn, column, oracle_sql):
        ours = converted(table, column, text)
        if oracle is None:
            assert ours == text
            continue
        dt = datetime.fromisoformat(ours.replace("Z", "+00:00"))
        assert round(dt.timestamp() * 1_000_000) == oracle
    # The same instant rendered in another time zone converts to the same UTC string.
    conn.execute("SET TimeZone = 'Asia/Kolkata'")
    try:
        shifted = conn.execute(
            f"SELECT {column}::text FROM all_types WHERE isfinite({column}) ORDER BY id"
        ).fetchall()
    finally:
        conn.execute("SET TimeZone = 'UTC'")
    utc = conn.execute(
        f"SELECT {column}::text FROM all_types WHERE isfinite({column}) ORDER BY id"
    ).fetchall()
    for (a,), (b,) in zip(shifted, utc, strict=True):
        assert converted(table, column, a) == converted(table, column, b)


def test_interval(conn: Any, table: TableSchema) -> None:
    oracle_sql = ", ".join(
        f"extract({u} from c_interval)"
        for u in ("year", "month", "day", "hour", "minute", "second")
    )
    for text, *parts in conn.execute(
        f"SELECT c_interval::text, {oracle_sql} FROM all_types WHERE c_interval IS NOT NULL"
    ):
        y, mo, d, h, mi, s = (Decimal(p) for p in parts)
        expected = int(
            ((((y * 12 + mo) * Decimal(365.25 / 12) + d) * 24 + h) * 60 + mi) * 60 * 1_000_000
            + s * 1_000_000
        )
        assert abs(converted(table, "c_interval", text) - expected) <= 1
        iso = converted(table, "c_interval", text, interval_handling_mode=IntervalHandling.STRING)
        assert iso.startswith(f"P{int(y)}Y{int(mo)}M{int(d)}DT{int(h)}H{int(mi)}M")


def test_bytea(conn: Any, table: TableSchema) -> None:
    for text, oracle in samples(conn, "c_bytea", "encode(c_bytea, 'hex')"):
        assert converted(table, "c_bytea", text) == bytes.fromhex(oracle)
    for text, oracle in samples(conn, "c_bytea", "encode(c_bytea, 'base64')"):
        assert converted(table, "c_bytea", text, binary_handling_mode="base64") == oracle.replace(
            "\n", ""
        )


def test_json_and_hstore(conn: Any, table: TableSchema) -> None:
    for text, oracle in samples(conn, "c_jsonb", "c_jsonb"):
        assert orjson.loads(converted(table, "c_jsonb", text)) == oracle
    for text, oracle in samples(conn, "c_hstore", "hstore_to_json(c_hstore)"):
        assert orjson.loads(converted(table, "c_hstore", text)) == oracle


def test_point(conn: Any, table: TableSchema) -> None:
    for text, x in samples(conn, "c_point", "c_point[0]"):
        v = converted(table, "c_point", text)
        y = conn.execute(
            "SELECT c_point[1] FROM all_types WHERE c_point::text = %s", (text,)
        ).fetchone()[0]
        assert (v["x"], v["y"]) == (x, y)
        assert struct.unpack("<BIdd", v["wkb"]) == (1, 1, x, y)


@pytest.mark.parametrize("column", ["c_int4_arr", "c_text_arr", "c_mood_arr"])
def test_arrays(conn: Any, table: TableSchema, column: str) -> None:
    for text, oracle in samples(conn, column, f"array_to_json({column})"):
        assert converted(table, column, text) == oracle


def test_numeric_array(conn: Any, table: TableSchema) -> None:
    for text, oracle in samples(conn, "c_numeric_arr", "array_to_json(c_numeric_arr)::text"):
        ours = converted(table, "c_numeric_arr", text)
        expected = [Decimal(str(x)) for x in orjson.loads(oracle)]
        assert [Decimal(bytes_to_unscaled(b)).scaleb(-3) for b in ours] == expected


def test_strings_pass_through_unchanged(conn: Any, table: TableSchema) -> None:
    for column in (
        "c_text",
        "c_varchar",
        "c_char",
        "c_name",
        "c_uuid",
        "c_xml",
        "c_inet",
        "c_cidr",
        "c_macaddr",
        "c_int4range",
        "c_tstzrange",
        "c_mood",
        "c_short",
        "c_box",
        "c_tsvector",
    ):
        for text, oracle in samples(conn, column, f"{column}::text"):
            assert converted(table, column, text) == oracle


def test_bits(conn: Any, table: TableSchema) -> None:
    # bit(n > 1) and bit varying: the bit string's number, little endian, fewest bytes.
    for column in ("c_bit", "c_bit10", "c_varbit", "c_varbit_any"):
        for text, oracle in samples(conn, column, f"{column}::text"):
            n = int(oracle, 2) if oracle else 0
            assert converted(table, column, text) == n.to_bytes((n.bit_length() + 7) // 8, "little")
    for text, oracle in samples(conn, "c_bit1", "c_bit1 = B'1'"):
        assert converted(table, "c_bit1", text) is oracle


def test_every_type_is_covered(table: TableSchema) -> None:
    # Nothing in the table is dropped: every column has a schema and a value.
    for col in table.columns:
        assert codec_for(col, SchemaSettings()).schema["type"]
    assert base64  # used by test_bytea's base64 mode


def test_snapshot_copy_parse_equals_psycopg(conn: psycopg.Connection[Any]) -> None:
    """The snapshotter parses COPY text itself: every value of the all-types table, and text
    with every escape COPY writes, reads as psycopg's copy.rows() reads it."""
    from cdc.snapshot import copy_text_rows

    conn.execute("CREATE TABLE copy_text (id int PRIMARY KEY, a text, b text)")
    odd = ["\t", "\n", "\r", "\b", "\f", "\v", "\\", "\\N", "N", "", " ", "a\tb\\c\nd", "é€😀"]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO copy_text VALUES (%s, %s, %s)",
            [(i, v, None if i % 2 else v + "\\t") for i, v in enumerate(odd)],
        )

    def both(table: str) -> tuple[list[Any], list[Any]]:
        ncols = len(load_table(conn, table).columns)
        query = f"COPY (SELECT * FROM {table} ORDER BY id) TO STDOUT"
        with conn.cursor() as cur, cur.copy(query) as copy:
            copy.set_types(["text"] * ncols)
            want = [list(r) for r in copy.rows()]
        with conn.cursor() as cur, cur.copy(query) as copy:
            got = [list(r) for r in copy_text_rows(copy)]
        return want, got

    for table in ("all_types", "copy_text"):
        want, got = both(table)
        assert got == want and len(want) > 10
    escaped = both("copy_text")[1]
    assert [r[1] for r in escaped] == odd and escaped[1][2] is None  # the rare paths ran
