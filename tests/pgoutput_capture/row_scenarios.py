"""Scenarios of row changes: inserts of every kind of value, updates and deletes under both
replica identities, unchanged TOAST, TRUNCATE, Type messages and binary values."""

from __future__ import annotations

from typing import Any

from tests.pgoutput_capture.capture import (
    P1,
    Capture,
    check_shape,
    hexbytes,
    msg,
    run,
    toast,
)

WIDE_TABLE = """
CREATE TABLE wide (
  id int PRIMARY KEY, name text, amount numeric(10,2), created timestamptz, flag boolean,
  payload bytea, doc jsonb, tags text[], ratio float8, code varchar(12), born date)
"""
WIDE_ROW = {
    "id": "1",
    "name": "'Zoë — naïve café ☕ 日本語'",
    "amount": "12345678.91",
    "created": "'2024-02-29 12:34:56.789012+00'::timestamptz",
    "flag": "true",
    "payload": "'\\x00ff10'::bytea",
    "doc": """'{"k": [1, 2.5, "ü"], "n": null}'::jsonb""",
    "tags": "ARRAY['a', 'b c', NULL, 'd\"e']",
    "ratio": "-1.5e-7::float8",
    "code": "'ABC'",
    "born": "'1999-12-31'::date",
}
NULL_ROW = {k: ("2" if k == "id" else "NULL") for k in WIDE_ROW}


def insert_sql(table: str, row: dict[str, str]) -> str:
    return f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(row.values())})"


def sc_insert(c: Capture) -> Any:
    """Insert a wide row with non-ASCII text and one with NULLs, in one transaction."""
    stmts = [
        f"BEGIN; {insert_sql('wide', WIDE_ROW)}; {insert_sql('wide', NULL_ROW)}; COMMIT",
    ]
    c.create_slot("s_insert")
    run(c, stmts)
    rows = c.changes("s_insert", P1)
    check_shape("insert", rows, "BRIIC")
    xid, end = rows[0][1], rows[-1][0]
    assert xid is not None
    expected = [
        c.begin(xid, end),
        c.relation("wide", "d"),
        msg(
            "Insert",
            relation_id=c.oid("wide"),
            new=[c.text(v) for v in WIDE_ROW.values()],
            xid=None,
        ),
        msg(
            "Insert",
            relation_id=c.oid("wide"),
            new=[c.text(v) for v in NULL_ROW.values()],
            xid=None,
        ),
        c.commit(xid, end),
    ]
    return stmts, P1, rows, expected


def sc_update_delete(c: Capture) -> Any:
    """Default identity: a plain update (no old tuple), a key change ('K'), a delete ('K')."""
    c.q("CREATE TABLE acct (id int PRIMARY KEY, owner text, balance bigint)")
    c.q("INSERT INTO acct VALUES (1, 'ann', 10), (2, 'bob', 20)")
    stmts = [
        "UPDATE acct SET balance = 11 WHERE id = 1",
        "UPDATE acct SET id = 3, owner = 'bøb' WHERE id = 2",
        "DELETE FROM acct WHERE id = 1",
    ]
    c.create_slot("s_upd")
    run(c, stmts)
    rows = c.changes("s_upd", P1)
    check_shape("update_delete", rows, "BRUCBUCBDC")
    oid = c.oid("acct")
    x1, x2, x3 = rows[0][1], rows[4][1], rows[7][1]
    assert x1 and x2 and x3
    expected = [
        c.begin(x1, rows[3][0]),
        c.relation("acct", "d"),
        msg("Update", relation_id=oid, old=None, old_kind=None, new=["1", "ann", "11"]),
        c.commit(x1, rows[3][0]),
        c.begin(x2, rows[6][0]),
        msg("Update", relation_id=oid, old=["2", None, None], old_kind="K", new=["3", "bøb", "20"]),
        c.commit(x2, rows[6][0]),
        c.begin(x3, rows[9][0]),
        msg("Delete", relation_id=oid, old=["1", None, None], old_kind="K"),
        c.commit(x3, rows[9][0]),
    ]
    return stmts, P1, rows, expected


def sc_identity_full(c: Capture) -> Any:
    """REPLICA IDENTITY FULL: updates and deletes carry the whole old row ('O')."""
    c.q("CREATE TABLE full_row (id int PRIMARY KEY, note text, n int)")
    c.q("ALTER TABLE full_row REPLICA IDENTITY FULL")
    c.q("INSERT INTO full_row VALUES (1, 'før', NULL)")
    stmts = [
        "UPDATE full_row SET note = 'after', n = 5 WHERE id = 1",
        "DELETE FROM full_row WHERE id = 1",
    ]
    c.create_slot("s_full")
    run(c, stmts)
    rows = c.changes("s_full", P1)
    check_shape("identity_full", rows, "BRUCBDC")
    oid = c.oid("full_row")
    x1, x2 = rows[0][1], rows[4][1]
    assert x1 and x2
    expected = [
        c.begin(x1, rows[3][0]),
        c.relation("full_row", "f"),
        msg(
            "Update", relation_id=oid, old=["1", "før", None], old_kind="O", new=["1", "after", "5"]
        ),
        c.commit(x1, rows[3][0]),
        c.begin(x2, rows[6][0]),
        msg("Delete", relation_id=oid, old=["1", "after", "5"], old_kind="O"),
        c.commit(x2, rows[6][0]),
    ]
    return stmts, P1, rows, expected


