"""ReplicationConnection against the real PostgreSQL of the stack, decoded with cdc.pgoutput.

Each test gets its own database (the ``pg_database`` fixture of tests/conftest.py, which
also drops the slots left in it).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from cdc import pgoutput as po
from cdc.replication import Keepalive, ReplicationConnection, XLogData
from pgcdc.core.errors import ConfigError, ConnectionFailed, SlotError
from pgcdc.core.lsn import Lsn
from tests.conftest import wait_until

pytestmark = pytest.mark.integration


def _slot() -> str:
    return f"repl_test_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def db(pg_database: str) -> Iterator[tuple[str, psycopg.Connection]]:
    """The test database's DSN and a normal autocommit connection holding table ``items``
    and publication ``pub``."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, 3) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE items")
        yield pg_database, conn


def read_until(
    repl: ReplicationConnection,
    decoder: po.Decoder,
    done: Callable[[po.PgOutputMessage], bool],
    timeout: float = 30.0,
) -> list[po.PgOutputMessage]:
    """Decode frames until ``done`` says so; fail at the deadline."""
    out: list[po.PgOutputMessage] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = repl.read(0.5)
        if isinstance(frame, XLogData):
            message = decoder.decode(frame.payload)
            out.append(message)
            if done(message):
                return out
    pytest.fail(f"no matching message within {timeout}s; got {[type(m).__name__ for m in out]}")


def confirmed_flush(conn: psycopg.Connection, slot: str) -> Lsn | None:
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return Lsn.parse(row[0]) if row and row[0] else None


def test_snapshot_then_stream_then_acknowledge(db: tuple[str, psycopg.Connection]) -> None:
    dsn, conn = db
    slot = _slot()
    repl = ReplicationConnection(dsn, application_name="repl_test")
    try:
        systemid, timeline, xlogpos, dbname = repl.identify_system()
        assert systemid.isdigit() and timeline >= 1 and xlogpos > Lsn(0)
        assert dbname == conn.info.dbname

        created = repl.create_slot(slot, export_snapshot=True)
        assert created.slot_name == slot and created.snapshot_name
        assert created.consistent_point >= xlogpos

        # A change committed after the slot's consistent point: it must be streamed, and it
        # must be invisible inside the exported snapshot.
        conn.execute("INSERT INTO items VALUES (4, 'after the snapshot')")
        with psycopg.connect(dsn) as reader, reader.transaction():
            reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            reader.execute(f"SET TRANSACTION SNAPSHOT '{created.snapshot_name}'")
            ids = [r[0] for r in reader.execute("SELECT id FROM items ORDER BY id")]
        assert ids == [1, 2, 3]

        repl.start(slot, "pub", created.consistent_point)
        decoder = po.Decoder(1)
        first = read_until(repl, decoder, lambda m: isinstance(m, po.Commit))
        inserts = [m for m in first if isinstance(m, po.Insert)]
        assert [m.new for m in inserts] == [("4", "after the snapshot")]
        relation = next(m for m in first if isinstance(m, po.Relation))
        assert (relation.namespace, relation.name) == ("public", "items")

        conn.execute("INSERT INTO items VALUES (5, 'fünf'), (6, NULL)")
        second = read_until(repl, decoder, lambda m: isinstance(m, po.Commit))
        assert [m.new for m in second if isinstance(m, po.Insert)] == [("5", "fünf"), ("6", None)]
        commit = second[-1]
        assert isinstance(commit, po.Commit)

        repl.acknowledge(commit.end_lsn)
        assert repl.flushed_lsn == commit.end_lsn
        wait_until(
            lambda: confirmed_flush(conn, slot) == commit.end_lsn,
            timeout=30,
            what=f"confirmed_flush_lsn to reach {commit.end_lsn}",
        )
        # Going backwards is ignored: the slot never moves back.
        repl.acknowledge(created.consistent_point)
        assert repl.flushed_lsn == commit.end_lsn
    finally:
        repl.close()

    # A new session on the slot resumes after the acknowledged transaction.
    conn.execute("INSERT INTO items VALUES (7, 'later')")
    with ReplicationConnection(dsn) as again:
        again.start(slot, "pub", Lsn(0))
        third = read_until(again, po.Decoder(1), lambda m: isinstance(m, po.Commit))
        assert [m.new for m in third if isinstance(m, po.Insert)] == [("7", "later")]


def _short_timeout(dsn: str) -> str:
    # wal_sender_timeout is settable per connection: the server asks for a reply after half
    # of it and disconnects a client that stays silent for all of it.
    return make_conninfo(dsn, options="-c wal_sender_timeout=2s")


