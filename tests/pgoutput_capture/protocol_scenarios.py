"""Scenarios of the protocol's other messages: logical messages, replication origins,
streamed in-progress transactions (protocol 2) and two-phase commit (protocol 3)."""

from __future__ import annotations

from typing import Any

from tests.pgoutput_capture.capture import (
    P1,
    Capture,
    Json,
    check_shape,
    hexbytes,
    msg,
    types_of,
)


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
