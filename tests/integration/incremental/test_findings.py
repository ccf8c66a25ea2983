"""Issue 20's findings against real servers, one test each (findings 6 and 8, and the
merge's rules, are in tests/unit: test_incremental_model.py, test_spark_history_schemas.py).

1. An incremental initial snapshot whose queue was never saved is started over, not
   streamed past: the run dies at the queue's save; the next run copies every row.
2. A chunk read while DDL waits on the table reads the table as it is after the DDL (its
   schema inside the chunk's snapshot, the lock taken before it): an ``ALTER … TYPE``
   rewrite and an added column with a default, committed while the chunk waited.
3. A TRUNCATE replayed after a restart leaves the keys that hold a newer record (real
   Kafka, the truncate's key scan).
4. A dropped REPLICA IDENTITY FULL table is keyed as its topic was when its changes are
   replayed; 7. a signal for a table whose key may now be NULL is refused with one line,
   and the reader streams on.
5. Under ``statement_timeout = 100ms`` on the reader's role, chunks that time out are read
   again (with backoff) and the snapshot completes, equal to the table.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc.pipeline import Pipeline as ReaderPipeline
from cdc.state import StateStore
from pgcdc.core.contract import version_headers
from pgcdc.core.settings import KafkaSettings, Settings, load_settings
from tests.conftest import Endpoints, wait_until
from tests.e2e.pipeline import Pipeline
from tests.integration.incremental.support import Reader, cdc, pipeline, topic
from tests.integration.reader_support import Workload, assert_topic_equals_table

pytestmark = pytest.mark.integration


def _settings(p: Pipeline, **postgres: Any) -> Settings:
    return load_settings(
        None,
        {
            "postgres": {
                "dsn": p.dsn,
                "slot_name": p.name,
                "publication_name": p.name,
                **postgres,
            },
            "kafka": {
                "bootstrap_servers": p.endpoints.kafka_bootstrap,
                "topic_prefix": p.name,
                "dead_letter_topic": f"{p.name}.dlq",
            },
        },
    )


def test_1_an_initial_incremental_snapshot_whose_queue_was_not_saved_starts_over(
    endpoints: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pipeline(endpoints, tmp_path, "incr_f1") as p:
        Workload(p.dsn, "public.orders").setup(300)
        save_record = StateStore.save_record
        died: list[bytes] = []

        def dies_at_the_queue(self: StateStore, key: bytes, value: bytes, **kw: Any) -> None:
            if key.endswith(b"#snapshots") and not died:
                died.append(key)
                raise RuntimeError("killed while saving the snapshot queue")
            save_record(self, key, value, **kw)

        monkeypatch.setattr(StateStore, "save_record", dies_at_the_queue)
        with pytest.raises(RuntimeError, match="killed while saving"):
            ReaderPipeline(_settings(p, initial_snapshot="incremental"), until_current=True).run()
        monkeypatch.undo()
        assert died, "the run did not die at the queue's save"
        reader = Reader(p, tmp_path / "reader.log", CDC_POSTGRES__INITIAL_SNAPSHOT="incremental")
        reader.catch_up()
        assert "incremental snapshot of public.orders complete: 300 rows" in reader.text()
        assert_topic_equals_table(topic(p, "public.orders"), p.dsn, "public.orders")


def _waiting_chunk(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
            "'cdc-snapshot-chunks' AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


def test_2_a_chunk_reads_the_table_as_the_ddl_it_waited_for_left_it(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "incr_f2") as p:
        Workload(p.dsn, "public.orders").setup(200)
        reader = Reader(p, tmp_path / "reader.log")
        reader.start()  # the initial snapshot, then the stream
        try:
            reader.wait_for("replication started")
            with psycopg.connect(p.dsn) as ddl:
                # A rewrite (n int -> bigint) and a column with a default: no row is
                # streamed for either; only a chunk read after them carries their effect.
                ddl.execute("ALTER TABLE orders ALTER n TYPE bigint")
                ddl.execute("ALTER TABLE orders ADD COLUMN c int NOT NULL DEFAULT 7")
                cdc(p, "snapshot", "public.orders")
                wait_until(lambda: _waiting_chunk(p.dsn), timeout=60, what="a chunk on the lock")
                ddl.commit()
            reader.wait_for("incremental snapshot of public.orders complete", timeout=120)
        finally:
            reader.stop()
        assert "incremental snapshot of public.orders complete: 200 rows" in reader.text()
        assert_topic_equals_table(topic(p, "public.orders"), p.dsn, "public.orders")


def test_3_a_replayed_truncate_leaves_keys_that_hold_a_newer_record(
    endpoints: Endpoints,
) -> None:
    from cdc.live_keys import keys_live_before

    name = f"incr_f3_{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    try:
        producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap})
        # The truncate committed at 300 (its order 2). A row from before it (100); a row
        # an incremental snapshot chunk wrote after it (its high watermark 501); a row its
        # own transaction inserted before it was replayed (300, order 5).
        for key, lsn, order in ((b"old", 100, 0), (b"chunk", 500, 0), (b"same", 300, 5)):
            headers = version_headers(str(lsn).encode(), order)
            producer.produce(name, key=key, value=b"{}", headers=headers)
        assert producer.flush(30) == 0
        kafka = KafkaSettings(bootstrap_servers=endpoints.kafka_bootstrap)
        with keys_live_before(kafka, name, (300, 2)) as live:
            assert sorted(live) == [b"old", b"same"]
    finally:
        admin.delete_topics([name])


def test_4_7_a_table_that_cannot_be_keyed_or_is_gone_never_stops_the_reader(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "incr_f47") as p:
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE full_t (id int PRIMARY KEY, v text)")
            conn.execute("ALTER TABLE full_t REPLICA IDENTITY FULL")
            conn.execute("INSERT INTO full_t VALUES (1, 'a'), (2, 'b')")
            conn.execute("CREATE TABLE keyed (code text NOT NULL, v int)")
            conn.execute("ALTER TABLE keyed REPLICA IDENTITY FULL")
            conn.execute("INSERT INTO keyed VALUES ('x', 1)")
            conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
            conn.execute("CREATE TABLE cdc_signal (id text PRIMARY KEY, type text, data text)")
        reader = Reader(
            p,
            tmp_path / "reader.log",
            CDC_POSTGRES__MESSAGE_KEY_COLUMNS="public.keyed:code",
            CDC_POSTGRES__SIGNAL_DATA_COLLECTION="public.cdc_signal",
        )
        reader.start()
        try:
            reader.wait_for("replication started")
            with psycopg.connect(p.dsn, autocommit=True) as conn:
                conn.execute("ALTER TABLE keyed ALTER code DROP NOT NULL")
                conn.execute(
                    "INSERT INTO cdc_signal VALUES ('s1', 'execute-snapshot', %s)",
                    (orjson.dumps({"data-collections": ["public.keyed"]}).decode(),),
                )
            reader.wait_for("incremental snapshot of public.keyed dropped: it cannot be keyed")
            with psycopg.connect(p.dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO other VALUES (42)")
            wait_until(lambda: topic(p, "public.other"), what="a change streamed after it")
        finally:
            assert reader.stop() == 0, reader.tail()
        assert "may be NULL" in reader.text()
        # Finding 4: rows written, then the table dropped, while the reader is down.
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE keyed ALTER code SET NOT NULL")  # its start check
            conn.execute("INSERT INTO full_t VALUES (3, 'c')")
            conn.execute("UPDATE full_t SET v = 'bb' WHERE id = 2")
            conn.execute("DROP TABLE full_t")
        reader.catch_up()
        # Keyed by the primary key, as the topic was (not by every column, as a FULL
        # table's Relation message flags them), and the run went through them.
        records = [r for r in topic(p, "public.full_t") if r.key is not None]
        assert all(set(orjson.loads(r.key)["payload"]) == {"id"} for r in records)
        streamed = {(r.key_id, r.payload["op"]) for r in records if r.payload is not None}
        assert {(3, "c"), (2, "u")} <= streamed, streamed


def test_5_under_a_100ms_statement_timeout_chunks_are_read_again_and_complete(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    role, password = f"st_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    try:
        with pipeline(endpoints, tmp_path, "incr_f5") as p:
            Workload(p.dsn, "public.orders").setup(2_000)
            with psycopg.connect(p.dsn, autocommit=True) as conn:
                conn.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{password}'")
                conn.execute(f"GRANT SELECT ON orders TO {role}")
                conn.execute(f"CREATE PUBLICATION {p.name} FOR TABLE orders")
                conn.execute(f"ALTER ROLE {role} SET statement_timeout = '100ms'")
            _, _, rest = p.dsn.partition("@")
            role_dsn = f"postgresql://{role}:{password}@{rest}"
            reader = Reader(
                p,
                tmp_path / "reader.log",
                CDC_POSTGRES__DSN=role_dsn,
                CDC_POSTGRES__TABLES="public.orders",
                CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE="disabled",
            )
            reader.start()
            try:
                reader.wait_for("replication started")
                with psycopg.connect(p.dsn) as holder:
                    holder.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
                    cdc(p, "snapshot", "public.orders", CDC_POSTGRES__DSN=role_dsn)
                    reader.wait_for("due to statement timeout", count=2, timeout=60)
                    holder.commit()
                reader.wait_for("incremental snapshot of public.orders complete", timeout=120)
            finally:
                reader.stop()
            text = reader.text()
            assert "incremental snapshot of public.orders complete: 2000 rows" in text
            assert "snapshot of public.orders dropped" not in text
            assert_topic_equals_table(topic(p, "public.orders"), p.dsn, "public.orders")
    finally:
        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")
