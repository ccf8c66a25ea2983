"""The reader's way out of what cannot go on: records Kafka refuses, lost slots, retained WAL,
and DSNs with secrets (never printed, whatever fails).

Every stop is one line naming what is wrong and the way past it; nothing after it is
acknowledged, and the slot is never dropped unasked.
"""

from __future__ import annotations

import random
import string
import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import orjson
import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from pgcdc.core.contract import table_topic
from pgcdc.core.lsn import Lsn
from tests.conftest import Endpoints, unique, wait_until
from tests.integration.reader_support import ReaderEnv, read_topic, slot_row
from tests.integration.real_databases.oracle import leaks
from tests.integration.real_databases.throwaway import throwaway_server

pytestmark = pytest.mark.integration


def _reader(endpoints: Endpoints, dsn: str, prefix: str) -> ReaderEnv:
    return ReaderEnv(dsn, endpoints.kafka_bootstrap, prefix, unique("slot"))


def _after_by_id(reader: ReaderEnv, table: str) -> dict[Any, Any]:
    """The latest ``after`` per key id in the table's topic (None once deleted)."""
    out: dict[Any, Any] = {}
    for r in read_topic(reader.bootstrap, table_topic(reader.prefix, "public", table)):
        if r.key is not None:
            p = r.payload
            out[r.key_id] = None if p is None or p["op"] == "d" else p["after"]
    return out


def _error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


# --- records Kafka refuses for good --------------------------------------------------------


def _big_text(n: int) -> str:
    return "".join(random.Random(11).choices(string.ascii_letters, k=n))


@pytest.fixture
def docs(endpoints: Endpoints, pg_database: str, topic_prefix: str) -> ReaderEnv:
    """A captured table ``docs`` whose topic takes records up to 1 MB (Kafka's default)."""
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    topic = f"{topic_prefix}.public.docs"
    config = {"cleanup.policy": "compact", "max.message.bytes": "1000000"}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(timeout=30)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, body text)")
        conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO docs VALUES (1, 'before')")
    reader = _reader(endpoints, pg_database, topic_prefix)
    reader.extra = {"CDC_KAFKA__DEAD_LETTER_TOPIC": f"{topic_prefix}.dlq"}
    reader.catch_up()
    return reader


