"""The reader on databases that are not the demo's: hostile session settings, records Kafka
refuses, lost slots, secrets in DSNs, arrays of box, LATIN1 databases, WAL positions beyond
2**47, and a long stream of Relation messages.

PostgreSQL is the oracle: expected values are what it renders (or computes) in a session with
its default output settings.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from psycopg import sql

from pgcdc.core.contract import table_topic
from pgcdc.core.lsn import Lsn
from tests.conftest import Endpoints, unique, wait_until
from tests.integration.reader_support import ReaderEnv, end_offset, read_topic, slot_row
from tests.integration.real_databases.oracle import (
    canonical_after,
    decimal_of,
    default_session,
    micros_of_zoned,
)
from tests.integration.real_databases.throwaway import (
    LSN_BEYOND_2_47,
    LSN_NEAR_2_63,
    ThrowawayServer,
    throwaway_server,
)

pytestmark = pytest.mark.integration


def _reader(endpoints: Endpoints, dsn: str, prefix: str) -> ReaderEnv:
    return ReaderEnv(dsn, endpoints.kafka_bootstrap, prefix, unique("slot"))


def _after_by_id(reader: ReaderEnv, table: str, schema: str = "public") -> dict[Any, Any]:
    """The latest ``after`` per key id in the table's topic (None once deleted)."""
    out: dict[Any, Any] = {}
    for r in read_topic(reader.bootstrap, table_topic(reader.prefix, schema, table)):
        if r.key is not None:
            p = r.payload
            out[r.key_id] = None if p is None or p["op"] == "d" else p["after"]
    return out


def _error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


# --- WAL positions beyond 2**47 (the throwaway server's smoke test) ------------------------


@pytest.mark.parametrize("wal_start", [LSN_BEYOND_2_47, LSN_NEAR_2_63], ids=["2^47", "2^63-1GiB"])
def test_a_server_far_along_its_wal_streams_exact_commit_lsns(
    endpoints: Endpoints, topic_prefix: str, wal_start: Lsn
) -> None:
    with throwaway_server(wal_start=wal_start) as server:
        dsn = server.create_database("far")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        reader = _reader(endpoints, dsn, topic_prefix)
        reader.catch_up()
        # A second slot of PostgreSQL's own says where the transaction commits.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_create_logical_replication_slot('oracle', 'pgoutput')"
            ).fetchone()
            conn.execute("INSERT INTO t VALUES (1, 'far along')")
            frames = conn.execute(
                "SELECT data FROM pg_logical_slot_peek_binary_changes('oracle', NULL, NULL, "
                "'proto_version', '1', 'publication_names', %s)",
                (reader.slot,),
            ).fetchall()
            conn.execute("SELECT pg_drop_replication_slot('oracle')")
        begin = next(bytes(f) for (f,) in frames if bytes(f)[:1] == b"B")
        commit_lsn = int.from_bytes(begin[1:9], "big")  # Begin: final LSN of the transaction
        assert commit_lsn >= wal_start.value
        reader.catch_up()
        (rec,) = [r for r in read_topic(reader.bootstrap, f"{topic_prefix}.public.t") if r.value]
        assert rec.commit_lsn == commit_lsn
        payload = rec.payload
        assert payload is not None and payload["after"] == {"id": 1, "v": "far along"}
        assert payload["source"]["lsn"] >= wal_start.value
        row = slot_row(dsn, reader.slot)
        assert row is not None and row[1] is not None and row[1] > commit_lsn


# --- case 6: the database's own session settings -------------------------------------------


@pytest.fixture(scope="module")
def euro_locale() -> Iterator[Path | None]:
    """A folder holding de_DE.UTF-8 built with localedef (LOCPATH), or None if it cannot be."""
    folder = Path(tempfile.mkdtemp(prefix="cdc-locale-"))
    folder.chmod(0o755)
    # localedef may warn (and exit 1) yet write a usable locale: look at what it wrote.
    # Without localedef, money keeps the C locale's form.
    with contextlib.suppress(FileNotFoundError):
        subprocess.run(
            ["localedef", "-i", "de_DE", "-f", "UTF-8", str(folder / "de_DE.UTF-8")],
            capture_output=True,
            check=False,
        )
    try:
        yield folder if (folder / "de_DE.UTF-8" / "LC_MONETARY").exists() else None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def locale_server(euro_locale: Path | None) -> Iterator[ThrowawayServer]:
    env = {"LOCPATH": str(euro_locale)} if euro_locale else {}
    with throwaway_server(env=env) as server:
        yield server


