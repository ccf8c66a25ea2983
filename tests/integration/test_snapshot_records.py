"""The snapshot's records, read back from Kafka, are byte for byte the events the plain
per-row path writes (psycopg's ``copy.rows()`` of every column as text, then
``EventEncoder.encode_key`` and ``encode_value``), for the all-types table and for tables cut
into several chunks and several encode batches; ``source.snapshot`` marks each table's first
and last record and the snapshot's own, and the order header counts every record once."""

from __future__ import annotations

import types
from typing import Any

import orjson
import psycopg
import pytest

from cdc.catalog import SchemaCatalog
from cdc.publisher import Publisher
from cdc.snapshot import KEY_BATCH, Snapshotter
from cdc.table_topics import TableTopics
from pgcdc.core.settings import KafkaSettings, SchemaSettings
from schemas import envelope
from schemas.envelope import EventEncoder
from schemas.model import SourceInfo
from tests.integration.reader_support import read_topic
from tests.unit.schemas.all_types import SETUP_SQL, create_table_sql, insert_sql

pytestmark = pytest.mark.integration

NOW_NS = 1_716_000_000_123_456_789
# (table, rows): several chunks (chunk_rows below), a chunk of more than one encode batch,
# a table of one row, an empty one.
SIZES = [("big", 2 * KEY_BATCH + 500), ("one", 1), ("empty", 0), ("few", 3)]


def test_snapshot_records_equal_the_per_row_path(
    pg_database: str, topic_prefix: str, endpoints: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        for stmt in [*SETUP_SQL, create_table_sql(), *insert_sql()]:
            conn.execute(stmt)
        for name, rows in SIZES:
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, t text, n numeric(8,2))")
            conn.execute(
                # Lines with escapes, with nulls, and plain ones.
                f"INSERT INTO {name} SELECT g, CASE WHEN g % 7 = 0 THEN NULL WHEN g % 2 = 0 "
                f"THEN 'row' || g ELSE 'row' || g || E'\\t\\\\' END, g / 100.0 "
                f"FROM generate_series(1, {rows}) g"
            )
        conn.execute("ANALYZE")
    tables = [("public", "all_types")] + [("public", name) for name, _ in SIZES]
    kafka = KafkaSettings(
        bootstrap_servers=endpoints.kafka_bootstrap, topic_prefix=topic_prefix, partitions=1
    )
    # NaN numerics are refused in the default (precise) mode; the corpus holds some.
    schema = SchemaSettings(decimal_handling_mode="string")
    encoder = EventEncoder(schema, topic_prefix, "db")
    publisher = Publisher(kafka)
    # One clock for every event, so both paths write the same ts_ms/ts_us/ts_ns.
    monkeypatch.setattr(envelope, "time", types.SimpleNamespace(time_ns=lambda: NOW_NS))
    with psycopg.connect(pg_database, autocommit=True) as admin:
        catalog = SchemaCatalog(admin, {})
        result = Snapshotter(
            pg_database,
            encoder=encoder,
            publisher=publisher,
            table_topics=TableTopics(publisher, kafka),
            kafka=kafka,
            load_schema=catalog.load_table_in,
            chunk_rows=900,
            progress=False,
        ).run(tables, None, None)
        schemas = {t: catalog.load_table_in(admin, *t) for t in tables}
    assert result.rows == sum(n for _, n in SIZES) + len(insert_sql())

    # Every record in snapshot order (the order header), with its table.
    got = []
    for t in tables:
        for r in read_topic(endpoints.kafka_bootstrap, encoder.topic(schemas[t])):
            assert r.commit_lsn == result.position.value - 1
            got.append((r.order, t, r))
    got.sort(key=lambda g: g[0])
    assert [g[0] for g in got] == list(range(len(got)))  # each order once, none missing
    markers = [orjson.loads(r.value or b"")["payload"]["source"]["snapshot"] for _, _, r in got]
    want_markers = []
    for t in tables:
        n = sum(1 for g in got if g[1] == t)
        if n == 1:  # the table's first and last: last wins, as in Debezium
            want_markers.append("last_in_data_collection")
        elif n > 1:
            want_markers += ["first_in_data_collection", *["true"] * (n - 2)]
            want_markers.append("last_in_data_collection")
    want_markers[0], want_markers[-1] = "first", "last"
    assert markers == want_markers
    assert [g[1] for g in got] == [t for t in tables for g in got if g[1] == t]  # table order

    # The plain path: psycopg's text rows, encode_key and encode_value, per row.
    with psycopg.connect(pg_database) as conn:
        expected: dict[tuple[tuple[str, str], bytes | None], Any] = {}
        for t in tables:
            cols = ", ".join(c.name for c in schemas[t].columns)
            query = f"COPY (SELECT {cols} FROM {t[0]}.{t[1]}) TO STDOUT"
            with conn.cursor() as cur, cur.copy(query) as copy:
                copy.set_types(["text"] * len(schemas[t].columns))
                for row in copy.rows():
                    key = encoder.encode_key(schemas[t], row)
                    expected[(t, key)] = row
    checked = 0
    for (_, t, r), marker in zip(got, markers, strict=True):
        row = expected.pop((t, r.key))
        src = orjson.loads(r.value or b"")["payload"]["source"]
        source = SourceInfo(src["ts_us"], marker, src["txId"], src["lsn"], None)
        assert r.value == encoder.encode_value(schemas[t], "r", None, row, source)
        checked += 1
    assert not expected and checked == result.rows
