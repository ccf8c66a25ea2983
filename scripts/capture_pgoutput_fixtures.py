#!/usr/bin/env python3
"""Capture pgoutput byte fixtures from a real PostgreSQL into tests/fixtures/pgoutput/.

Each scenario runs some SQL against a fresh database, reads the slot with
``pg_logical_slot_get_binary_changes`` and writes:

- ``<scenario>.bin``: the messages, each as a 4-byte big-endian length then the bytes;
- an entry in ``manifest.json``: the SQL, the options, and for every message the fields a
  decoder must produce.

The expected fields come from PostgreSQL, never from our decoder: text values are the type
output functions' results (``concat(expr)``), binary values come from the ``*send``
functions, ids from the catalogs, xids from the slot function, commit timestamps from
``pg_xact_commit_timestamp`` and commit LSNs from ``pg_walinspect``.

Needs a superuser on a server with ``wal_level=logical``, ``track_commit_timestamp=on`` and
``max_prepared_transactions > 0``, e.g. a throwaway one::

    su postgres -c "/usr/lib/postgresql/15/bin/initdb -D /tmp/pgcap"
    # postgresql.conf: port=55499, unix_socket_directories='/tmp', wal_level=logical,
    #   track_commit_timestamp=on, max_prepared_transactions=5, logical_decoding_work_mem=64kB
    .venv/bin/python scripts/capture_pgoutput_fixtures.py --dsn "host=/tmp port=55499 user=postgres"
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "pgoutput"
DB = "pgoutput_capture"
PG_EPOCH_UNIX_US = 946_684_800_000_000

Row = tuple[str, int | None, bytes]  # lsn, xid, data
Json = dict[str, Any]


class Capture:
    """One database, one logical slot per scenario."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, dbname=DB, autocommit=True)
        self.conn.execute("SET TimeZone = 'UTC'")
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")

    def q(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(query, args or None)  # type: ignore[call-overload]
        return cur.fetchall() if cur.description else []

    def one(self, query: str, *args: Any) -> Any:
        return self.q(query, *args)[0][0]

    def text(self, expr: str) -> str | None:
        """What PostgreSQL's output function makes of a SQL expression: the oracle."""
        # concat() renders through the type's output function, as pgoutput does; a ::text
        # cast would not (bool casts to 'true' but is output as 't').
        is_null, rendered = self.q(f"SELECT ({expr}) IS NULL, concat(({expr}))")[0]
        return None if is_null else str(rendered)

    def create_slot(self, slot: str, two_phase: bool = False) -> None:
        self.q(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)", slot, two_phase
        )

    def changes(self, slot: str, options: dict[str, str]) -> list[Row]:
        flat = [x for kv in options.items() for x in kv]
        placeholders = ", ".join(["%s"] * len(flat))
        rows = self.q(
            f"SELECT lsn::text, xid::text::bigint, data FROM "
            f"pg_logical_slot_get_binary_changes(%s, NULL, NULL, {placeholders})",
            slot,
            *flat,
        )
        self.q("SELECT pg_drop_replication_slot(%s)", slot)
        return [(lsn, xid, bytes(data)) for lsn, xid, data in rows]

    # ------------------------------------------------------------ expected-field builders

    def relation(self, table: str, identity: str, xid: int | None = None) -> Json:
        oid, nsp, name = self.q(
            "SELECT c.oid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
            table,
        )[0]
        key_cols = {
            r[0]
            for r in self.q(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
                table,
            )
        }
        cols = []
        for attname, atttypid, atttypmod in self.q(
            "SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            table,
        ):
            # Under REPLICA IDENTITY FULL every column is part of the identity.
            is_key = identity == "f" or attname in key_cols
            cols.append(
                {
                    "flags": int(is_key),
                    "name": attname,
                    "type_oid": atttypid,
                    "type_modifier": atttypmod,
                }
            )
        return msg(
            "Relation",
            relation_id=oid,
            namespace=nsp,
            name=name,
            replica_identity=identity,
            columns=cols,
            xid=xid,
        )

    def type_msg(self, type_name: str, xid: int | None = None) -> Json:
        oid, nsp, name = self.q(
            "SELECT t.oid, n.nspname, t.typname FROM pg_type t JOIN pg_namespace n "
            "ON n.oid = t.typnamespace WHERE t.oid = %s::regtype",
            type_name,
        )[0]
        return msg("TypeMessage", type_oid=oid, namespace=nsp, name=name, xid=xid)

    def oid(self, table: str) -> int:
        return int(self.one("SELECT %s::regclass::oid", table))

    def commit_lsn(self, end_lsn: str) -> str:
        """The start of the COMMIT (or PREPARE...) record that ends at ``end_lsn``."""
        # Look back a little from the end; the commit record is the last one before end_lsn.
        rows = self.q(
            "SELECT start_lsn::text, record_type FROM pg_get_wal_records_info("
            "  %s::text::pg_lsn - 8192, %s::text::pg_lsn) WHERE end_lsn = %s::text::pg_lsn "
            "AND resource_manager = 'Transaction'",
            end_lsn,
            end_lsn,
            end_lsn,
        )
        if len(rows) != 1:
            raise SystemExit(f"no single Transaction record ends at {end_lsn}: {rows}")
        return str(rows[0][0])

    def commit_ts_us(self, xid: int) -> int:
        return int(
            self.one(
                "SELECT (extract(epoch FROM pg_xact_commit_timestamp(%s::text::xid)) * 1e6)::bigint",
                xid,
            )
        )

    def begin(self, xid: int, commit_end: str) -> Json:
        return msg(
            "Begin",
            final_lsn=self.commit_lsn(commit_end),
            commit_ts_us=self.commit_ts_us(xid),
            xid=xid,
        )

    def commit(self, xid: int, commit_end: str) -> Json:
        return msg(
            "Commit",
            flags=0,
            commit_lsn=self.commit_lsn(commit_end),
            end_lsn=commit_end,
            commit_ts_us=self.commit_ts_us(xid),
        )