SETTINGS_TABLE = """
CREATE TABLE s (
  id int PRIMARY KEY, m money, d date, ts timestamp, tstz timestamptz, t time, ttz timetz,
  iv interval, f4 real, f8 double precision, n numeric, ds date[], tss timestamptz[],
  ivs interval[], ms money[]
)"""
SETTINGS_ROWS = [
    "(%s, 1234.56, '2024-02-29', '2024-02-29 13:14:15.123456', '2024-06-30 23:59:59.999999+02',"
    " '13:14:15.5', '13:14:15+05:30', '1 year 2 mons 3 days 04:05:06.789', 0.1, 0.1,"
    " 12345.6789, '{2024-01-31,1999-12-31}', '{\"2001-02-03 04:05:06+07\"}',"
    " '{\"-1 days +02:00\",\"3 mons\"}', '{-0.01,1000000}')",
    "(%s, -92233720368547758.08, '0044-03-15 BC', '1900-01-01 00:00:00',"
    " '0010-01-01 00:00:00+00 BC', '00:00:00', '23:59:59.999999-14:59', '-1 year -2 mons',"
    " 3.4028235e38, 2.718281828459045, -0.000001, '{}', NULL, '{\"-00:00:01.5\"}', NULL)",
    "(%s, 0.01, '10000-01-01', '2000-01-01 00:00:00.000001', '2038-01-19 03:14:08+00',"
    " '24:00:00', '00:00:00+00', '-1 days +23:59:59.999999', 1.17549435e-38, 1e-300,"
    " 98765432109876543210.0123456789, NULL, '{NULL}', NULL, '{}')",
]
# Non-default output settings a database may carry.
HOSTILE = [
    {
        "DateStyle": "SQL, DMY",
        "IntervalStyle": "sql_standard",
        "TimeZone": "Asia/Kathmandu",
        "extra_float_digits": "-3",
    },
    {
        "DateStyle": "German",
        "IntervalStyle": "iso_8601",
        "TimeZone": "America/St_Johns",
        "extra_float_digits": "0",
    },
]


def _fill(dsn: str, first_id: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, row in enumerate(SETTINGS_ROWS):
            conn.execute("INSERT INTO s VALUES " + row, (first_id + i,))


@pytest.mark.parametrize("hostile", HOSTILE, ids=["sql-dmy", "german-iso8601"])
def test_values_stay_exact_under_the_databases_own_session_settings(
    endpoints: Endpoints,
    topic_prefix: str,
    locale_server: ThrowawayServer,
    euro_locale: Path | None,
    hostile: dict[str, str],
) -> None:
    db = unique("settings")
    dsn = locale_server.create_database(db)
    settings = dict(hostile)
    if euro_locale is not None:
        settings["lc_monetary"] = "de_DE.UTF-8"  # money as '1.234,56 €'
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(db), sql.Identifier(name), sql.Literal(value)
                )
            )
        conn.execute(SETTINGS_TABLE)
    with psycopg.connect(dsn, autocommit=True) as conn:  # a new session takes them
        shown = conn.execute("SELECT current_setting('DateStyle')").fetchone()
        assert shown is not None and shown[0].startswith(settings["DateStyle"])
        if euro_locale is not None:
            assert conn.execute("SELECT 1234.56::money::text").fetchone() == ("1.234,56 €",)
    _fill(dsn, 1)  # snapshotted
    reader = _reader(endpoints, dsn, topic_prefix)
    reader.catch_up()
    _fill(dsn, 11)  # streamed
    reader.catch_up()
    got = _after_by_id(reader, "s")
    expected = canonical_after(dsn, "s")
    assert got.keys() == expected.keys() == {1, 2, 3, 11, 12, 13}
    for key, after in expected.items():
        assert got[key] == after, f"row {key}: {got[key]} != {after}"
    # And against values PostgreSQL computes itself.
    with default_session(dsn) as conn:
        facts = conn.execute(
            "SELECT id, m::numeric, d - date '1970-01-01', "
            "(extract(epoch FROM ts) * 1000000)::bigint, "
            "(extract(epoch FROM tstz) * 1000000)::bigint, f8::text FROM s"
        ).fetchall()
    for key, money, days, ts_us, tstz_us, f8 in facts:
        after = got[key]
        assert decimal_of(after["m"], 2) == Decimal(money), key
        if days is not None and abs(days) < 10**7:
            assert after["d"] == days, key
        assert after["ts"] == ts_us, key
        assert micros_of_zoned(after["tstz"]) == tstz_us, key
        assert (after["f8"] == float(f8)) or (f8 == "NaN" and after["f8"] == "NaN"), key


# --- arrays of box, LATIN1 -----------------------------------------------------------------


