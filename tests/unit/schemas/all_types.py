"""A table with every supported type, shared by the golden tests (through a fixture captured
from a real server by ``capture.py``) and the PostgreSQL-is-the-oracle integration test."""

from __future__ import annotations

SETUP_SQL = [
    "CREATE EXTENSION IF NOT EXISTS hstore",
    "CREATE EXTENSION IF NOT EXISTS citext",
    "CREATE EXTENSION IF NOT EXISTS ltree",
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE >= 0)",
    "CREATE DOMAIN short_text AS varchar(20)",
]

# (column, SQL type, literals inserted one row each; NULL everywhere else)
COLUMNS: list[tuple[str, str, list[str]]] = [
    ("id", "int4 PRIMARY KEY", []),
    ("c_bool", "bool", ["true", "false"]),
    ("c_int2", "int2", ["-32768", "32767"]),
    ("c_int4", "int4", ["-2147483648", "42"]),
    ("c_int8", "int8", ["-9223372036854775808", "9223372036854775807"]),
    ("c_oid", "oid", ["4294967295"]),
    ("c_float4", "float4", ["1.1", "-3.4e38", "'NaN'", "'Infinity'", "'-Infinity'", "'-0'"]),
    ("c_float8", "float8", ["0.1", "1e308", "'NaN'", "'-Infinity'"]),
    ("c_numeric", "numeric(10,2)", ["12345678.9", "-0.01", "0", "-1.28", "1.28", "-128"]),
    ("c_numeric_neg_scale", "numeric(5,-2)", ["1234567"]),
    (
        "c_numeric_any",
        "numeric",
        [
            "1.500",
            "-123456789012345678901234567890.000123",
            "100",
            "0.0000001",
            "'NaN'",
            "0.0",
            "-1.28",
        ],
    ),
    ("c_money", "money", ["12.34", "-1234567.89", "'-92233720368547758.08'"]),
    ("c_text", "text", ["'hello, \"world\"\\n'", "''"]),
    ("c_varchar", "varchar(10)", ["'abc'"]),
    ("c_char", "char(5)", ["'ab'"]),
    ("c_name", "name", ["'pg_class'"]),
    ("c_bytea", "bytea", ["'\\x00ff10'::bytea", "''::bytea"]),
    ("c_uuid", "uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"]),
    ("c_json", "json", ['\'{"b": 1,  "a": [true, null]}\'']),
    ("c_jsonb", "jsonb", ['\'{"b": 1, "a": [true, null]}\'']),
    ("c_xml", "xml", ["'<a>1</a>'"]),
    (
        "c_date",
        "date",
        ["'2024-02-29'", "'1900-01-01'", "'0044-03-15 BC'", "'infinity'", "'-infinity'"],
    ),
    ("c_time3", "time(3)", ["'13:14:15.123'", "'00:00:00'"]),
    ("c_time", "time", ["'23:59:59.999999'", "'24:00:00'"]),
    ("c_timetz", "timetz", ["'10:15:30.5+02'", "'23:00:00-05:30'", "'24:00:00+00'"]),
    ("c_ts0", "timestamp(0)", ["'2018-06-20 15:13:16'"]),
    ("c_ts3", "timestamp(3)", ["'2018-06-20 15:13:16.945'", "'1969-12-31 23:59:59.999'"]),
    (
        "c_ts",
        "timestamp",
        ["'2018-06-20 15:13:16.945104'", "'infinity'", "'-infinity'", "'0001-01-01 00:00:00 BC'"],
    ),
    (
        "c_tstz",
        "timestamptz",
        ["'2018-06-20 15:13:16.94+02'", "'2000-01-01 00:00:00+00'", "'infinity'"],
    ),
    ("c_tstz3", "timestamptz(3)", ["'2018-06-20 15:13:16.9+00'"]),
    (
        "c_interval",
        "interval",
        ["'1 year 2 months 3 days 04:05:06.78'", "'-1 days +02:03:00'", "'-00:00:01.5'", "'0'"],
    ),
    ("c_mood", "mood", ["'happy'"]),
    ("c_int4_arr", "int4[]", ["'{1,NULL,3}'", "'{}'"]),
    ("c_text_arr", "text[]", ["ARRAY['a b', 'c,d', 'e\"f', NULL, 'NULL']"]),
    ("c_numeric_arr", "numeric(6,3)[]", ["'{1.5,-2}'"]),
    ("c_mood_arr", "mood[]", ["'{sad,happy}'"]),
    ("c_tstz_arr", "timestamptz[]", ["'{\"2020-01-01 00:00:00+01\"}'"]),
    ("c_inet", "inet", ["'192.168.0.1/24'", "'::1'"]),
    ("c_cidr", "cidr", ["'10.0.0.0/8'"]),
    ("c_macaddr", "macaddr", ["'08:00:2b:01:02:03'"]),
    ("c_int4range", "int4range", ["'[1,10)'", "'empty'"]),
    ("c_tstzrange", "tstzrange", ["'[2020-01-01 00:00+00,)'"]),
    ("c_point", "point", ["'(1.5,-2)'"]),
    ("c_hstore", "hstore", ['\'a=>1, "b c"=>NULL, d=>"x\\"y"\'']),
    ("c_price", "price", ["19.999"]),
    ("c_short", "short_text", ["'domain'"]),
    ("c_bit", "bit(3)", ["B'101'"]),
    ("c_tsvector", "tsvector", ["'a fat cat'"]),
    # Edge values and types added for the Debezium parity test (issue 15).
    ("c_bit1", "bit(1)", ["B'1'", "B'0'"]),
    ("c_bit10", "bit(10)", ["B'1010000011'"]),
    ("c_varbit", "bit varying(20)", ["B'10110'", "B''"]),
    ("c_varbit_any", "bit varying", ["B'1101'"]),
    ("c_varbit1", "bit varying(1)", ["B'1'"]),
    ("c_bit_arr", "bit(3)[]", ["'{101,010}'"]),
    ("c_int4_2d", "int4[][]", ["'{{1,2},{3,NULL}}'"]),
    ("c_ts_edge", "timestamp", ["'294276-12-31 23:59:59.999999'", "'4713-01-01 00:00:00 BC'"]),
    ("c_tstz_edge", "timestamptz", ["'294276-12-31 23:59:59.999999+00'"]),
    ("c_date_edge", "date", ["'5874897-12-31'", "'4713-01-01 BC'"]),
    ("c_interval_edge", "interval", ["'1000000 years'", "'-1000000 years'"]),
    ("c_macaddr8", "macaddr8", ["'08:00:2b:01:02:03:04:05'"]),
    ("c_int8range", "int8range", ["'[1,)'"]),
    ("c_numrange", "numrange", ["'(1.5,2.5]'"]),
    ("c_daterange", "daterange", ["'[2020-01-01,2020-02-01)'"]),
    ("c_tsrange", "tsrange", ["'[2020-01-01 10:00,2020-01-01 11:00)'"]),
    ("c_citext", "citext", ["'MiXeD'"]),
    ("c_ltree", "ltree", ["'a.b.c'"]),
    ("c_char1", '"char"', ["'x'"]),
    ("c_uuid_arr", "uuid[]", ["'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}'"]),
    ("c_bool_arr", "bool[]", ["'{t,f,NULL}'"]),
    ("c_float8_arr", "float8[]", ["'{1.5,NaN,-Infinity}'"]),
    ("c_date_arr", "date[]", ["'{2020-01-01,1970-01-01}'"]),
    ("c_bytea_arr", "bytea[]", ["ARRAY['\\x0102'::bytea]"]),
    ("c_jsonb_arr", "jsonb[]", ["ARRAY['{\"a\": 1}'::jsonb]"]),
    ("c_varchar_arr", "varchar(5)[]", ["'{a,bc}'"]),
    ("c_int8_arr", "int8[]", ["'{9223372036854775807}'"]),
    ("c_numeric_any_arr", "numeric[]", ["'{1.5,-2}'"]),
    ("c_box", "box", ["'((1,2),(3,4))'"]),
    ("c_circle", "circle", ["'<(1,2),3>'"]),
    ("c_line", "line", ["'{1,-1,0}'"]),
    ("c_lseg", "lseg", ["'[(1,2),(3,4)]'"]),
    ("c_path", "path", ["'[(1,2),(3,4)]'"]),
    ("c_polygon", "polygon", ["'((1,2),(3,4),(5,6))'"]),
    ("c_tsquery", "tsquery", ["'fat & rat'"]),
    ("c_pg_lsn", "pg_lsn", ["'16/B374D848'"]),
]


def create_table_sql(table: str = "all_types") -> str:
    cols = ",\n  ".join(f"{name} {typ}" for name, typ, _ in COLUMNS)
    return f"CREATE TABLE {table} (\n  {cols}\n)"


def literal_rows() -> list[tuple[int, str, str]]:
    """(id, column, literal) of every row: one row per literal, ids counting up from 1."""
    out = []
    i = 0
    for name, _, literals in COLUMNS:
        for lit in literals:
            i += 1
            out.append((i, name, lit))
    return out


def insert_sql(table: str = "all_types") -> list[str]:
    """One row per literal (id counts up), every other column NULL."""
    return [
        f"INSERT INTO {table} (id, {name}) VALUES ({i}, {lit})" for i, name, lit in literal_rows()
    ]