def msg(type_: str, **fields: Any) -> Json:
    return {"type": type_, "fields": fields}


def toast() -> Json:
    return {"unchanged_toast": True}


def hexbytes(b: bytes) -> Json:
    return {"hex": b.hex()}


def write_bin(out: Path, name: str, rows: Sequence[Row]) -> None:
    with open(out / f"{name}.bin", "wb") as f:
        for _, _, data in rows:
            f.write(struct.pack("!I", len(data)))
            f.write(data)


def types_of(rows: Sequence[Row]) -> str:
    return "".join(chr(r[2][0]) for r in rows)


def check_shape(name: str, rows: Sequence[Row], shape: str) -> None:
    got = types_of(rows)
    if got != shape:
        raise SystemExit(f"scenario {name}: expected message types {shape!r}, server sent {got!r}")


# ---------------------------------------------------------------------------- scenarios
# Each returns (sql run, slot options, rows, expected messages).

Scenario = Callable[[Capture], tuple[list[str], dict[str, str], list[Row], list[Json]]]
P1 = {"proto_version": "1", "publication_names": "pub"}

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


def run(c: Capture, statements: Sequence[str]) -> None:
    for s in statements:
        c.q(s)


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


def sc_message(c: Capture) -> Any:
    """pg_logical_emit_message: transactional (inside Begin/Commit) and not."""
    opts = {**P1, "messages": "true"}
    c.q("CREATE TABLE note (id int PRIMARY KEY)")
    stmts = [
        "BEGIN; INSERT INTO note VALUES (1); "
        "SELECT pg_logical_emit_message(true, 'app/tx', 'héllo'::bytea); COMMIT",
        "SELECT pg_logical_emit_message(false, 'app/now', '\\x00ff'::bytea)",
    ]
    c.create_slot("s_msg")
    # Capture the LSNs the emit calls return: the oracle for LogicalMessage.lsn.
    c.q("BEGIN")
    c.q("INSERT INTO note VALUES (1)")
    tx_lsn = c.one(
        "SELECT pg_logical_emit_message(true, 'app/tx', convert_to('héllo', 'UTF8'))::text"
    )
    c.q("COMMIT")
    now_lsn = c.one("SELECT pg_logical_emit_message(false, 'app/now', '\\x00ff'::bytea)::text")
    # A non-transactional message is not flushed by itself; a commit (of DDL, which the
    # server skips as an empty transaction) flushes the WAL so the slot function sees it.
    c.q("CREATE TABLE flush_marker (x int)")
    rows = c.changes("s_msg", opts)
    check_shape("message", rows, "BRIMCM")
    xid = rows[0][1]
    assert xid
    expected = [
        c.begin(xid, rows[4][0]),
        c.relation("note", "d"),
        msg("Insert", relation_id=c.oid("note"), new=["1"]),
        msg(
            "LogicalMessage",
            transactional=True,
            lsn=tx_lsn,
            prefix="app/tx",
            content=hexbytes("héllo".encode()),
            xid=None,
        ),
        c.commit(xid, rows[4][0]),
        msg(
            "LogicalMessage",
            transactional=False,
            lsn=now_lsn,
            prefix="app/now",
            content=hexbytes(b"\x00\xff"),
            xid=None,
        ),
    ]
    return stmts, opts, rows, expected