def test_arrays_of_box_arrive_element_by_element(
    endpoints: Endpoints, pg_database: str, topic_prefix: str
) -> None:
    values = [
        "ARRAY['(1,1),(0,0)'::box, NULL, '(2.5,3),(-1,0)']",
        "ARRAY['(-1.5,2),(-3,-4.25)'::box]",
        "'{}'::box[]",
    ]
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE b (id int PRIMARY KEY, boxes box[])")
        conn.execute(f"INSERT INTO b VALUES (1, {values[0]})")  # snapshotted
    reader = _reader(endpoints, pg_database, topic_prefix)
    reader.catch_up()
    with psycopg.connect(pg_database, autocommit=True) as conn:
        for i, v in enumerate(values[1:], start=2):  # streamed
            conn.execute(f"INSERT INTO b VALUES ({i}, {v})")
        conn.execute(f"UPDATE b SET boxes = {values[0]} || boxes WHERE id = 2")
        # The oracle: each element as PostgreSQL renders it on its own.
        expected: dict[int, list[str | None]] = {1: [], 2: [], 3: []}
        for key, element in conn.execute("SELECT id, unnest(boxes)::text FROM b ORDER BY 1"):
            expected[key].append(element)
    reader.catch_up()
    got = {k: v["boxes"] for k, v in _after_by_id(reader, "b").items()}
    assert got == expected
    assert got[1] == ["(1,1),(0,0)", None, "(2.5,3),(-1,0)"]


def test_a_latin1_database_arrives_as_utf8(endpoints: Endpoints, topic_prefix: str) -> None:
    db = unique("latin1")
    admin_dsn = endpoints.postgres_dsn
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                "TEMPLATE template0"
            ).format(sql.Identifier(db))
        )
    dsn = endpoints.postgres_dsn_for(db)
    texts = ["café", "Größe ½ £ ÿ", "naïve façade"]
    try:
        with psycopg.connect(dsn, autocommit=True, client_encoding="UTF8") as conn:
            conn.execute('CREATE TABLE "café" (id int PRIMARY KEY, "größe" text)')
            conn.execute('INSERT INTO "café" VALUES (1, %s)', (texts[0],))
        reader = _reader(endpoints, dsn, topic_prefix)
        reader.catch_up()
        with psycopg.connect(dsn, autocommit=True, client_encoding="UTF8") as conn:
            conn.execute('INSERT INTO "café" VALUES (2, %s), (3, %s)', texts[1:])
            conn.execute('UPDATE "café" SET "größe" = "größe" || \'!\' WHERE id = 1')
        reader.catch_up()
        got = _after_by_id(reader, "café")
        assert got == {
            1: {"id": 1, "größe": "café!"},
            2: {"id": 2, "größe": texts[1]},
            3: {"id": 3, "größe": texts[2]},
        }
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s AND NOT active",
                (db,),
            )
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(db)))


# --- case 10: a long stream of Relation messages -------------------------------------------


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


@pytest.mark.slow
def test_rss_stays_flat_over_thousands_of_relation_messages(
    endpoints: Endpoints, pg_database: str, topic_prefix: str, tmp_path: Path
) -> None:
    # 3,000 after the warm-up: the leak this guards (~42 KiB a message) would grow the RSS by
    # ~120 MiB, six times the bound (10,000 before: the same proof at two and a half the time).
    relations, warmup = 4_000, 1_000
    cols = ", ".join(f"c{i} text" for i in range(18))
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE wide (id int PRIMARY KEY, v varchar(10), {cols})")
        conn.execute("INSERT INTO wide (id, v) VALUES (1, 'a')")
    reader = _reader(endpoints, pg_database, topic_prefix)
    reader.catch_up()
    topic = f"{topic_prefix}.public.wide"
    base = end_offset(reader.bootstrap, topic)
    proc = reader.start(log_path=tmp_path / "reader.log")

    def ddl_then_change(start: int, stop: int) -> None:
        # Each ALTER makes pgoutput send a new Relation message before the next change;
        # the column's length changes every time, so every description differs.
        with psycopg.connect(pg_database, autocommit=True) as conn:
            for i in range(start, stop):
                with conn.transaction():
                    conn.execute(f"ALTER TABLE wide ALTER COLUMN v TYPE varchar({10 + i % 90})")
                    conn.execute("UPDATE wide SET c0 = %s WHERE id = 1", (str(i),))

    def processed(n: int) -> bool:
        assert proc.poll() is None, (tmp_path / "reader.log").read_text()[-3000:]
        return end_offset(reader.bootstrap, topic) >= base + n

    try:
        ddl_then_change(0, warmup)
        wait_until(lambda: processed(warmup), timeout=120, what="the warm-up changes")
        after_warmup = _rss(proc.pid)
        ddl_then_change(warmup, relations)
        wait_until(lambda: processed(relations), timeout=240, what="every change")
        at_end = _rss(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    mib = 2**20
    print(f"reader RSS {after_warmup / mib:.0f} MiB after {warmup}, {at_end / mib:.0f} at end")
    # Before: ~42 KiB per Relation message of a 20-column table, i.e. ~120 MiB here.
    assert at_end - after_warmup < 20 * mib, f"RSS grew {(at_end - after_warmup) / mib:.0f} MiB"
    assert proc.returncode == 0, (tmp_path / "reader.log").read_text()[-3000:]
