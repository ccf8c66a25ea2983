"""A captured table's columns change (issue 38): the reader snapshots it again, so that rows
not changed since the DDL reach Kafka (and the followers) in the table's new shape.

Log-based capture carries no event for DDL: without the new snapshot the compacted topic
keeps every unchanged row with a dropped column, an old name or an old type.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.conftest import Endpoints
from tests.integration.incremental.support import Reader, pipeline, topic
from tests.integration.reader_support import assert_key_order, assert_topic_equals_table

pytestmark = pytest.mark.integration

TABLE = "public.items"


def _ddl(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)


def test_columns_retyped_added_dropped_and_renamed_reach_the_topic(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "schema_change") as p:
        _ddl(
            p.dsn,
            "CREATE TABLE items (id int PRIMARY KEY, qty int, name text)",
            "INSERT INTO items SELECT i, i, 'n' || i FROM generate_series(1, 200) i",
        )
        reader = Reader(p, tmp_path / "reader.log", CDC_POSTGRES__INCREMENTAL_CHUNK_ROWS="64")
        reader.catch_up()  # the initial snapshot: the table's first shape is recorded
        assert "changed (" not in reader.text()

        # While streaming: a type change, then a column added and one dropped.
        done = "incremental snapshot of public.items complete"
        started = reader.text().count("replication started")
        reader.start()
        try:
            reader.wait_for("replication started", count=started + 1)
            _ddl(
                p.dsn,
                "ALTER TABLE items ALTER COLUMN qty TYPE text USING qty::text",
                "UPDATE items SET qty = 'many-' || id WHERE id <= 50",
            )
            reader.wait_for(done, timeout=180)
            _ddl(
                p.dsn,
                "ALTER TABLE items ADD COLUMN tags text[]",
                "UPDATE items SET tags = ARRAY['t' || id] WHERE id % 7 = 0",
                "ALTER TABLE items DROP COLUMN name",
                "INSERT INTO items (id, qty) VALUES (1000, 'new')",
            )
            reader.wait_for(done, timeout=180, count=2)
        finally:
            reader.stop()
        text = reader.text()
        assert "table public.items changed (qty int4 -> text)" in text
        # ADD and DROP committed apart: one Relation message each, or one for both when the
        # first change after them comes later; either way the dropped column is named.
        assert "name dropped" in text
        assert_topic_equals_table(topic(p, TABLE), p.dsn, TABLE)

        # While the reader is stopped: a rename and a type change back.
        _ddl(
            p.dsn,
            "ALTER TABLE items RENAME COLUMN qty TO amount",
            "UPDATE items SET amount = id::text WHERE amount !~ '^[0-9]+$'",
            "ALTER TABLE items ALTER COLUMN amount TYPE bigint USING amount::bigint",
            "UPDATE items SET amount = amount + 1 WHERE id = 1000",
        )
        reader.catch_up()
        text = reader.text()
        # Seen at the restart's first look at the catalog, or in the backlog's Relation messages.
        assert "table public.items changed (qty dropped; amount added)" in text, text[-3000:]
        records = topic(p, TABLE)
        assert_topic_equals_table(records, p.dsn, TABLE)
        assert_key_order(records)
        # Every row, changed or not, was published again after the last DDL.
        newest = {r.key: r.payload for r in records if r.payload is not None}
        assert all(set(v["after"]) == {"id", "amount", "tags"} for v in newest.values())

        # A restart's Relation message and catalog look of an unchanged shape change nothing.
        before = reader.text().count("changed (")
        _ddl(p.dsn, "UPDATE items SET tags = ARRAY['again'] WHERE id = 2")
        reader.catch_up()
        assert reader.text().count("changed (") == before, reader.tail()


def test_a_table_altered_and_not_written_since_is_seen_in_the_catalog(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    with pipeline(endpoints, tmp_path, "schema_look") as p:
        _ddl(
            p.dsn,
            "CREATE TABLE items (id int PRIMARY KEY, qty int)",
            "INSERT INTO items SELECT i, i FROM generate_series(1, 100) i",
        )
        reader = Reader(p, tmp_path / "reader.log")
        reader.catch_up()
        started = reader.text().count("replication started")
        reader.start()
        try:
            reader.wait_for("replication started", count=started + 1)
            # No row is written after it: pgoutput sends no Relation message.
            _ddl(p.dsn, "ALTER TABLE items ALTER COLUMN qty TYPE text USING 'many-' || qty")
            reader.wait_for("incremental snapshot of public.items complete", timeout=120)
        finally:
            reader.stop()
        assert "table public.items changed (qty int4 -> text)" in reader.text()
        assert_topic_equals_table(topic(p, TABLE), p.dsn, TABLE)