def _insert(dsn: str, *rows: tuple[int, str]) -> Lsn:
    """Insert rows, one transaction each; the WAL position before the first."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        for row in rows:
            conn.execute("INSERT INTO docs VALUES (%s, %s)", row)
    assert before is not None
    return Lsn.parse(before[0])


def test_a_record_too_large_for_its_topic_stops_the_reader_with_one_line(docs: ReaderEnv) -> None:
    before_big = _insert(docs.dsn, (2, _big_text(3_000_000)), (3, "after"))
    for _ in range(2):  # a restart meets the same record: nothing after it was acknowledged
        done = docs.run("run", "--until", "current")
        assert done.returncode == 1, done.stderr[-2000:]
        (line,) = _error_lines(done)
        assert done.stderr.rstrip().endswith(line)
        for part in (
            "public.docs",
            '{"id":2}',
            "Message size too large",
            "kafka.unproducible_records=dead_letter",
            "CDC_KAFKA__UNPRODUCIBLE_RECORDS",
        ):
            assert part in line, line
        row = slot_row(docs.dsn, docs.slot)
        assert row is not None and row[1] is not None and row[1] <= before_big.value


def test_dead_letter_mode_writes_the_letter_and_goes_on(docs: ReaderEnv) -> None:
    before_big = _insert(docs.dsn, (2, _big_text(3_000_000)), (3, "after"))
    docs.catch_up(CDC_KAFKA__UNPRODUCIBLE_RECORDS="dead_letter")
    (letter,) = read_topic_values(docs.bootstrap, f"{docs.prefix}.dlq")
    assert letter["job"] == "cdc-reader"
    assert "Message size too large" in letter["reason"]
    assert (letter["table"], letter["key"]) == ("public.docs", '{"id":2}')
    assert letter["topic"] == f"{docs.prefix}.public.docs"
    assert letter["commit_lsn"] > before_big.value and letter["value_bytes"] > 3_000_000
    _insert(docs.dsn, (4, "later"))
    docs.catch_up(CDC_KAFKA__UNPRODUCIBLE_RECORDS="dead_letter")
    got = _after_by_id(docs, "docs")
    assert {k: v["body"] for k, v in got.items()} == {1: "before", 3: "after", 4: "later"}
    row = slot_row(docs.dsn, docs.slot)
    assert row is not None and row[1] is not None and row[1] > before_big.value


def read_topic_values(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    from cdc.kafka_clients import read_topic as read_all

    return [orjson.loads(m.value() or b"null") for m in read_all(bootstrap, topic, "tests-dlq", 60)]


# --- slot health ---------------------------------------------------------------------------


def test_a_lost_slot_stops_with_the_way_out_and_when_needed_recovers(
    endpoints: Endpoints, topic_prefix: str
) -> None:
    conf = {"max_slot_wal_keep_size": "'32MB'", "wal_keep_size": "0", "max_wal_size": "'64MB'"}
    with throwaway_server(conf=conf) as server:
        dsn = server.create_database("lost")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
            conn.execute("INSERT INTO t VALUES (1)")
        reader = _reader(endpoints, dsn, topic_prefix)
        reader.catch_up()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(2, 8):  # six WAL segments past the slot, then a checkpoint
                conn.execute("INSERT INTO t VALUES (%s)", (i,))
                conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT wal_status = 'lost' FROM pg_replication_slots WHERE slot_name = %s",
                        (reader.slot,),
                    ).fetchone()
                    == (True,)
                ),
                timeout=30,
                what="the slot to be lost",
            )
        done = reader.run("run", "--until", "current")
        assert done.returncode == 1, done.stderr[-2000:]
        (line,) = _error_lines(done)
        for part in (reader.slot, "wal_status = lost", "when_needed", "cdc reset-state"):
            assert part in line, line
        assert slot_row(dsn, reader.slot) is not None  # never dropped unasked
        status = reader.run("status", "--json")
        assert status.returncode == 3, status.stderr  # unhealthy: the slot is lost
        assert orjson.loads(status.stdout)["slot"]["wal_status"] == "lost"
        assert any("lost" in p for p in orjson.loads(status.stdout)["problems"])
        assert any("lost" in w for w in status.stderr.splitlines() if w.startswith("warning:"))
        reader.catch_up(CDC_POSTGRES__SNAPSHOT_MODE="when_needed")
        assert set(_after_by_id(reader, "t")) == set(range(1, 8))
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (reader.slot,)
            ).fetchone()
        assert row is not None and row[0] != "lost"


def test_status_warns_when_the_slot_retains_more_wal_than_allowed(
    endpoints: Endpoints, pg_database: str, topic_prefix: str
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    reader = _reader(endpoints, pg_database, topic_prefix)
    reader.catch_up()
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
    quiet = reader.run("status", "--json")
    assert quiet.returncode == 0 and "warning:" not in quiet.stderr
    loud = reader.run("status", "--json", CDC_POSTGRES__RETAINED_WAL_WARN_BYTES="1")
    # Inactive (no reader running) and over the threshold: unhealthy.
    assert loud.returncode == 3, loud.stderr
    slot = orjson.loads(loud.stdout)["slot"]
    assert slot["retained_wal_bytes"] > 1
    (warning,) = [w for w in loud.stderr.splitlines() if w.startswith("warning:")]
    assert "retains" in warning and "postgres.retained_wal_warn_bytes" in warning


# --- secrets -------------------------------------------------------------------------------

# Percent signs (one not followed by hex: a URL holding it raw cannot be parsed), both quotes,
# a backslash and spaces.
PASSWORD = "s3%zz cr'et \"pa\\ss w0rd%41"


def _kv(**params: str) -> str:
    """A key=value DSN, every value quoted and escaped as libpq reads it."""
    return " ".join(
        f"{k}='" + v.replace("\\", "\\\\").replace("'", "\\'") + "'" for k, v in params.items()
    )


@pytest.fixture
def secret_role(endpoints: Endpoints) -> Iterator[dict[str, str]]:
    """A role whose password is :data:`PASSWORD`, owning a database with a table ``s``."""
    role, db = unique("role"), unique("secrets")
    stack = conninfo_to_dict(endpoints.postgres_dsn)
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(PASSWORD)
            )
        )
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(db), sql.Identifier(role))
        )
    params = {
        "host": str(stack.get("host", "127.0.0.1")),
        "port": str(stack.get("port", 5432)),
        "user": role,
        "dbname": db,
    }
    try:
        yield params
    finally:
        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s AND NOT active",
                (db,),
            )
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db))
            )
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_no_output_ever_shows_the_password(
    endpoints: Endpoints, topic_prefix: str, secret_role: dict[str, str]
) -> None:
    p = secret_role
    url = (
        f"postgresql://{quote(p['user'], safe='')}:{quote(PASSWORD, safe='')}"
        f"@{p['host']}:{p['port']}/{p['dbname']}"
    )
    kv = _kv(password=PASSWORD, **p)
    with psycopg.connect(kv, autocommit=True) as conn:  # both forms reach the server
        conn.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO s VALUES (1, 'one')")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO s VALUES (2, 'two')")
    reader = _reader(endpoints, url, topic_prefix)
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}

    def run(name: str, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
        done = reader.run(*args, CDC_POSTGRES__DSN=dsn, CDC_POSTGRES__TABLES="public.s")
        outputs[name] = done
        return done

    # Working DSNs, both forms: a run (with every debug line) and the status.
    assert run("run url", url, "run", "--until", "current", "--debug").returncode == 0
    assert run("status url", url, "status").returncode == 0
    assert run("status key=value", kv, "status").returncode == 0
    assert run("run key=value", kv, "run", "--until", "current").returncode == 0
    assert set(_after_by_id(reader, "s")) == {1, 2}
    # Wrong DSNs (the right password, something else wrong) and DSNs that do not parse.
    wrong_port = url.replace(f":{p['port']}/", ":1/")
    failing = {
        "wrong port (url)": wrong_port,
        "wrong database (key=value)": _kv(password=PASSWORD, **{**p, "dbname": "nope"}),
        "wrong option (key=value)": _kv(password=PASSWORD, sslmode="sometimes", **p),
        "unparseable url": f"postgresql://{p['user']}:{PASSWORD}@{p['host']}:{p['port']}/x",
        "unparseable key=value": f"host={p['host']} password='{PASSWORD}",
        "unparseable unquoted key=value": f"host={p['host']} password={PASSWORD}",
    }
    for name, dsn in failing.items():
        for debug in ((), ("--debug",)):
            done = run(f"{name} run {debug}", dsn, "run", "--until", "current", *debug)
            assert done.returncode != 0, name
            assert _error_lines(done), f"{name}: no error line in {done.stderr[-1000:]}"
        assert run(f"{name} status", dsn, "status").returncode != 0
    unparseable = _error_lines(outputs["unparseable url run ()"])
    assert "invalid PostgreSQL DSN" in unparseable[0], unparseable
    found = {
        name: leaks(done.stdout + done.stderr, PASSWORD)
        for name, done in outputs.items()
        if leaks(done.stdout + done.stderr, PASSWORD)
    }
    assert not found, f"the password shows in: {found}"
