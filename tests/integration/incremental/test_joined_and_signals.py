"""Tables that join the captured set, and signals written while the reader is down
(issue 11, cases 1 and 4)."""

from __future__ import annotations

from pathlib import Path

import orjson
import psycopg
import pytest
from confluent_kafka import Producer
from pydantic import SecretStr

from cdc.incremental.auth import sign, signal_key
from pgcdc.core.settings import PostgresSettings
from tests.conftest import Endpoints
from tests.integration.incremental.support import (
    Reader,
    assert_chunk_rows_not_stale,
    cdc,
    cdc_fails,
    chunks_done,
    pipeline,
    topic,
)
from tests.integration.reader_support import (
    Workload,
    assert_key_order,
    assert_no_change_missing,
    assert_topic_equals_table,
)

pytestmark = pytest.mark.integration


def _incremental_rows(records: list) -> int:  # type: ignore[type-arg]
    return sum(
        1
        for r in records
        if r.payload is not None
        and r.payload["op"] == "r"
        and r.payload["source"]["snapshot"] == "incremental"
    )


def test_a_table_added_while_streaming_and_one_added_between_runs(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "incr_join") as p:
        Workload(p.dsn, "public.first").setup(10)
        later = Workload(p.dsn, "public.later")
        later.setup(3_000)
        wl = Workload(p.dsn, "public.orders", writers=2, ops_per_txn=3, seed=3, pause_s=0.003)
        wl.setup(8_000)
        reader = Reader(
            p,
            tmp_path / "reader.log",
            CDC_POSTGRES__TABLES="public.first",
            CDC_POSTGRES__INCREMENTAL_CHUNK_ROWS="500",
        )
        reader.catch_up()
        wl.start()
        try:
            reader.start()
            reader.wait_for("replication started", count=2)
            with psycopg.connect(p.dsn, autocommit=True) as conn:
                conn.execute(f'ALTER PUBLICATION "{p.name}" ADD TABLE public.orders')
            reader.wait_for("incremental snapshot of public.orders complete", timeout=180)
        finally:
            log = wl.stop()
            reader.stop()
        assert "public.orders joined the captured tables while streaming" in reader.text()
        # Between runs: public.later joins through postgres.tables.
        reader.env["CDC_POSTGRES__TABLES"] = "public.first,public.orders,public.later"
        reader.catch_up()
        text = reader.text()
        assert "public.later joined the captured tables while the reader was stopped" in text
        assert "incremental snapshot of public.later complete: 3000 rows" in text
        for table in ("public.orders", "public.later"):
            records = topic(p, table)
            assert _incremental_rows(records) > 0
            assert_chunk_rows_not_stale(records)
            assert_topic_equals_table(records, p.dsn, table)
            assert_key_order(records)
        assert_no_change_missing(topic(p, "public.orders"), log)


def test_signals_written_while_the_reader_is_down_run_when_it_comes_back(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "incr_signal") as p:
        for name, rows in (("by_cli", 1_200), ("by_table", 900), ("by_kafka", 700)):
            Workload(p.dsn, f"public.{name}").setup(rows)
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE cdc_signal (id text PRIMARY KEY, type text, data text)")
        signal_topic = f"{p.name}.signals"
        reader = Reader(
            p,
            tmp_path / "reader.log",
            CDC_POSTGRES__SIGNAL_DATA_COLLECTION="public.cdc_signal",
            CDC_KAFKA__SIGNAL_TOPIC=signal_topic,
            CDC_POSTGRES__INCREMENTAL_CHUNK_ROWS="250",
        )
        reader.catch_up()  # the initial snapshot; creates the signal topic
        assert "incremental snapshot" not in reader.text()
        # The reader is down: one signal each way.
        out = cdc(p, "snapshot", "by_cli", "--where", "id % 2 = 0")
        assert "execute-snapshot signal" in out.stdout
        # cdc snapshot checks before it writes: a misspelled column is one line, exit 2.
        refused = cdc_fails(p, "snapshot", "by_table", "--where", "no_such_column > 1")
        assert "column 'no_such_column' is not a column of the table" in refused
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO cdc_signal VALUES ('s-1', 'execute-snapshot', %s)",
                (orjson.dumps({"data-collections": ["public.by_table"]}).decode(),),
            )
        producer = Producer({"bootstrap.servers": p.endpoints.kafka_bootstrap})
        signal = {
            "id": "kafka-1",
            "type": "execute-snapshot",
            "data": {"data-collections": ["public.by_kafka"], "type": "INCREMENTAL"},
        }
        key = signal_key(PostgresSettings(dsn=SecretStr(p.dsn)))
        assert key is not None
        producer.produce(
            signal_topic, key=p.name.encode(), value=sign(key, signal, database=p.name, slot=p.name)
        )
        assert producer.flush(30) == 0
        reader.catch_up()  # runs the three snapshots before it stops
        text = reader.text()
        assert "incremental snapshot of public.by_cli queued (wal, where id % 2 = 0)" in text
        assert "incremental snapshot of public.by_table queued (table)" in text
        assert "incremental snapshot of public.by_kafka queued (kafka)" in text
        expected = {"public.by_cli": 600, "public.by_table": 900, "public.by_kafka": 700}
        for table, rows in expected.items():
            assert f"incremental snapshot of {table} complete: {rows} rows" in text
            records = topic(p, table)
            assert _incremental_rows(records) == rows
            assert_topic_equals_table(records, p.dsn, table)
        assert {c[1] for c in chunks_done(text)} == set(expected)
        # Each signal ran once: the Kafka offset was committed, the WAL was acknowledged.
        reader.catch_up()
        assert reader.text().count("incremental snapshot of public.by_kafka queued") == 1
        assert reader.text().count("incremental snapshot of public.by_cli queued") == 1
