"""The database both systems capture, and the changes made while they stream.

Every type family the type map knows sits in ``all_types`` (shared with the golden unit tests,
:mod:`tests.unit.schemas.all_types`), one edge value per row. The other tables each exercise one
behaviour: column defaults, NOT NULL columns in a delete's before image, REPLICA IDENTITY FULL,
a keyless table, primary-key changes, TOAST, TRUNCATE, quoted and mixed-case names, a replica
identity index. The server's time zone is set to America/St_Johns (a half-hour offset), so
anything rendered in the session's zone shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.unit.schemas.all_types import (
    COLUMNS,
    SETUP_SQL,
    create_table_sql,
    insert_sql,
    literal_rows,
)

TIME_ZONE = "America/St_Johns"
# Streamed copies of the all_types rows get ids this much higher than the snapshot's.
STREAM_ID_OFFSET = 1000
# Literals neither system can carry with its defaults: Debezium stops its task on a NaN numeric
# under decimal.handling.mode=precise, and so does our reader (one clear error naming the
# setting). The golden unit tests cover them (tests/unit/schemas/test_golden.py).
UNCARRIED = frozenset({("c_numeric_any", "'NaN'")})
# The table whose row tells that a system has streamed every change.
SENTINEL = ("public", "parity_done")


@dataclass(frozen=True)
class ParityTable:
    """A captured table: its DDL, the rows it holds before capture starts."""

    schema: str
    name: str
    ddl: tuple[str, ...]
    rows: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


def _all_types_rows(id_offset: int) -> tuple[str, ...]:
    return tuple(
        f"INSERT INTO all_types (id, {name}) VALUES ({i + id_offset}, {lit})"
        for i, name, lit in literal_rows()
        if (name, lit) not in UNCARRIED
    )


_BIG = "repeat(md5(i::text), 200)"  # 6,400 bytes of hex: TOASTed out of line when EXTERNAL

TABLES: tuple[ParityTable, ...] = (
    ParityTable("public", "all_types", (create_table_sql(),), _all_types_rows(0)),
    ParityTable(
        "public",
        "defaults",
        (
            """CREATE TABLE defaults (
              id int PRIMARY KEY,
              d_int int NOT NULL DEFAULT 42,
              d_int2 smallint DEFAULT -7,
              d_int8 bigint DEFAULT 9223372036854775807,
              d_text text DEFAULT 'hello',
              d_varchar varchar(10) DEFAULT 'v'::character varying,
              d_numeric numeric(6,2) DEFAULT 1.5,
              d_numeric_any numeric DEFAULT 2.25,
              d_bool boolean DEFAULT true,
              d_float8 float8 DEFAULT 1.25,
              d_float4 real DEFAULT 0.5,
              d_date date DEFAULT '2020-01-02',
              d_ts timestamp DEFAULT '2020-01-02 03:04:05.678',
              d_tstz timestamptz DEFAULT '2020-01-02 03:04:05+00',
              d_time time DEFAULT '01:02:03',
              d_now timestamptz DEFAULT now(),
              d_today date DEFAULT current_date,
              d_serial serial,
              d_uuid uuid DEFAULT 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
              d_jsonb jsonb DEFAULT '{}',
              d_mood mood DEFAULT 'ok',
              d_bytea bytea DEFAULT '\\x01ff',
              d_interval interval DEFAULT '1 day',
              d_null text DEFAULT NULL,
              d_expr int DEFAULT (1 + 2),
              d_money money DEFAULT 3.5,
              d_bit bit(3) DEFAULT B'101',
              d_bit1 bit(1) DEFAULT B'1',
              d_expr_nn int NOT NULL DEFAULT (1 + 2),
              d_seq_null bigint DEFAULT nextval('unused_seq'),
              d_bool_null boolean DEFAULT NULL::boolean,
              d_ts_now timestamp DEFAULT now(),
              d_interval_fn interval DEFAULT make_interval(days => 1),
              d_time_fn time DEFAULT localtime
            )""",
        ),
        ("INSERT INTO defaults (id) VALUES (1), (2), (3)",),
    ),
    ParityTable(
        "public",
        "serial_pk",
        ("CREATE TABLE serial_pk (id serial PRIMARY KEY, v text NOT NULL DEFAULT 'x')",),
        ("INSERT INTO serial_pk DEFAULT VALUES",),
    ),
    ParityTable(
        "public",
        "not_null",
        (
            """CREATE TABLE not_null (
              id int PRIMARY KEY,
              n_int int NOT NULL, n_int2 smallint NOT NULL, n_int8 bigint NOT NULL,
              n_text text NOT NULL, n_varchar varchar(5) NOT NULL,
              n_numeric numeric(8,3) NOT NULL, n_numeric_any numeric NOT NULL,
              n_bool bool NOT NULL, n_float8 float8 NOT NULL, n_float4 real NOT NULL,
              n_date date NOT NULL, n_ts timestamp NOT NULL, n_tstz timestamptz NOT NULL,
              n_time time NOT NULL, n_timetz timetz NOT NULL, n_interval interval NOT NULL,
              n_bytea bytea NOT NULL, n_uuid uuid NOT NULL, n_jsonb jsonb NOT NULL,
              n_mood mood NOT NULL, n_arr int[] NOT NULL, n_point point NOT NULL,
              n_money money NOT NULL, n_bit bit(3) NOT NULL, n_hstore hstore NOT NULL,
              n_default int NOT NULL DEFAULT 7
            )""",
        ),
        tuple(
            f"""INSERT INTO not_null VALUES ({i}, {i}, 2, 3, 'text {i}', 'vc', 1.5, 2.25, true,
                1.5, 2.5, '2020-01-01', '2020-01-01 10:00', '2020-01-01 10:00+00', '10:00',
                '10:00+01', '1 day', '\\x01', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{}}',
                'happy', '{{1,2}}', '(1,2)', 4.5, B'101', 'a=>b', {i})"""
            for i in (1, 2, 3)
        ),
    ),
    ParityTable(
        "public",
        "full_identity",
        (
            "CREATE TABLE full_identity (id int PRIMARY KEY, name text, qty int NOT NULL)",
            "ALTER TABLE full_identity REPLICA IDENTITY FULL",
        ),
        ("INSERT INTO full_identity VALUES (1, 'one', 1), (2, 'two', 2), (3, NULL, 3)",),
    ),
    ParityTable(
        "public",
        "keyless",
        (
            "CREATE TABLE keyless (a int, b text)",
            "ALTER TABLE keyless REPLICA IDENTITY FULL",
        ),
        ("INSERT INTO keyless VALUES (1, 'x'), (1, 'x'), (2, NULL)",),
    ),
    ParityTable(
        "public",
        "ri_index",
        (
            "CREATE TABLE ri_index (u int NOT NULL, v text)",
            "CREATE UNIQUE INDEX ri_index_u ON ri_index (u)",
            "ALTER TABLE ri_index REPLICA IDENTITY USING INDEX ri_index_u",
        ),
        ("INSERT INTO ri_index VALUES (1, 'one'), (2, 'two')",),
    ),
    ParityTable(
        "public",
        "pk_change",
        ("CREATE TABLE pk_change (id int PRIMARY KEY, v text NOT NULL)",),
        ("INSERT INTO pk_change VALUES (1, 'one'), (2, 'two')",),
    ),
    ParityTable(
        "public",
        "pk_two",
        ("CREATE TABLE pk_two (a int, b text, v int, PRIMARY KEY (b, a))",),
        ("INSERT INTO pk_two VALUES (1, 'x', 10), (2, 'y', 20)",),
    ),
    ParityTable(
        "public",
        "toasty",
        (
            """CREATE TABLE toasty (id int PRIMARY KEY, small int, big text, big_bytes bytea,
                 big_json jsonb, big_arr text[])""",
            *(
                f"ALTER TABLE toasty ALTER COLUMN {c} SET STORAGE EXTERNAL"
                for c in ("big", "big_bytes", "big_json", "big_arr")
            ),
        ),
        (
            f"""INSERT INTO toasty SELECT i, i, {_BIG}, convert_to({_BIG}, 'UTF8'),
                jsonb_build_object('k', {_BIG}), ARRAY[{_BIG}]
                FROM generate_series(1, 4) AS i""",
        ),
    ),
    ParityTable(
        "public",
        "toasty_full",
        (
            "CREATE TABLE toasty_full (id int PRIMARY KEY, small int, big text)",
            "ALTER TABLE toasty_full ALTER COLUMN big SET STORAGE EXTERNAL",
            "ALTER TABLE toasty_full REPLICA IDENTITY FULL",
        ),
        (f"INSERT INTO toasty_full SELECT i, i, {_BIG} FROM generate_series(1, 2) AS i",),
    ),
    ParityTable(
        "public",
        "truncated",
        ("CREATE TABLE truncated (id int PRIMARY KEY, v text)",),
        ("INSERT INTO truncated VALUES (1, 'one'), (2, 'two')",),
    ),
    ParityTable(
        "Mixed Schema",
        "Odd Name-1",
        (
            'CREATE SCHEMA "Mixed Schema"',
            """CREATE TABLE "Mixed Schema"."Odd Name-1" ("Id" int PRIMARY KEY,
                 "Mixed Col" text, "UPPER" int, "with.dot" text, "naïve" text)""",
        ),
        ("""INSERT INTO "Mixed Schema"."Odd Name-1" VALUES (1, 'a', 1, 'd', 'é')""",),
    ),
    ParityTable(
        "public",
        "CamelCase",
        ('CREATE TABLE "CamelCase" ("Key" text PRIMARY KEY, "Value" int)',),
        ("""INSERT INTO "CamelCase" VALUES ('A', 1), ('b', 2)""",),
    ),
    ParityTable(
        "public",
        "array_shapes",
        # Values whose dimensions differ from the declaration (PostgreSQL does not enforce
        # it): 2-D in a 1-D column and 1-D in a 2-D one, beside ones that match.
        ("CREATE TABLE array_shapes (id int PRIMARY KEY, flat text[], nested int[][])",),
        (
            "INSERT INTO array_shapes VALUES (1, '{{a,b},{c,d}}', '{{1,2},{3,4}}'), "
            "(2, '{x,y}', '{5,6}')",
        ),
    ),
    ParityTable("public", "parity_done", ("CREATE TABLE parity_done (id int PRIMARY KEY)",)),
)

SETUP: tuple[str, ...] = (*SETUP_SQL, "CREATE SEQUENCE unused_seq")
# The golden unit tests' copy of all_types, every literal included (UNCARRIED too): in a
# schema neither system captures.
GOLDEN_SCHEMA = "golden"
GOLDEN_SETUP: tuple[str, ...] = (
    f"CREATE SCHEMA {GOLDEN_SCHEMA}",
    create_table_sql(f"{GOLDEN_SCHEMA}.all_types"),
    *insert_sql(f"{GOLDEN_SCHEMA}.all_types"),
)

# Changes made while both systems stream, one list of statements per transaction.
CHANGES: tuple[tuple[str, ...], ...] = (
    # Every edge value again, streamed this time (pgoutput text instead of the snapshot's read).
    _all_types_rows(STREAM_ID_OFFSET),
    (
        "UPDATE all_types SET c_text = 'changed', c_int4 = 7 WHERE id = 1",
        "DELETE FROM all_types WHERE id = 2",
        f"DELETE FROM all_types WHERE id = {STREAM_ID_OFFSET + 3}",
    ),
    (
        "INSERT INTO defaults (id) VALUES (10)",
        "INSERT INTO defaults (id, d_text) VALUES (11, 'x')",
        "INSERT INTO defaults (id, d_text, d_int2) VALUES (12, NULL, NULL)",
    ),
    ("INSERT INTO serial_pk DEFAULT VALUES", "DELETE FROM serial_pk WHERE id = 1"),
    ("UPDATE defaults SET d_int = 1 WHERE id = 1", "DELETE FROM defaults WHERE id = 2"),
    ("UPDATE not_null SET n_int = 99 WHERE id = 1", "DELETE FROM not_null WHERE id = 2"),
    (
        "UPDATE full_identity SET name = 'uno' WHERE id = 1",
        "UPDATE full_identity SET qty = 20 WHERE id = 2",
        "DELETE FROM full_identity WHERE id = 3",
        "UPDATE full_identity SET id = 30 WHERE id = 2",
    ),
    (
        "INSERT INTO keyless VALUES (3, 'new')",
        "UPDATE keyless SET b = 'changed' WHERE a = 2",
        "DELETE FROM keyless WHERE a = 3",
    ),
    (
        "INSERT INTO ri_index VALUES (3, 'three')",
        "UPDATE ri_index SET v = 'uno' WHERE u = 1",
        "UPDATE ri_index SET u = 20 WHERE u = 2",
        "DELETE FROM ri_index WHERE u = 3",
    ),
    ("UPDATE pk_change SET id = 10 WHERE id = 1",),
    (
        "UPDATE pk_change SET id = 20, v = 'twenty' WHERE id = 2",
        "DELETE FROM pk_change WHERE id = 10",
    ),
    ("UPDATE pk_two SET a = 5 WHERE b = 'x'", "UPDATE pk_two SET v = 21 WHERE b = 'y'"),
    # TOAST: an update that leaves the big values alone, one that changes one, a key change
    # that leaves them alone, a delete.
    ("UPDATE toasty SET small = 10 WHERE id = 1",),
    ("UPDATE toasty SET big = 'short now' WHERE id = 2",),
    ("UPDATE toasty SET id = 30 WHERE id = 3",),
    ("DELETE FROM toasty WHERE id = 4",),
    ("UPDATE toasty_full SET small = 10 WHERE id = 1", "DELETE FROM toasty_full WHERE id = 2"),
    (
        "INSERT INTO truncated VALUES (3, 'three')",
        "UPDATE truncated SET v = 'uno' WHERE id = 1",
    ),
    (
        "INSERT INTO truncated VALUES (4, 'four')",
        "TRUNCATE truncated",
        "INSERT INTO truncated VALUES (5, 'five')",
    ),
    ("TRUNCATE keyless", "INSERT INTO keyless VALUES (7, 'after truncate')"),
    ("INSERT INTO array_shapes VALUES (3, '{{{p,q}},{{r,s}}}', '{7}')",),
    (
        """INSERT INTO "Mixed Schema"."Odd Name-1" VALUES (2, 'b', 2, 'e', 'ü')""",
        """UPDATE "Mixed Schema"."Odd Name-1" SET "Mixed Col" = 'A' WHERE "Id" = 1""",
        """UPDATE "Mixed Schema"."Odd Name-1" SET "Id" = 3 WHERE "Id" = 2""",
        """DELETE FROM "Mixed Schema"."Odd Name-1" WHERE "Id" = 1""",
    ),
    (
        """INSERT INTO "CamelCase" VALUES ('C', 3)""",
        """UPDATE "CamelCase" SET "Value" = 20 WHERE "Key" = 'b'""",
        """DELETE FROM "CamelCase" WHERE "Key" = 'A'""",
    ),
)

FINISH: tuple[str, ...] = ("INSERT INTO parity_done VALUES (1)",)
# Our reader stops after this many CHANGES and starts again for the rest (Debezium streams
# on): the first transaction after the restart must carry Debezium's source.sequence.
RESTART_AFTER = 9


# --- the non-default modes ----------------------------------------------------------------
# A second, small capture of the columns the modes change, both systems set the same way.
MODES_DEBEZIUM = {
    "hstore.handling.mode": "map",
    "time.precision.mode": "connect",
    "include.unknown.datatypes": "false",
}
MODES_OURS = {
    "CDC_SCHEMA__HSTORE_HANDLING_MODE": "map",
    "CDC_SCHEMA__TIME_PRECISION_MODE": "connect",
    "CDC_SCHEMA__INCLUDE_UNKNOWN_DATATYPES": "false",
}
# all_types' columns of the types the modes touch: date, time, timestamp (and arrays of
# them), hstore, the unmapped types; timetz, timestamptz and interval stay as they are.
MODES_COLUMNS = frozenset(
    name
    for name, typ, _ in COLUMNS
    if name == "id"
    or typ.split("(")[0].split("[")[0].strip() in ("date", "time", "timestamp", "hstore")
    or name in ("c_timetz", "c_tstz", "c_interval", "c_tstz_arr")
    or name
    in ("c_box", "c_circle", "c_line", "c_lseg", "c_path", "c_polygon", "c_tsquery", "c_pg_lsn")
)
MODES_STREAM_ID_OFFSET = 2000


def _modes_rows(id_offset: int) -> tuple[str, ...]:
    return tuple(
        f"INSERT INTO modes (id, {name}) VALUES ({i + id_offset}, {lit})"
        for i, name, lit in literal_rows()
        if name in MODES_COLUMNS and (name, lit) not in UNCARRIED
    )


def _modes_ddl() -> str:
    cols = ",\n  ".join(f"{name} {typ}" for name, typ, _ in COLUMNS if name in MODES_COLUMNS)
    return f"CREATE TABLE modes (\n  {cols},\n  c_hstore_big hstore\n)"


_BIG_HSTORE = "hstore('k', repeat(md5(i::text), 200))"  # TOASTed out of line when EXTERNAL

MODES_TABLES: tuple[ParityTable, ...] = (
    ParityTable(
        "public",
        "modes",
        (
            _modes_ddl(),
            "ALTER TABLE modes ALTER COLUMN c_hstore_big SET STORAGE EXTERNAL",
            "ALTER TABLE modes REPLICA IDENTITY FULL",
        ),
        (
            *_modes_rows(0),
            f"INSERT INTO modes (id, c_hstore_big, c_pg_lsn) SELECT i, {_BIG_HSTORE}, '0/1' "
            "FROM generate_series(900, 901) AS i",
        ),
    ),
    ParityTable("public", "modes_done", ("CREATE TABLE modes_done (id int PRIMARY KEY)",)),
)
MODES_SENTINEL = ("public", "modes_done")
MODES_CHANGES: tuple[tuple[str, ...], ...] = (
    _modes_rows(MODES_STREAM_ID_OFFSET),
    (
        "UPDATE modes SET c_hstore = 'x=>y', c_date = '2000-01-01' WHERE id = 1",
        "DELETE FROM modes WHERE id = 2",
    ),
    # Unchanged TOAST under REPLICA IDENTITY FULL (the old row has it), and a changed one.
    ("UPDATE modes SET c_pg_lsn = '0/2' WHERE id = 900",),
    ("UPDATE modes SET c_hstore_big = 'a=>b' WHERE id = 901",),
    ("INSERT INTO modes_done VALUES (1)",),
)


def modes_captured() -> list[str]:
    """``schema.table`` of every table of the modes capture."""
    return [t.qualified for t in MODES_TABLES]


def captured() -> list[str]:
    """``schema.table`` of every captured table."""
    return [t.qualified for t in TABLES]
