"""Reading from a standby (PostgreSQL 16+): the slot lives on the standby, the primary only
writes.

A primary and a streaming standby (``hot_standby_feedback = on`` and a physical slot, so the
primary keeps the catalog rows the standby's decoding needs). The publication is made on the
primary (a standby cannot write one) and the reader, pointed at the standby with
``publication_autocreate_mode = disabled``, snapshots inside the slot's exported snapshot on
the standby and streams what the standby replays. Its records equal the primary's table.
An incremental snapshot asked for with ``cdc snapshot`` (its signal written on the primary,
replayed by the standby) is refused with one line (its watermarks would have to be written
into the standby's WAL), and the reader goes on.

Runs on the session's major when it is 16+, else on the newest.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from pgcdc.stack.pgserver import PgServer
from tests.conftest import Endpoints, unique, wait_until
from tests.integration.reader_support import (
    ReaderEnv,
    assert_topic_equals_table,
    read_topic,
    slot_row,
)
from tests.pg_majors import feature_major, server, standby_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def standby_major() -> int:
    return feature_major(16, "logical decoding on a standby")


@pytest.fixture
def pair() -> Iterator[tuple[PgServer, PgServer]]:
    with (
        server(standby_major(), name="primary") as primary,
        standby_of(primary, slot="standby1", settings={"hot_standby_feedback": "on"}) as sb,
    ):
        yield primary, sb


def _replayed(primary: PgServer, standby: PgServer) -> bool:
    """Whether the standby replayed everything the primary wrote so far."""
    lsn = primary.query("SELECT pg_current_wal_lsn()")
    return standby.query(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn") == "t"


def test_the_reader_streams_from_a_standby(
    endpoints: Endpoints, pair: tuple[PgServer, PgServer], topic_prefix: str
) -> None:
    primary, standby = pair
    with psycopg.connect(primary.dsn("cdc"), autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 500) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE items")
    wait_until(lambda: _replayed(primary, standby), timeout=60, what="the standby to replay")
    reader = ReaderEnv(
        standby.dsn("cdc"),
        endpoints.kafka_bootstrap,
        topic_prefix,
        unique("slot"),
        extra={
            "CDC_POSTGRES__PUBLICATION_NAME": "pub",
            "CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE": "disabled",
            # The throwaway servers' password (cdc) is too short to derive a signal key.
            "CDC_POSTGRES__SIGNAL_SECRET": "a-signal-key-of-the-standby-test",
        },
    )
    # A slot on a standby waits for the primary's next record of running transactions (the
    # primary writes one every 15 s when busy); asking for it keeps the test short.
    done = threading.Event()

    def nudge() -> None:
        while not done.wait(0.5):
            primary.query("SELECT pg_log_standby_snapshot()")

    nudger = threading.Thread(target=nudge, daemon=True)
    nudger.start()
    try:
        first = reader.catch_up()
    finally:
        done.set()
        nudger.join(10)
    assert slot_row(standby.dsn("cdc"), reader.slot) is not None, "no slot on the standby"
    assert slot_row(primary.dsn("cdc"), reader.slot) is None, "the slot is on the primary"
    with psycopg.connect(primary.dsn("cdc"), autocommit=True) as conn:
        conn.execute("UPDATE items SET v = v || '!' WHERE id % 7 = 0")
        conn.execute("DELETE FROM items WHERE id % 11 = 0")
        conn.execute("UPDATE items SET id = id + 1000 WHERE id % 13 = 0")
        conn.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(501, 600) g")
    # `cdc snapshot` against the primary writes its signal into the WAL, which the standby
    # replays: the reader refuses it (the chunks' watermarks would go into the standby's WAL).
    signal = reader.run("snapshot", "public.items", CDC_POSTGRES__DSN=primary.dsn("cdc"))
    assert signal.returncode == 0, signal.stderr[-2000:]
    wait_until(lambda: _replayed(primary, standby), timeout=60, what="the standby to replay")
    second = reader.catch_up()
    assert "refused: the reader reads from a standby" in second.stderr, second.stderr[-3000:]
    records = read_topic(endpoints.kafka_bootstrap, f"{topic_prefix}.public.items")
    ops = {r.payload["op"] for r in records if r.payload is not None}
    assert {"r", "c", "u", "d"} <= ops, ops
    assert sum(1 for r in records if r.payload and r.payload["op"] == "r") == 500
    assert_topic_equals_table(records, primary.dsn("cdc"))
    assert "Traceback" not in first.stderr + second.stderr
