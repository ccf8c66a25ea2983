"""Generated columns on every major: published and carried from PostgreSQL 18, left out
(consistently, snapshot and stream alike) before it, and the way past that before 18.

Runs against the session's server: the stack's (15), or the major ``CDC_TEST_POSTGRES``
chooses (the default CI run repeats this module on 18).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.conftest import Endpoints, unique
from tests.integration.reader_support import ReaderEnv, Record, read_topic, reduce_latest
from tests.pg_majors import major_of_dsn

pytestmark = pytest.mark.integration


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


def _fields(record: Record) -> list[str]:
    value = record.value
    assert value is not None
    import orjson

    schema = orjson.loads(value)["schema"]
    after = next(f for f in schema["fields"] if f["field"] == "after")
    return [f["field"] for f in after["fields"]]


def _write(dsn: str) -> None:
    """Rows before the slot (snapshot) and changes after it (stream), a key change too."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO t (id, a) VALUES (3, 30), (4, 40)")
        conn.execute("UPDATE t SET a = 11 WHERE id = 1")
        conn.execute("UPDATE t SET id = 5 WHERE id = 2")  # the key changes, b stays
        conn.execute("DELETE FROM t WHERE id = 4")


def _rows(dsn: str, columns: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(f"SELECT {columns} FROM t ORDER BY id")
        names = [d.name for d in cur.description or ()]
        return {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}


def test_stored_generated_columns_are_carried_from_18(reader: ReaderEnv) -> None:
    major = major_of_dsn(reader.dsn)
    virtual = ", c int GENERATED ALWAYS AS (a + 1) VIRTUAL" if major >= 18 else ""
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE t (id int PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a * 2) "
            f"STORED{virtual})"
        )
        conn.execute("INSERT INTO t (id, a) VALUES (1, 10), (2, 20)")
    first = reader.catch_up()  # the slot and the snapshot
    _write(reader.dsn)
    reader.catch_up()
    records = read_topic(reader.bootstrap, f"{reader.prefix}.public.t")
    ops = {r.payload["op"] for r in records if r.payload is not None}
    assert {"r", "c", "u", "d"} <= ops, ops
    if major >= 18:
        # Snapshot and stream alike: every image holds b, computed by PostgreSQL; the
        # virtual column is never in the WAL, so never in a record.
        assert all(_fields(r) == ["id", "a", "b"] for r in records if r.value is not None)
        assert reduce_latest(records) == {
            **dict.fromkeys((2, 4)),
            **_rows(reader.dsn, "id, a, b"),
        }
        assert "not published" not in first.stderr
    else:
        # Before 18 pgoutput never sends b: the snapshot leaves it out too, so the records
        # agree with each other, and the reader names what is left out.
        assert all(_fields(r) == ["id", "a"] for r in records if r.value is not None)
        assert reduce_latest(records) == {**dict.fromkeys((2, 4)), **_rows(reader.dsn, "id, a")}
        assert "public.t.b are not published" in first.stderr, first.stderr[-2000:]


def test_before_18_a_trigger_kept_column_is_carried(reader: ReaderEnv) -> None:
    """docs/own-postgres.md's way before 18: a plain column kept by a trigger."""
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int, b int)")
        conn.execute(
            "CREATE FUNCTION t_b() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN NEW.b := NEW.a * 2; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER t_b BEFORE INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION t_b()"
        )
        conn.execute("INSERT INTO t (id, a) VALUES (1, 10), (2, 20)")
    reader.catch_up()
    _write(reader.dsn)
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("UPDATE t SET b = 0 WHERE id = 3")  # overruled, as for a generated column
    reader.catch_up()
    records = read_topic(reader.bootstrap, f"{reader.prefix}.public.t")
    leader = _rows(reader.dsn, "id, a, b")
    assert all(row["b"] == row["a"] * 2 for row in leader.values()), leader
    assert reduce_latest(records) == {**dict.fromkeys((2, 4)), **leader}
