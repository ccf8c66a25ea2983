"""The database of test_keys_and_truncate.py: the tables of cases 1, 2, 3 and 5, the rows the
first snapshot finds, and the changes streamed after it."""

from __future__ import annotations

import psycopg

from tests.integration.real_databases.support import Table

# -- case 1: TRUNCATE in every form ---------------------------------------------------------

T_SINGLE = Table("public", "t_single")  # TRUNCATE t, then rows again in a later transaction
T_PAIR_A = Table("public", "t_pair_a")  # TRUNCATE a, b (a gets rows again, b stays empty)
T_PAIR_B = Table("public", "t_pair_b")
T_PARENT = Table("public", "t_parent")  # TRUNCATE parent CASCADE empties child too
T_CHILD = Table("public", "t_child")
T_IDENT = Table("public", "t_ident")  # RESTART IDENTITY: the new rows reuse the old keys
T_TXN = Table("public", "t_txn")  # rows inserted before and after it in its transaction
TRUNCATED = [T_SINGLE, T_PAIR_A, T_PAIR_B, T_PARENT, T_CHILD, T_IDENT, T_TXN]
EMPTY_AFTER = {T_PAIR_B, T_CHILD}

# -- case 2: keys from the replica identity -------------------------------------------------

K_LOG = Table("public", "k_log", key=())  # no key at all: keyless
K_FULL = Table("public", "k_full", key=())  # REPLICA IDENTITY FULL, no key: keyless
K_INDEX = Table("public", "k_index", key=("email",))  # identity index email, primary key id
K_NAMED = Table("public", "k_named", key=("code",))  # keyed by message_key_columns
KEYLESS = [K_LOG, K_FULL]
KEYED = [K_INDEX, K_NAMED]
MESSAGE_KEY_COLUMNS = "public\\.k_named:code"

# -- case 3: re-snapshots -------------------------------------------------------------------

R_SWITCH = Table("public", "r_switch")  # re-snapshot with schemas_enable switched
R_BIGINT = Table("public", "r_bigint")  # re-snapshot after ALTER COLUMN id TYPE bigint
RESNAPSHOT = [R_SWITCH, R_BIGINT]
RESNAPSHOT_ROWS = 300

# -- case 5: TOAST --------------------------------------------------------------------------

TOAST_KEY = Table("public", "toast_key")  # a TOASTed primary key, updated without touching it
TOAST_TYPES = Table("public", "toast_types")  # TOASTed numeric, int[], jsonb, bytea, text
TOASTED = [TOAST_KEY, TOAST_TYPES]
TOAST_COLUMNS = ("n", "n_fixed", "ints", "doc", "b", "txt")
# Moved out of line with its row past 2 kB (a filler kept in line makes it so): a key of
# 300 bytes, which every follower can use as an id (OpenSearch takes at most 512 bytes).
BIG_KEY = "k" * 300
FILLER = "(SELECT string_agg(md5(x::text), '') FROM generate_series(1, 60) x)"

ALL = [*TRUNCATED, *KEYLESS, *KEYED, *RESNAPSHOT, *TOASTED]
# The second new snapshot (schemas_enable off) covers these. r_bigint keeps the first one's
# outcome for the followers to show; numeric values need their schema to be decoded.
SCHEMALESS = [*TRUNCATED, *KEYED, R_SWITCH]


def table_list(tables: list[Table]) -> str:
    """``postgres.tables`` naming ``tables``."""
    return ",".join(f"{t.schema}.{t.name}" for t in tables)


SETUP = """
CREATE TABLE t_single (id int PRIMARY KEY, v text);
CREATE TABLE t_pair_a (id int PRIMARY KEY, v text);
CREATE TABLE t_pair_b (id int PRIMARY KEY, v text);
CREATE TABLE t_parent (id int PRIMARY KEY, v text);
CREATE TABLE t_child (id int PRIMARY KEY, parent_id int REFERENCES t_parent (id));
CREATE TABLE t_ident (id serial PRIMARY KEY, v text);
CREATE TABLE t_txn (id int PRIMARY KEY, v text);

CREATE TABLE k_log (at timestamptz NOT NULL DEFAULT now(), message text);
CREATE TABLE k_full (a int, b text);
ALTER TABLE k_full REPLICA IDENTITY FULL;
CREATE TABLE k_index (id int PRIMARY KEY, email text NOT NULL, note text);
CREATE UNIQUE INDEX k_index_email ON k_index (email);
ALTER TABLE k_index REPLICA IDENTITY USING INDEX k_index_email;
CREATE TABLE k_named (code text NOT NULL, v int);
ALTER TABLE k_named REPLICA IDENTITY FULL;

CREATE TABLE r_switch (id int PRIMARY KEY, v text);
CREATE TABLE r_bigint (id int PRIMARY KEY, v text);

CREATE TABLE toast_key (id text PRIMARY KEY, v text, filler text);
ALTER TABLE toast_key ALTER COLUMN id SET STORAGE EXTERNAL;
ALTER TABLE toast_key ALTER COLUMN filler SET STORAGE MAIN;
CREATE TABLE toast_types (
  id int PRIMARY KEY, touched int NOT NULL DEFAULT 0,
  n numeric, n_fixed numeric(1000, 2), ints int[], doc jsonb, b bytea, txt text
);
"""
# Stored out of line and uncompressed (once a row passes 2 kB, every value down to a 128-byte
# row), so an UPDATE that leaves them alone sends them as "unchanged TOAST" (pgoutput's 'u').
TOAST_STORAGE = "ALTER TABLE toast_types SET (toast_tuple_target = 128);\n" + "".join(
    f"ALTER TABLE toast_types ALTER COLUMN {c} SET STORAGE EXTERNAL;\n" for c in TOAST_COLUMNS
)

