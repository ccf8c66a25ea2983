"""A Kafka Connect sink with Connect's default settings reads our topics: Debezium's JDBC sink.

Our reader captures nine tables (integer, text, numeric, boolean, date, time, timestamp,
timestamptz, uuid, json, jsonb, bytea, float and array columns; single and composite keys,
one with a date, three of mixed types) through a snapshot and a stream of inserts, updates, deletes and
primary-key changes. Debezium's JDBC sink connector (Maven Central), in a standalone Kafka
Connect worker (Maven Central, the stack's Kafka version) configured with Connect's defaults
(JsonConverter with schemas, no header.converter: SimpleHeaderConverter), applies the topics
to tables of the same DDL in another database: every column of every row must end up equal
to the source, and the task must still be running.

The key changes are the point: each is a delete (with ``__debezium.newkey``), a tombstone and
a create (with ``__debezium.oldkey``), headers written as ``schema.header_format=simple``
(the default) says: as Connect's SimpleHeaderConverter reads them. Debezium's JDBC sink puts
every header of every record into a struct, so a header that converter reads back without a
schema kills its task. Three tables have keys of mixed types, the shapes where Connect's own
form of the header (what Debezium in Kafka Connect writes) is such a header: a text and an
int (texts with quotes, commas, colons, braces and a date's text among them), a uuid and a
date, a text and a numeric; their key changes must carry the JSON-string form and be applied.

The second test runs the same workload as registry-framed Avro (keys and values) and has
Connect read it through Apicurio Registry's Avro converter (docs/avro.md, "Kafka Connect on
these topics").
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastavro.schema import parse_schema, to_parsing_canonical_form
from psycopg import sql

from tests.conftest import Endpoints, unique, wait_until
from tests.integration.debezium_parity.connect_sink import (
    AVRO_CONVERTER_CLASS,
    CONNECTOR_CLASS,
    ConnectStandalone,
    ensure_avro_converter,
    wait_for,
)
from tests.integration.debezium_parity.peers import read_topics
from tests.integration.reader_support import KILLER, ReaderEnv, slot_row
from tests.integration.registry.support import forget_subjects, registry_env, registry_for_tests

pytestmark = [pytest.mark.integration, pytest.mark.debezium]

DDL = {
    "customers": "CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, "
    "email varchar(120), active boolean, score numeric(10,2), created timestamptz)",
    "orders": "CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, placed date, "
    "total numeric(12,2), note text, updated timestamp(3))",
    "lines": "CREATE TABLE lines (order_id bigint, line smallint, sku text, qty int, "
    "price double precision, weight real, PRIMARY KEY (order_id, line))",
    "docs": "CREATE TABLE docs (id uuid PRIMARY KEY, body jsonb, meta json, data bytea)",
    "tags": "CREATE TABLE tags (id int PRIMARY KEY, labels text[], nums int[])",
    "slots": "CREATE TABLE slots (day date, n smallint, at time, label varchar(20), "
    "PRIMARY KEY (day, n))",
    # Keys of mixed types: Connect's own header form cannot be read back by Connect.
    "accounts": "CREATE TABLE accounts (region text, seq int, owner text, "
    "PRIMARY KEY (region, seq))",
    "visits": "CREATE TABLE visits (visitor uuid, day date, pages int, PRIMARY KEY (visitor, day))",
    "rates": "CREATE TABLE rates (code varchar(12), amount numeric(8,2), note text, "
    "PRIMARY KEY (code, amount))",
}
MIXED_KEYS = ("accounts", "visits", "rates")
KEYS = {
    "customers": ("id",),
    "orders": ("id",),
    "lines": ("order_id", "line"),
    "docs": ("id",),
    "tags": ("id",),
    "slots": ("day", "n"),
    "accounts": ("region", "seq"),
    "visits": ("visitor", "day"),
    "rates": ("code", "amount"),
}
ROWS = [
    "INSERT INTO customers SELECT g, 'name ' || g, 'c' || g || '@example.com', g % 2 = 0, "
    "g * 1.25, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 hour' "
    "FROM generate_series(1, 40) g",
    "INSERT INTO orders SELECT g, g % 40 + 1, date '2024-02-01' + g, g * 10.5, "
    "CASE WHEN g % 3 = 0 THEN NULL ELSE 'note ' || g END, "
    "timestamp '2024-02-01 12:00:00.123' + g * interval '1 minute' FROM generate_series(1, 60) g",
    "INSERT INTO lines SELECT g / 3 + 1, g % 3, 'sku-' || g, g, g / 7.0, g / 4.0 "
    "FROM generate_series(0, 89) g",
    "INSERT INTO docs SELECT md5('d' || g)::uuid, jsonb_build_object('n', g, 'tags', "
    "jsonb_build_array('a', g)), json_build_object('k', g), decode(md5(g::text), 'hex') "
    "FROM generate_series(1, 30) g",
    "INSERT INTO tags SELECT g, ARRAY['t' || g, 'u' || g], ARRAY[g, g * 2, g * 3] "
    "FROM generate_series(1, 25) g",
    "INSERT INTO slots SELECT date '2024-03-01' + g / 4, g % 4, "
    "time '08:00' + g * interval '15 minutes', 'slot ' || g FROM generate_series(1, 20) g",
    "INSERT INTO accounts SELECT (ARRAY['us', 'eu', 'say \"hi\"', 'a,b', 'x:y', '{brace}', "
    "'2024-01-01', 'back\\slash'])[g % 8 + 1], g, 'owner ' || g FROM generate_series(1, 40) g",
    "INSERT INTO visits SELECT md5('v' || g % 6)::uuid, date '2024-05-01' + g, g "
    "FROM generate_series(1, 30) g",
    "INSERT INTO rates SELECT 'c' || g % 5, g * 1.25, 'rate ' || g FROM generate_series(1, 30) g",
]
CHANGES = [
    "INSERT INTO customers VALUES (41, 'new', NULL, NULL, NULL, NULL)",
    "UPDATE customers SET name = name || ' (edited)', score = score + 1 WHERE id % 5 = 0",
    "UPDATE customers SET id = id + 1000 WHERE id % 7 = 0",  # key changes
    "DELETE FROM customers WHERE id % 11 = 0",
    "UPDATE orders SET total = total * 2, note = NULL WHERE id % 4 = 0",
    "DELETE FROM orders WHERE id % 9 = 0",
    "UPDATE lines SET line = line + 10 WHERE order_id % 5 = 0",  # composite key changes
    "UPDATE lines SET qty = qty + 1, price = price * 3 WHERE order_id % 2 = 0",
    "DELETE FROM lines WHERE order_id = 7",
    "UPDATE docs SET body = body || '{\"edited\": true}' WHERE body->>'n' IN ('3', '4')",
    "DELETE FROM docs WHERE (body->>'n')::int > 27",
    "UPDATE tags SET labels = labels || ARRAY['z'], nums = NULL WHERE id % 3 = 0",
    "UPDATE tags SET id = id + 100 WHERE id % 8 = 0",
    "UPDATE slots SET at = at + interval '1 minute' WHERE label IN ('slot 2', 'slot 5')",
    "UPDATE slots SET day = day + 30, label = 'moved' WHERE label = 'slot 9'",  # a date key
    "UPDATE slots SET n = n + 10 WHERE label = 'slot 10'",
    "DELETE FROM slots WHERE label = 'slot 1'",
    "UPDATE accounts SET seq = seq + 1000 WHERE seq % 3 = 0",  # mixed-type key changes
    "UPDATE accounts SET region = region || ', moved' WHERE seq % 5 = 1",
    "UPDATE accounts SET owner = 'edited' WHERE seq % 4 = 0",
    "DELETE FROM accounts WHERE seq % 7 = 2",
    "UPDATE visits SET day = day + 100 WHERE pages % 4 = 0",
    "UPDATE visits SET visitor = md5('moved' || pages)::uuid WHERE pages % 5 = 1",
    "DELETE FROM visits WHERE pages % 9 = 0",
    "UPDATE rates SET amount = amount + 0.01 WHERE note LIKE '%3'",
    "UPDATE rates SET code = code || '-x' WHERE note LIKE '%7'",
]


@pytest.fixture
def target(endpoints: Endpoints) -> Iterator[str]:
    """Another database with the same tables, empty; dropped afterwards."""
    name = unique("sink")
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = endpoints.postgres_dsn_for(name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for ddl in DDL.values():
                conn.execute(ddl)
        yield dsn
    finally:
        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _rows(dsn: str, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every row as PostgreSQL renders it (to_jsonb), by key."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            sql.SQL("SELECT to_jsonb(t) FROM {} t").format(sql.Identifier(table))
        ).fetchall()
    return {tuple(r[k] for k in KEYS[table]): r for (r,) in found}


def _differences(source: str, target: str) -> dict[str, int]:
    out = {}
    for table in DDL:
        a, b = _rows(source, table), _rows(target, table)
        diff = len(a.keys() ^ b.keys()) + sum(1 for k in a.keys() & b.keys() if a[k] != b[k])
        if diff:
            out[table] = diff
    return out


def _assert_mixed_key_headers_are_json_strings(bootstrap: str, prefix: str) -> None:
    """The rare path is met: every key change of a mixed-type key carries its headers as a
    JSON string holding Connect's form (which Connect itself could not read back)."""
    topics = [f"{prefix}.public.{t}" for t in MIXED_KEYS]
    headers: dict[str, list[bytes]] = {t: [] for t in topics}
    for r in read_topics(bootstrap, topics):
        for name, value in r.headers:
            if name in ("__debezium.newkey", "__debezium.oldkey") and value is not None:
                headers[r.topic].append(value)
    for topic, found in headers.items():
        assert found, f"{topic}: no key change was captured"
        for value in found:
            assert value.startswith(b'"') and json.loads(value).startswith("{"), (topic, value)