def sc_toast(c: Capture) -> Any:
    """An update that leaves a TOASTed column alone sends it as 'u' (unchanged)."""
    c.q("CREATE TABLE doc (id int PRIMARY KEY, title text, body text)")
    # EXTERNAL storage: never compressed, so a 20 kB value is surely stored out of line.
    c.q("ALTER TABLE doc ALTER COLUMN body SET STORAGE EXTERNAL")
    c.q("INSERT INTO doc VALUES (1, 'old title', repeat('x', 20000))")
    stmts = ["UPDATE doc SET title = 'new title' WHERE id = 1"]
    c.create_slot("s_toast")
    run(c, stmts)
    rows = c.changes("s_toast", P1)
    check_shape("toast", rows, "BRUC")
    xid = rows[0][1]
    assert xid
    expected = [
        c.begin(xid, rows[-1][0]),
        c.relation("doc", "d"),
        msg(
            "Update",
            relation_id=c.oid("doc"),
            old=None,
            old_kind=None,
            new=["1", "new title", toast()],
        ),
        c.commit(xid, rows[-1][0]),
    ]
    return stmts, P1, rows, expected


def sc_truncate(c: Capture) -> Any:
    """TRUNCATE of two tables, with and without CASCADE / RESTART IDENTITY."""
    c.q("CREATE TABLE parent (id serial PRIMARY KEY)")
    c.q("CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent(id))")
    c.q("CREATE TABLE other (id int PRIMARY KEY)")
    stmts = [
        "TRUNCATE parent RESTART IDENTITY CASCADE",
        "TRUNCATE other",
    ]
    c.create_slot("s_trunc")
    run(c, stmts)
    rows = c.changes("s_trunc", P1)
    check_shape("truncate", rows, "BRRTCBRTC")
    x1, x2 = rows[0][1], rows[5][1]
    assert x1 and x2
    # The relation order inside the first Truncate follows the server's list; read it from
    # the Relation messages' order, which we also expect.
    expected = [
        c.begin(x1, rows[4][0]),
        c.relation("parent", "d"),
        c.relation("child", "d"),
        msg(
            "Truncate",
            relation_ids=[c.oid("parent"), c.oid("child")],
            cascade=True,
            restart_identity=True,
        ),
        c.commit(x1, rows[4][0]),
        c.begin(x2, rows[8][0]),
        c.relation("other", "d"),
        msg("Truncate", relation_ids=[c.oid("other")], cascade=False, restart_identity=False),
        c.commit(x2, rows[8][0]),
    ]
    return stmts, P1, rows, expected


def sc_type(c: Capture) -> Any:
    """A column of an enum type and one of a domain make the server send Type messages."""
    c.q("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    c.q("CREATE TABLE person (id int PRIMARY KEY, m mood)")
    stmts = ["INSERT INTO person VALUES (1, 'happy')"]
    c.create_slot("s_type")
    run(c, stmts)
    rows = c.changes("s_type", P1)
    check_shape("type", rows, "BYRIC")
    xid = rows[0][1]
    assert xid
    expected = [
        c.begin(xid, rows[-1][0]),
        c.type_msg("mood"),
        c.relation("person", "d"),
        msg("Insert", relation_id=c.oid("person"), new=["1", "happy"]),
        c.commit(xid, rows[-1][0]),
    ]
    return stmts, P1, rows, expected


def sc_binary(c: Capture) -> Any:
    """The 'binary' option sends values in the types' binary format ('b')."""
    opts = {**P1, "binary": "true"}
    c.q("CREATE TABLE bin_t (id int PRIMARY KEY, name text, n bigint, note text)")
    stmts = ["INSERT INTO bin_t VALUES (42, 'ünï', -5, NULL)"]
    c.create_slot("s_bin")
    run(c, stmts)
    rows = c.changes("s_bin", opts)
    check_shape("binary", rows, "BRIC")
    xid = rows[0][1]
    assert xid
    new = [
        hexbytes(bytes(c.one("SELECT int4send(42)"))),
        hexbytes(bytes(c.one("SELECT textsend('ünï')"))),
        hexbytes(bytes(c.one("SELECT int8send(-5)"))),
        None,
    ]
    expected = [
        c.begin(xid, rows[-1][0]),
        c.relation("bin_t", "d"),
        msg("Insert", relation_id=c.oid("bin_t"), new=new),
        c.commit(xid, rows[-1][0]),
    ]
    return stmts, opts, rows, expected