def sc_origin(c: Capture) -> Any:
    """A transaction replayed under a replication origin carries an Origin message."""
    c.q("CREATE TABLE replica_t (id int PRIMARY KEY)")
    c.q("SELECT pg_replication_origin_create('upstream_a')")
    stmts = [
        "SELECT pg_replication_origin_session_setup('upstream_a')",
        "BEGIN; SELECT pg_replication_origin_xact_setup('1/ABCDEF0', now()); "
        "INSERT INTO replica_t VALUES (7); COMMIT",
        "SELECT pg_replication_origin_session_reset()",
    ]
    c.create_slot("s_origin")
    c.q("SELECT pg_replication_origin_session_setup('upstream_a')")
    c.q("BEGIN")
    c.q("SELECT pg_replication_origin_xact_setup('1/ABCDEF0', now())")
    c.q("INSERT INTO replica_t VALUES (7)")
    c.q("COMMIT")
    c.q("SELECT pg_replication_origin_session_reset()")
    rows = c.changes("s_origin", P1)
    check_shape("origin", rows, "BORIC")
    xid = rows[0][1]
    assert xid
    expected = [
        c.begin(xid, rows[-1][0]),
        msg("Origin", commit_lsn="1/ABCDEF0", name="upstream_a"),
        c.relation("replica_t", "d"),
        msg("Insert", relation_id=c.oid("replica_t"), new=["7"]),
        c.commit(xid, rows[-1][0]),
    ]
    c.q("SELECT pg_replication_origin_drop('upstream_a')")
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


STREAM_ROWS = 200