class _Silent(ReplicationConnection):
    """A control: never answers the server."""

    def _send_status(self, reply_requested: bool = False) -> None:
        pass


def test_keepalive_replies_keep_an_idle_session_alive(db: tuple[str, psycopg.Connection]) -> None:
    dsn, conn = db
    slot = _slot()
    with ReplicationConnection(_short_timeout(dsn), status_interval_s=3600) as repl:
        created = repl.create_slot(slot, export_snapshot=False)
        repl.start(slot, "pub", created.consistent_point)
        idle_until = time.monotonic() + 6  # three times wal_sender_timeout
        requested = 0
        while time.monotonic() < idle_until:
            frame = repl.read(0.5)
            if isinstance(frame, Keepalive) and frame.reply_requested:
                requested += 1
        assert requested >= 2, "the server did not ask for replies; the test proves nothing"
        conn.execute("INSERT INTO items VALUES (10, 'still here')")
        got = read_until(repl, po.Decoder(1), lambda m: isinstance(m, po.Insert))
        assert isinstance(got[-1], po.Insert) and got[-1].new == ("10", "still here")


def test_waiting_for_frames_does_not_starve_other_threads(
    db: tuple[str, psycopg.Connection],
) -> None:
    """read() waits on the socket without holding the GIL (the blocking libpq read did)."""
    dsn, _ = db
    slot = _slot()
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    with ReplicationConnection(dsn, status_interval_s=3600) as repl:
        created = repl.create_slot(slot, export_snapshot=False)
        repl.start(slot, "pub", created.consistent_point)
        worker = threading.Thread(target=spin)
        worker.start()
        try:
            started = time.monotonic()
            while time.monotonic() - started < 2.0:
                frame = repl.read(0.5)
                # Nothing is written to this database: at most keepalives arrive.
                assert frame is None or isinstance(frame, Keepalive)
            waited = time.monotonic() - started
        finally:
            stop.set()
            worker.join()
    assert waited >= 2.0
    # A starved thread would tick a handful of times; a free one hundreds (1 ms sleeps).
    assert ticks > 200, f"the other thread ran only {ticks} times in {waited:.1f}s"


def test_silent_client_is_dropped_control(db: tuple[str, psycopg.Connection]) -> None:
    """Without replies the same server ends the session: the previous test is meaningful."""
    dsn, _ = db
    slot = _slot()
    repl = _Silent(_short_timeout(dsn), status_interval_s=3600)
    try:
        created = repl.create_slot(slot, export_snapshot=False)
        repl.start(slot, "pub", created.consistent_point)
        deadline = time.monotonic() + 30
        with pytest.raises(ConnectionFailed):
            while time.monotonic() < deadline:
                repl.read(0.5)
    finally:
        repl.close()


def test_streaming_protocol_2(db: tuple[str, psycopg.Connection]) -> None:
    """A transaction bigger than logical_decoding_work_mem arrives in Stream chunks."""
    dsn, conn = db
    slot = _slot()
    small_mem = make_conninfo(dsn, options="-c logical_decoding_work_mem=64kB")
    with ReplicationConnection(small_mem) as repl:
        created = repl.create_slot(slot, export_snapshot=False)
        with conn.transaction():
            row = conn.execute("SELECT pg_current_xact_id()::xid::text").fetchone()
            assert row is not None
            xid = int(row[0])
            conn.execute(
                "INSERT INTO items SELECT g, repeat('x', 500) FROM generate_series(100, 499) g"
            )
        repl.start(slot, "pub", created.consistent_point, proto_version=2, streaming=True)
        # Another transaction of this database may be streamed too, before ours or between
        # its chunks (a CI run got xid 47353's StreamStart first): only ours is judged.
        messages = read_until(
            repl,
            po.Decoder(2),
            lambda m: isinstance(m, po.StreamCommit) and m.xid == xid,
        )
        starts = [m for m in messages if isinstance(m, po.StreamStart) and m.xid == xid]
        inserts = [m for m in messages if isinstance(m, po.Insert)]
        commit = messages[-1]
        assert isinstance(commit, po.StreamCommit)
        assert len(starts) >= 2 and starts[0].first_segment and not starts[1].first_segment
        assert len(inserts) == 400 and {m.xid for m in inserts} == {commit.xid}
        assert [int(str(m.new[0])) for m in inserts] == list(range(100, 500))
        repl.acknowledge(commit.end_lsn)
        wait_until(lambda: confirmed_flush(conn, slot) == commit.end_lsn, timeout=30)


