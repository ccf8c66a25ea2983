"""Primary-key updates that leave a TOASTed column unchanged still carry its value."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cdc.catalog import load_table
from cdc.toast import fetch_current
from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER
from pgcdc.core.values import UNCHANGED_TOAST
from tests.conftest import Endpoints, unique
from tests.integration.reader_support import ReaderEnv, Record, read_topic

pytestmark = pytest.mark.integration

# About 9.6 kB of hex: too big to stay inline even compressed, so it is TOASTed out of line.
BIG = "(SELECT string_agg(md5(g::text || %s), '') FROM generate_series(1, 300) g)"


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


def _events(reader: ReaderEnv, table: str) -> list[Record]:
    return read_topic(reader.bootstrap, f"{reader.prefix}.public.{table}")


def _descriptions(dsn: str, table: str) -> dict[int, str]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: r[1] for r in conn.execute(f"SELECT id, description FROM {table}")}


@pytest.mark.parametrize("identity", ["default", "full"])
def test_pk_change_keeps_unchanged_toast_value(reader: ReaderEnv, identity: str) -> None:
    table = f"docs_{identity}"
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, title text, description text)")
        if identity == "full":
            conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    reader.catch_up()  # slot first: the changes below are streamed
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        for i in (1, 2, 3):
            conn.execute(f"INSERT INTO {table} VALUES (%s, 't', {BIG})", (i, str(i)))
        conn.execute(f"UPDATE {table} SET id = 101 WHERE id = 1")  # description unchanged
        conn.execute(f"UPDATE {table} SET id = 102, title = 'u' WHERE id = 2")
        conn.execute(f"UPDATE {table} SET title = 'v' WHERE id = 3")  # a plain update
    expected = _descriptions(reader.dsn, table)
    reader.catch_up()
    events = _events(reader, table)
    creates = {r.key_id: r for r in events if r.payload is not None and r.payload["op"] == "c"}
    for new_id, old_id in ((101, 1), (102, 2)):
        after = creates[new_id].payload["after"]  # type: ignore[index]
        assert after["description"] == expected[new_id], f"row {new_id} lost its description"
        assert len(after["description"]) == 9600
        delete = next(
            r
            for r in events
            if r.payload is not None and r.payload["op"] == "d" and r.key_id == old_id
        )
        # Debezium's key-change headers: each event names the other key, as Kafka
        # Connect's default header converter writes it (schema.header_format=simple).
        new_key = dict(delete.headers)["__debezium.newkey"]
        old_key = dict(creates[new_id].headers)["__debezium.oldkey"]
        assert new_key == f'{{"id":{new_id}}}'.encode()
        assert old_key == f'{{"id":{old_id}}}'.encode()
    update = next(r for r in events if r.payload is not None and r.payload["op"] == "u")
    # FULL: filled from the complete old row. Default identity: read by key, so the event
    # holds the whole row and a compacted topic alone can rebuild a follower.
    assert update.payload["after"]["description"] == expected[3]  # type: ignore[index]


def test_debezium_placeholder_when_completion_is_off(reader: ReaderEnv) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, description text)")
    off = {"CDC_POSTGRES__COMPLETE_UNCHANGED_TOAST": "false"}
    reader.catch_up(**off)
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO docs VALUES (1, 't', {BIG})", ("1",))
        conn.execute("UPDATE docs SET title = 'v' WHERE id = 1")
    reader.catch_up(**off)
    update = next(
        r for r in _events(reader, "docs") if r.payload is not None and r.payload["op"] == "u"
    )
    # Debezium's unavailable.value.placeholder: a follower keeps the value it holds.
    assert update.payload["after"]["description"] == UNAVAILABLE_VALUE_PLACEHOLDER  # type: ignore[index]


def test_pk_change_of_a_row_deleted_since_keeps_the_marker(reader: ReaderEnv) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, description text)")
    reader.catch_up()
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO docs VALUES (1, 't', {BIG})", ("1",))
        conn.execute("UPDATE docs SET id = 101 WHERE id = 1")
        conn.execute("DELETE FROM docs WHERE id = 101")
    reader.catch_up()
    events = _events(reader, "docs")
    ops = [(r.payload["op"] if r.payload else None, r.key_id) for r in events]
    assert ops == [("c", 1), ("d", 1), (None, 1), ("c", 101), ("d", 101), (None, 101)]
    create = events[3].payload
    assert create is not None
    # The row is gone when the reader looks: the marker stays, and the delete follows.
    assert create["after"]["description"] == UNAVAILABLE_VALUE_PLACEHOLDER


class _CommitsAfterFirstRead:
    """The reader's connection, with the writer's transaction committed right after the
    reader's first read of the row: the race of a commit that the walsender sent a moment
    before it was visible, and that became visible before the reader looked again."""

    def __init__(self, conn: psycopg.Connection[Any], writer: psycopg.Connection[Any]) -> None:
        self.conn, self.writer = conn, writer
        self.first_read: Any = "not read"

    def execute(self, query: Any, params: Any = None) -> Any:
        cur = self.conn.execute(query, params)
        if self.first_read == "not read" and "description" in str(query.as_string(self.conn)):
            self.first_read = cur.fetchone()
            self.writer.commit()
            return _Fetched(self.first_read)
        return cur


class _Fetched:
    def __init__(self, row: Any) -> None:
        self.row = row

    def fetchone(self) -> Any:
        return self.row


def test_a_row_that_becomes_visible_between_two_looks_is_read(pg_database: str) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, description text)")
        table = load_table(conn, "docs")
    with (
        psycopg.connect(pg_database) as writer,
        psycopg.connect(pg_database, autocommit=True) as reader_conn,
    ):
        writer.execute(f"INSERT INTO docs VALUES (101, 't', {BIG})", ("1",))
        xid_row = writer.execute("SELECT xid(pg_current_xact_id())::text").fetchone()
        assert xid_row is not None
        conn_seen = _CommitsAfterFirstRead(reader_conn, writer)
        row = ("101", "t", UNCHANGED_TOAST)
        filled = fetch_current(conn_seen, table, row, [2], int(xid_row[0]))  # type: ignore[arg-type]
        assert conn_seen.first_read is None  # the path under test: the first read missed
        assert filled[2] == _descriptions(pg_database, "docs")[101]