def sc_stream(c: Capture) -> Any:
    """Protocol 2 with streaming: a transaction larger than logical_decoding_work_mem is sent
    in chunks while in progress, each DML carrying its xid; a rolled-back subtransaction
    produces a Stream Abort for the sub-xid; then Stream Commit."""
    opts = {"proto_version": "2", "publication_names": "pub", "streaming": "on"}
    wm = c.one("SHOW logical_decoding_work_mem")
    if wm != "64kB":
        raise SystemExit(f"scenario stream needs logical_decoding_work_mem=64kB, server has {wm}")
    c.q("CREATE TABLE big (id int PRIMARY KEY, pad text)")
    stmts = [
        "BEGIN",
        f"INSERT INTO big SELECT g, repeat('p', 400) FROM generate_series(1, {STREAM_ROWS}) g",
        "SAVEPOINT sp",
        f"INSERT INTO big SELECT g, repeat('q', 400) FROM generate_series({STREAM_ROWS + 1}, {2 * STREAM_ROWS}) g",
        "ROLLBACK TO SAVEPOINT sp",
        "COMMIT",
    ]
    c.create_slot("s_stream")
    c.q(stmts[0])
    c.q(stmts[1])
    c.q(stmts[2])
    c.q(stmts[3])
    # A subtransaction holds a lock on its own xid: the oracle for the sub-xid.
    top = int(c.one("SELECT pg_current_xact_id()::text::bigint"))
    xids = {
        int(r[0])
        for r in c.q(
            "SELECT transactionid::text::bigint FROM pg_locks WHERE locktype = 'transactionid' "
            "AND pid = pg_backend_pid()"
        )
    }
    (subxid,) = xids - {top}
    c.q(stmts[4])
    c.q(stmts[5])
    rows = c.changes("s_stream", opts)
    shape = types_of(rows)
    if "S" not in shape or "c" not in shape or "A" not in shape:
        raise SystemExit(f"scenario stream: server did not stream (types {shape[:40]!r}...)")
    xid = rows[0][1]
    assert xid
    oid = c.oid("big")
    expected: list[Json] = []
    seen_relation = False
    ids = iter(range(1, 2 * STREAM_ROWS + 1))
    commit_end = rows[-1][0]
    for _lsn, _xid, data in rows:
        t = chr(data[0])
        if t == "S":
            first = not expected
            expected.append(msg("StreamStart", xid=xid, first_segment=first))
        elif t == "E":
            expected.append(msg("StreamStop"))
        elif t == "R":
            if seen_relation:
                raise SystemExit("scenario stream: unexpected second Relation")
            seen_relation = True
            expected.append(c.relation("big", "d", xid=xid))
        elif t == "I":
            i = next(ids)
            # Written as {"repeat", "times"} to keep the manifest small.
            pad = {"repeat": "p" if i <= STREAM_ROWS else "q", "times": 400}
            # Rows of the subtransaction carry the sub-xid, not the top-level one.
            expected.append(
                msg(
                    "Insert",
                    relation_id=oid,
                    new=[str(i), pad],
                    xid="top" if i <= STREAM_ROWS else "sub",
                )
            )
        elif t == "A":
            expected.append(msg("StreamAbort", xid=xid, subxid="sub"))
        elif t == "c":
            expected.append(
                msg(
                    "StreamCommit",
                    xid=xid,
                    flags=0,
                    commit_lsn=c.commit_lsn(commit_end),
                    end_lsn=commit_end,
                    commit_ts_us=c.commit_ts_us(xid),
                )
            )
        else:
            raise SystemExit(f"scenario stream: unexpected message type {t!r}")
    if xid != top:
        raise SystemExit(f"scenario stream: slot reports xid {xid}, session had {top}")
    for e in expected:
        f = e["fields"]
        for k in ("xid", "subxid"):
            if f.get(k) == "top":
                f[k] = xid
            elif f.get(k) == "sub":
                f[k] = subxid
    return stmts, opts, rows, expected