def test_logical_messages_option(db: tuple[str, psycopg.Connection]) -> None:
    dsn, conn = db
    slot = _slot()
    with ReplicationConnection(dsn) as repl:
        created = repl.create_slot(slot, export_snapshot=False)
        lsn = conn.execute("SELECT pg_logical_emit_message(true, 'app', 'hi')::text").fetchone()
        conn.execute("INSERT INTO items VALUES (20, 'after the message')")  # flushes the WAL
        repl.start(slot, "pub", created.consistent_point, messages=True)
        got = read_until(repl, po.Decoder(1), lambda m: isinstance(m, po.LogicalMessage))
        message = got[-1]
        assert isinstance(message, po.LogicalMessage) and lsn
        assert (message.prefix, message.content, message.lsn) == ("app", b"hi", Lsn.parse(lsn[0]))


# ------------------------------------------------------------------------------ errors


def test_missing_slot_is_a_slot_error(db: tuple[str, psycopg.Connection]) -> None:
    dsn, _ = db
    with ReplicationConnection(dsn) as repl, pytest.raises(SlotError, match="does not exist"):
        repl.start("no_such_slot", "pub", Lsn(0))


def test_slot_in_use_is_a_slot_error(db: tuple[str, psycopg.Connection]) -> None:
    dsn, _ = db
    slot = _slot()
    with ReplicationConnection(dsn) as first, ReplicationConnection(dsn) as second:
        created = first.create_slot(slot, export_snapshot=False)
        first.start(slot, "pub", created.consistent_point)
        with pytest.raises(SlotError, match="active for PID") as err:
            second.start(slot, "pub", created.consistent_point)
        assert not err.value.retryable


def test_duplicate_slot_is_a_slot_error(db: tuple[str, psycopg.Connection]) -> None:
    dsn, _ = db
    slot = _slot()
    with ReplicationConnection(dsn) as repl:
        repl.create_slot(slot, export_snapshot=False)
        with pytest.raises(SlotError, match="already exists"):
            repl.create_slot(slot, export_snapshot=False)
        repl.drop_slot(slot)
        with pytest.raises(SlotError, match="does not exist"):
            repl.drop_slot(slot)


def test_missing_publication_is_a_slot_error(db: tuple[str, psycopg.Connection]) -> None:
    dsn, conn = db
    slot = _slot()
    with ReplicationConnection(dsn) as repl:
        created = repl.create_slot(slot, export_snapshot=False)
        conn.execute("INSERT INTO items VALUES (30, 'x')")
        repl.start(slot, "no_such_pub", created.consistent_point)
        # The walsender only looks the publication up when it decodes a change.
        deadline = time.monotonic() + 30
        with pytest.raises(SlotError, match="no_such_pub"):
            while time.monotonic() < deadline:
                repl.read(0.5)


def test_unreachable_server_is_retryable() -> None:
    with pytest.raises(ConnectionFailed) as err:
        ReplicationConnection("postgresql://cdc:cdc@127.0.0.1:1/cdc", connect_timeout_s=3)
    assert err.value.retryable
    assert "127.0.0.1:1/cdc" in str(err.value) and "cdc:cdc" not in str(err.value)


def test_malformed_dsn_is_a_config_error_without_the_password() -> None:
    with pytest.raises(ConfigError, match="invalid PostgreSQL DSN") as err:
        ReplicationConnection("host=127.0.0.1 password=s3cret nonsense_option=1")
    assert "s3cret" not in str(err.value)


def test_unsupported_protocol_version_is_a_config_error(
    db: tuple[str, psycopg.Connection],
) -> None:
    dsn, _ = db
    slot = _slot()
    with ReplicationConnection(dsn) as repl:
        created = repl.create_slot(slot, export_snapshot=False)
        with pytest.raises(ConfigError, match="proto"):
            repl.start(slot, "pub", created.consistent_point, proto_version=99)


def test_missing_database_fails_fast(db: tuple[str, psycopg.Connection]) -> None:
    dsn, _ = db
    base, _, _ = dsn.rpartition("/")
    with pytest.raises(ConfigError, match="does not exist") as err:
        ReplicationConnection(f"{base}/no_such_db_{uuid.uuid4().hex[:6]}")
    assert not err.value.retryable


def test_bad_names_are_rejected_before_the_server(db: tuple[str, psycopg.Connection]) -> None:
    dsn, _ = db
    with ReplicationConnection(dsn) as repl:
        with pytest.raises(ConfigError, match="slot name"):
            repl.create_slot("Bad-Name; DROP", export_snapshot=False)
        with pytest.raises(ConfigError, match="publication name"):
            repl.start("fine", "p'ub", Lsn(0))