SNAPSHOT_ROWS = f"""
INSERT INTO t_single SELECT g, 'single ' || g FROM generate_series(1, 50) g;
INSERT INTO t_pair_a SELECT g, 'a ' || g FROM generate_series(1, 20) g;
INSERT INTO t_pair_b SELECT g, 'b ' || g FROM generate_series(1, 20) g;
INSERT INTO t_parent SELECT g, 'parent ' || g FROM generate_series(1, 10) g;
INSERT INTO t_child SELECT g, 1 + g % 10 FROM generate_series(1, 30) g;
INSERT INTO t_ident (v) SELECT 'ident ' || g FROM generate_series(1, 15) g;
INSERT INTO t_txn SELECT g, 'txn ' || g FROM generate_series(1, 40) g;

INSERT INTO k_log (message) SELECT 'log ' || g FROM generate_series(1, 10) g;
INSERT INTO k_full SELECT g, 'full ' || g FROM generate_series(1, 10) g;
INSERT INTO k_index SELECT g, 'user' || g || '@example.org', 'note' FROM generate_series(1, 20) g;
INSERT INTO k_named SELECT 'code-' || g, g FROM generate_series(1, 20) g;

INSERT INTO r_switch SELECT g, 'switch ' || g FROM generate_series(1, {RESNAPSHOT_ROWS}) g;
INSERT INTO r_bigint SELECT g, 'bigint ' || g FROM generate_series(1, {RESNAPSHOT_ROWS}) g;

INSERT INTO toast_key VALUES ('{BIG_KEY}', 'first', {FILLER}), ('small', 'first', NULL);
INSERT INTO toast_types (id, n, n_fixed, ints, doc, b, txt)
SELECT g,
       (repeat('7', 300) || '.' || g)::numeric,
       (repeat('9', 200) || '.5' || g % 10)::numeric(1000, 2),
       ARRAY(SELECT x * g FROM generate_series(1, 200) x),
       jsonb_build_object('g', g, 'items', (SELECT jsonb_agg(md5(x::text)) FROM generate_series(1, 20) x)),
       (SELECT string_agg(decode(md5((x + g)::text), 'hex'), ''::bytea) FROM generate_series(1, 20) x),
       (SELECT string_agg(md5((x * g)::text), '') FROM generate_series(1, 20) x)
FROM generate_series(1, 4) g;
"""

CHANGES = [
    # case 1
    "TRUNCATE t_single",
    "INSERT INTO t_single SELECT g, 'again ' || g FROM generate_series(45, 55) g",
    "TRUNCATE t_pair_a, t_pair_b",
    "INSERT INTO t_pair_a VALUES (3, 'a again')",
    "TRUNCATE t_parent CASCADE",
    "INSERT INTO t_parent VALUES (1, 'parent again')",
    "TRUNCATE t_ident RESTART IDENTITY",
    "INSERT INTO t_ident (v) SELECT 'restarted ' || g FROM generate_series(1, 5) g",
    """BEGIN;
       INSERT INTO t_txn VALUES (1001, 'before the truncate');
       UPDATE t_txn SET v = 'updated before' WHERE id = 7;
       TRUNCATE t_txn;
       INSERT INTO t_txn VALUES (7, 'after the truncate'), (2000, 'new after');
       COMMIT""",
    # case 2
    "INSERT INTO k_log (message) VALUES ('streamed')",
    "UPDATE k_full SET b = 'changed' WHERE a <= 3",
    "DELETE FROM k_full WHERE a > 8",
    "UPDATE k_index SET email = 'moved' || id || '@example.org' WHERE id <= 5",
    "UPDATE k_index SET note = 'noted' WHERE id BETWEEN 6 AND 10",
    "DELETE FROM k_index WHERE id > 15",
    "UPDATE k_named SET v = v * 100 WHERE v <= 5",
    "UPDATE k_named SET code = 'recoded-' || v WHERE v BETWEEN 6 AND 8",
    "DELETE FROM k_named WHERE v > 17",
    # case 5: updates that leave every TOASTed value alone
    "UPDATE toast_key SET v = 'second'",
    "UPDATE toast_types SET touched = touched + 1",
    "UPDATE toast_types SET touched = touched + 1, txt = 'changed' WHERE id = 1",
]


def create(conn: psycopg.Connection[object]) -> None:
    """The tables and the rows the first snapshot finds."""
    conn.execute(SETUP + TOAST_STORAGE)
    conn.execute(SNAPSHOT_ROWS)


def stream_changes(conn: psycopg.Connection[object]) -> None:
    """The changes the reader streams after the first snapshot, one transaction each."""
    for statement in CHANGES:
        conn.execute(statement)