def _jdbc_url(dsn: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return f"jdbc:postgresql://{info['host']}:{info.get('port', 5432)}/{info['dbname']}"


def _replicate(
    endpoints: Endpoints,
    source: str,
    prefix: str,
    target: str,
    workdir: Path,
    reader_settings: dict[str, str] | None = None,
    connector_settings: dict[str, str] | None = None,
    plugins: tuple[Path, ...] = (),
    stream: Callable[[ReaderEnv, list[str]], None] | None = None,
) -> None:
    """The workload through our reader (with ``reader_settings``), then Debezium's JDBC sink
    (with ``connector_settings`` beside Connect's defaults) until the target equals the
    source with the task still running. ``stream``: how the changes after the snapshot are
    made and read (default: all of them, then one catch-up)."""
    with psycopg.connect(source, autocommit=True) as conn:
        for ddl in DDL.values():
            conn.execute(ddl)
        for statement in ROWS:
            conn.execute(statement)
    reader = ReaderEnv(
        source, endpoints.kafka_bootstrap, prefix, unique("slot"), extra=reader_settings
    )
    reader.catch_up()  # the snapshot
    if stream is not None:
        stream(reader, CHANGES)
    else:
        with psycopg.connect(source, autocommit=True) as conn:
            for statement in CHANGES:
                conn.execute(statement)
    reader.catch_up()  # the stream, key changes included
    _assert_mixed_key_headers_are_json_strings(endpoints.kafka_bootstrap, prefix)
    info = psycopg.conninfo.conninfo_to_dict(target)
    worker = ConnectStandalone(
        workdir,
        endpoints.kafka_bootstrap,
        {
            "name": f"jdbc-{prefix}",
            "connector.class": CONNECTOR_CLASS,
            "tasks.max": "1",
            "topics.regex": f"{prefix}\\.public\\..*",
            "connection.url": _jdbc_url(target),
            "connection.username": str(info["user"]),
            "connection.password": str(info["password"]),
            "insert.mode": "upsert",
            "delete.enabled": "true",
            "primary.key.mode": "record_key",
            "schema.evolution": "none",
            "collection.name.format": "${source.table}",
            **(connector_settings or {}),
        },
        plugins,
    )
    worker.start()
    try:
        wait_for(worker.running, 180, "the connector's task to run", worker)
        wait_for(
            lambda: not _differences(source, target),
            180,
            "the target database to equal the source",
            worker,
        )
        assert worker.running(), worker.failed_tasks() or worker.output()
    finally:
        worker.stop()
        if os.environ.get("PGCDC_KEEP_CONNECT_LOG"):
            print(worker.output())
    compared = {t: len(_rows(target, t)) for t in DDL}
    print(f"\nJDBC sink: every column of {compared} rows equal to the source")
    assert all(compared.values())


def test_debeziums_jdbc_sink_with_connects_defaults_replicates_our_topics(
    endpoints: Endpoints, pg_database: str, topic_prefix: str, target: str, tmp_path: Path
) -> None:
    _replicate(endpoints, pg_database, topic_prefix, target, tmp_path / "connect")


def test_debeziums_jdbc_sink_reads_committed_records_of_a_transactional_reader_after_kills(
    endpoints: Endpoints, pg_database: str, topic_prefix: str, target: str, tmp_path: Path
) -> None:
    """``kafka.exactly_once`` (docs/exactly-once.md): the changes are streamed by readers
    killed at injected points of their Kafka transactions (after a commit, before the slot
    is confirmed; before a commit), so the topics hold aborted transactions and commit
    markers; the sink reads them with ``consumer.override.isolation.level=read_committed``
    and the target must equal the source."""

    def through_kills(reader: ReaderEnv, changes: list[str]) -> None:
        half = len(changes) // 2
        for n, (point, part) in enumerate(
            (("after_commit:3", changes[:half]), ("before_commit:3", changes[half:]))
        ):
            log = tmp_path / f"reader{n}.log"
            proc = reader.start(log_path=log, PGCDC_KILL_AT=point, PYTHONPATH=str(KILLER))
            with psycopg.connect(reader.dsn, autocommit=True) as conn:
                for statement in part:
                    conn.execute(statement)
            proc.wait(120)
            text = log.read_text(errors="replace")
            assert proc.returncode == -signal.SIGKILL, text[-3000:]
            assert f"injected kill: {point.partition(':')[0]}" in text, text[-3000:]
            wait_until(
                lambda: not _slot_active(reader),
                timeout=30,
                what="the killed reader's slot to be released",
            )

    _replicate(
        endpoints,
        pg_database,
        topic_prefix,
        target,
        tmp_path / "connect",
        reader_settings={"CDC_KAFKA__EXACTLY_ONCE": "true"},
        connector_settings={"consumer.override.isolation.level": "read_committed"},
        stream=through_kills,
    )


def _slot_active(reader: ReaderEnv) -> bool:
    row = slot_row(reader.dsn, reader.slot)
    return row is not None and row[0]


def test_debeziums_jdbc_sink_reads_our_avro_topics_through_apicurios_converter(
    endpoints: Endpoints, pg_database: str, topic_prefix: str, target: str, tmp_path: Path
) -> None:
    """The same workload written as registry-framed Avro (keys and values), read by Kafka
    Connect through Apicurio Registry's Avro converter (2.6, Maven Central) from the same
    registry, through Apicurio's own API (v2): the ids in the records are the ids the
    registry's Confluent API hands out, Apicurio 3's content ids."""
    with registry_for_tests() as (url, user_info):
        if "/apis/ccompat/" not in url:
            pytest.skip(f"Apicurio's converter needs an Apicurio Registry; {url} is not one")
        native = url.split("/apis/ccompat/", 1)[0] + "/apis/registry/v2"
        converter: dict[str, str] = {}
        for side in ("key", "value"):
            converter |= {
                f"{side}.converter": AVRO_CONVERTER_CLASS,
                f"{side}.converter.apicurio.registry.url": native,
                f"{side}.converter.apicurio.registry.as-confluent": "true",
                f"{side}.converter.apicurio.registry.use-id": "contentId",
            }
        try:
            _replicate(
                endpoints,
                pg_database,
                topic_prefix,
                target,
                tmp_path / "connect",
                reader_settings=registry_env(url, user_info),
                connector_settings=converter,
                plugins=(ensure_avro_converter(),),
            )
            _assert_framed_with_content_ids(endpoints.kafka_bootstrap, topic_prefix, url, native)
        finally:
            forget_subjects(url, user_info, topic_prefix)


def _assert_framed_with_content_ids(bootstrap: str, prefix: str, url: str, native: str) -> None:
    """What the converter read: every key and value of a topic with a mixed-type key is
    Confluent-framed (magic byte 0, a 4-byte id), and each id is a content id of Apicurio's
    own API with the schema the Confluent API gives for it."""
    records = read_topics(bootstrap, [f"{prefix}.public.accounts"])
    framed = [b for r in records for b in (r.key, r.value) if b is not None]
    assert framed and all(b[0] == 0 and len(b) > 5 for b in framed)
    for schema_id in sorted({int.from_bytes(b[1:5], "big") for b in framed}):
        with urllib.request.urlopen(f"{url}/schemas/ids/{schema_id}", timeout=10) as r:
            confluent = _canonical(json.loads(r.read())["schema"])
        with urllib.request.urlopen(f"{native}/ids/contentIds/{schema_id}", timeout=10) as r:
            assert _canonical(r.read().decode()) == confluent, schema_id


def _canonical(schema_text: str) -> str:
    """Avro's Parsing Canonical Form (the registry's two APIs lay the same schema out
    differently)."""
    return str(to_parsing_canonical_form(parse_schema(json.loads(schema_text))))
