"""Bad input mid-stream: DDL, types we do not know, rows larger than Kafka's default limit.

None of these may lose a change: either the event arrives whole, or the reader stops with one
clear error line and does not acknowledge past it.
"""

from __future__ import annotations

import random
import string

import psycopg
import pytest

from tests.conftest import Endpoints, unique
from tests.integration.reader_support import ReaderEnv, read_topic

pytestmark = pytest.mark.integration


@pytest.fixture
def reader(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    return ReaderEnv(pg_database, endpoints.kafka_bootstrap, topic_prefix, unique("slot"))


def _after(record: object) -> dict[str, object]:
    payload = record.payload  # type: ignore[attr-defined]
    assert payload is not None
    return payload["after"]  # type: ignore[no-any-return]


def test_ddl_mid_stream_changes_the_events_columns(reader: ReaderEnv) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a text)")
        conn.execute("INSERT INTO t VALUES (1, 'before')")
    reader.catch_up()
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (2, 'still a')")
        conn.execute("ALTER TABLE t ADD COLUMN b int DEFAULT 7")
        conn.execute("INSERT INTO t VALUES (3, 'with b', 42)")
        conn.execute("ALTER TABLE t DROP COLUMN a")
        conn.execute("INSERT INTO t VALUES (4, 43)")
        conn.execute("ALTER TABLE t ALTER COLUMN b TYPE text")
        conn.execute("INSERT INTO t VALUES (5, 'b is text now')")
    reader.catch_up()
    records = read_topic(reader.bootstrap, f"{reader.prefix}.public.t")

    # Each change carries the columns of its time…
    def resnapshot(r: object) -> bool:
        p = r.payload  # type: ignore[attr-defined]
        return bool(p["op"] == "r" and p["source"]["snapshot"] == "incremental")

    after = {r.key_id: _after(r) for r in records if r.value is not None and not resnapshot(r)}
    assert after[1] == {"id": 1, "a": "before"}
    assert after[2] == {"id": 2, "a": "still a"}
    assert after[3] == {"id": 3, "a": "with b", "b": 42}
    assert after[4] == {"id": 4, "b": 43}
    assert after[5] == {"id": 5, "b": "b is text now"}
    # The schema travels with each event: the last one says b is a string.
    last = next(r for r in records if r.key_id == 5)
    import orjson

    schema = orjson.loads(last.value)["schema"]  # type: ignore[arg-type]
    row = next(f for f in schema["fields"] if f["field"] == "after")
    assert {f["field"]: f["type"] for f in row["fields"]} == {"id": "int32", "b": "string"}
    # …and each change of shape published every row again in the new one (issue 38): the
    # newest record of each key is the row as the table holds it now.
    newest = {r.key_id: _after(r) for r in records if r.value is not None}
    assert newest == {
        1: {"id": 1, "b": "7"},
        2: {"id": 2, "b": "7"},
        3: {"id": 3, "b": "42"},
        4: {"id": 4, "b": "43"},
        5: {"id": 5, "b": "b is text now"},
    }


def test_types_we_do_not_know_pass_through_as_text(reader: ReaderEnv) -> None:
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TYPE pair AS (x int, y text)")
        conn.execute(
            "CREATE TABLE odd (id int PRIMARY KEY, p pair, v tsvector, bits bit varying(8))"
        )
    reader.catch_up()
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO odd VALUES (1, ROW(1, 'one'), 'fat cat', B'101')")
        rendered = conn.execute("SELECT p::text, v::text, bits::text FROM odd").fetchone()
    reader.catch_up()
    records = read_topic(reader.bootstrap, f"{reader.prefix}.public.odd")
    (rec,) = [r for r in records if r.value is not None]
    after = _after(rec)
    assert rendered is not None
    # Never dropped: each value arrives as PostgreSQL rendered it.
    assert (after["p"], after["v"]) == rendered[:2]
    assert after["bits"] is not None


def test_a_row_larger_than_kafkas_default_limit_arrives_whole(reader: ReaderEnv) -> None:
    big = "".join(random.Random(7).choices(string.ascii_letters, k=3_000_000))
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, body text)")
        conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
    reader.catch_up()
    with psycopg.connect(reader.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO docs VALUES (1, %s)", (big,))
        conn.execute("INSERT INTO docs VALUES (2, 'small')")
    done = reader.run("run", "--until", "current", timeout=300)
    if done.returncode != 0:
        # Refusing is acceptable only with one clear line and nothing acknowledged past it.
        pytest.fail(f"the reader refused a 3 MB row: {done.stderr.strip().splitlines()[-1:]}")
    records = read_topic(reader.bootstrap, f"{reader.prefix}.public.docs")
    bodies = {r.key_id: _after(r)["body"] for r in records if r.value is not None}
    assert bodies == {1: big, 2: "small"}