def sc_two_phase(c: Capture) -> Any:
    """Protocol 3 with two_phase: PREPARE TRANSACTION then COMMIT / ROLLBACK PREPARED."""
    opts = {"proto_version": "3", "publication_names": "pub", "two_phase": "on"}
    c.q("CREATE TABLE tp (id int PRIMARY KEY)")
    stmts = [
        "BEGIN; INSERT INTO tp VALUES (1); PREPARE TRANSACTION 'gid-commit'",
        "COMMIT PREPARED 'gid-commit'",
        "BEGIN; INSERT INTO tp VALUES (2); PREPARE TRANSACTION 'gid-rollback'",
        "ROLLBACK PREPARED 'gid-rollback'",
    ]
    c.create_slot("s_2pc", two_phase=True)
    prepared_ts = {}
    for gid, value, finish in (("gid-commit", 1, "COMMIT"), ("gid-rollback", 2, "ROLLBACK")):
        c.q("BEGIN")
        c.q("INSERT INTO tp VALUES (%s)", value)
        c.q(f"PREPARE TRANSACTION '{gid}'")
        # The prepare time PostgreSQL logged is what pg_prepared_xacts shows.
        prepared_ts[gid] = int(
            c.one(
                "SELECT (extract(epoch FROM prepared) * 1e6)::bigint FROM pg_prepared_xacts WHERE gid = %s",
                gid,
            )
        )
        c.q(f"{finish} PREPARED '{gid}'")
    rows = c.changes("s_2pc", opts)
    check_shape("two_phase", rows, "bRIPKbIPr")
    x1, x2 = rows[0][1], rows[5][1]
    assert x1 and x2
    oid = c.oid("tp")
    prep1_end, commit_end = rows[3][0], rows[4][0]
    prep2_end, rollback_end = rows[7][0], rows[8][0]
    prep1_lsn, prep2_lsn = c.commit_lsn(prep1_end), c.commit_lsn(prep2_end)
    ts1, ts2 = prepared_ts["gid-commit"], prepared_ts["gid-rollback"]
    expected = [
        msg(
            "BeginPrepare",
            prepare_lsn=prep1_lsn,
            end_lsn=prep1_end,
            prepare_ts_us=ts1,
            xid=x1,
            gid="gid-commit",
        ),
        c.relation("tp", "d"),
        msg("Insert", relation_id=oid, new=["1"]),
        msg(
            "Prepare",
            flags=0,
            prepare_lsn=prep1_lsn,
            end_lsn=prep1_end,
            prepare_ts_us=ts1,
            xid=x1,
            gid="gid-commit",
            streamed=False,
        ),
        msg(
            "CommitPrepared",
            flags=0,
            commit_lsn=c.commit_lsn(commit_end),
            end_lsn=commit_end,
            commit_ts_us=c.commit_ts_us(x1),
            xid=x1,
            gid="gid-commit",
        ),
        msg(
            "BeginPrepare",
            prepare_lsn=prep2_lsn,
            end_lsn=prep2_end,
            prepare_ts_us=ts2,
            xid=x2,
            gid="gid-rollback",
        ),
        msg("Insert", relation_id=oid, new=["2"]),
        msg(
            "Prepare",
            flags=0,
            prepare_lsn=prep2_lsn,
            end_lsn=prep2_end,
            prepare_ts_us=ts2,
            xid=x2,
            gid="gid-rollback",
            streamed=False,
        ),
        # No SQL oracle for the rollback time; the unit test checks it is after the prepare.
        msg(
            "RollbackPrepared",
            flags=0,
            prepare_end_lsn=prep2_end,
            rollback_end_lsn=rollback_end,
            prepare_ts_us=ts2,
            xid=x2,
            gid="gid-rollback",
        ),
    ]
    return stmts, opts, rows, expected


SCENARIOS: dict[str, Scenario] = {
    "insert": sc_insert,
    "update_delete": sc_update_delete,
    "identity_full": sc_identity_full,
    "toast": sc_toast,
    "truncate": sc_truncate,
    "type": sc_type,
    "message": sc_message,
    "origin": sc_origin,
    "binary": sc_binary,
    "stream": sc_stream,
    "two_phase": sc_two_phase,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dsn", required=True, help="libpq DSN of a superuser on a throwaway server")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB)))
        admin.execute(
            sql.SQL("CREATE DATABASE {} ENCODING 'UTF8' TEMPLATE template0").format(
                sql.Identifier(DB)
            )
        )
        version = admin.execute("SHOW server_version").fetchone()
    c = Capture(args.dsn)
    c.q(WIDE_TABLE)
    c.q("CREATE PUBLICATION pub FOR ALL TABLES")
    manifest: dict[str, Any] = {
        "server_version": version[0] if version else None,
        "format": "each message: 4-byte big-endian length, then the pgoutput bytes",
        "scenarios": {},
    }
    for name, scenario in SCENARIOS.items():
        stmts, opts, rows, expected = scenario(c)
        if len(rows) != len(expected):
            raise SystemExit(f"scenario {name}: {len(rows)} messages but {len(expected)} expected")
        write_bin(out, name, rows)
        manifest["scenarios"][name] = {
            "doc": (scenario.__doc__ or "").strip(),
            "sql": stmts,
            "options": opts,
            "file": f"{name}.bin",
            "messages": [
                {"slot_lsn": lsn, "slot_xid": xid, **e}
                for (lsn, xid, _), e in zip(rows, expected, strict=True)
            ],
        }
        print(f"{name}: {len(rows)} messages ({types_of(rows)[:60]})")
    c.conn.close()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(DB)))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
