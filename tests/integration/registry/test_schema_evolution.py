"""Schema changes under the registry's compatibility rule, on a real registry.

The stack's Apicurio Registry with Confluent's default rule, BACKWARD (or yours with
``PGCDC_TEST_REGISTRY_URL``). Each ALTER TABLE below registers a second version of the
table's value subject: the reader writes every column but the key as an optional field with
a default (``null``, or the column's own default), so adding, dropping, renaming a column and
widening int to bigint all stay readable by the new schema. Every record keeps naming the
schema it was written with, so a standard Avro consumer reads the old records and the new
ones. A type change Avro cannot promote (int to text) is refused by the rule: the reader
stops with one line naming the table, the subject and the way past it, acknowledging nothing
from the change on; taking that way (relaxing the subject's rule) lets it carry on with
nothing lost. ``docs/avro.md`` has the table, beside what Debezium does.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pgcdc.core.contract import table_topic
from tests.conftest import Endpoints, unique
from tests.integration.reader_support import ReaderEnv, read_topic, slot_row, table_rows
from tests.integration.registry.support import forget_subjects, registry_env, registry_for_tests

pytestmark = pytest.mark.integration

OLD_COLUMNS = {"id", "qty", "label"}
# Ids 1 (updated) and 100 (inserted) change after the ALTER.
CHANGED = (1, 100)


@dataclass(frozen=True)
class Case:
    alter: str
    changes: tuple[str, ...]


CASES = {
    "add a nullable column": Case(
        "ALTER TABLE items ADD COLUMN note text",
        (
            "UPDATE items SET note = 'n1' WHERE id = 1",
            "INSERT INTO items (id, qty, note) VALUES (100, 100, 'n100')",
        ),
    ),
    "add a column with a default": Case(
        "ALTER TABLE items ADD COLUMN rank int NOT NULL DEFAULT 7",
        (
            "UPDATE items SET rank = 8 WHERE id = 1",
            "INSERT INTO items (id, qty) VALUES (100, 100)",
        ),
    ),
    "drop a column": Case(
        "ALTER TABLE items DROP COLUMN label",
        (
            "UPDATE items SET qty = qty + 1 WHERE id = 1",
            "INSERT INTO items (id, qty) VALUES (100, 100)",
        ),
    ),
    "widen a type": Case(
        "ALTER TABLE items ALTER COLUMN qty TYPE bigint",
        (
            "UPDATE items SET qty = 5000000000 WHERE id = 1",
            "INSERT INTO items VALUES (100, 6000000000, 'l100')",
        ),
    ),
    "rename a column": Case(
        "ALTER TABLE items RENAME COLUMN label TO title",
        (
            "UPDATE items SET title = 't1' WHERE id = 1",
            "INSERT INTO items (id, qty, title) VALUES (100, 100, 't100')",
        ),
    ),
}
REFUSED = Case(
    "ALTER TABLE items ALTER COLUMN qty TYPE text",
    (
        "UPDATE items SET qty = 'q1' WHERE id = 1",
        "INSERT INTO items VALUES (100, 'q100', 'l100')",
    ),
)


@pytest.fixture(scope="module")
def registry() -> Iterator[tuple[str, str]]:
    with registry_for_tests() as found:
        yield found


@pytest.fixture
def reader(
    endpoints: Endpoints, pg_database: str, topic_prefix: str, registry: tuple[str, str]
) -> Iterator[ReaderEnv]:
    """A reader of ``items`` (five rows, snapshotted) writing Avro through the registry."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, label text)")
        conn.execute("INSERT INTO items SELECT g, g, 'l' || g FROM generate_series(1, 5) g")
    env = ReaderEnv(
        pg_database,
        endpoints.kafka_bootstrap,
        topic_prefix,
        unique("slot"),
        extra=registry_env(*registry),
    )
    env.catch_up()
    try:
        yield env
    finally:
        forget_subjects(*registry, topic_prefix)


def _apply(dsn: str, case: Case) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(case.alter)
        for statement in case.changes:
            conn.execute(statement)


def _client(url: str, user_info: str) -> SchemaRegistryClient:
    conf: dict[str, Any] = {"url": url, "timeout": 30}
    if user_info:
        conf["basic.auth.user.info"] = user_info
    return SchemaRegistryClient(conf)


def _check_topic(reader: ReaderEnv, client: SchemaRegistryClient) -> None:
    """The value subject holds two versions. Every record reads with the schema it names:
    those of the first version (the snapshot, before the change) in the old shape, those of
    the second in the table's new shape; the changed rows equal the table now. (After a
    change the reader also snapshots the table again, so unchanged rows come again in the
    new shape, as Debezium's incremental snapshot would bring them.)"""
    topic = table_topic(reader.prefix, "public", "items")
    subject = f"{topic}-value"
    assert client.get_versions(subject) == [1, 2]
    old_id, new_id = (client.get_version(subject, v).schema_id for v in (1, 2))
    values = AvroDeserializer(client, conf={"subject.name.strategy.type": "TOPIC"})
    ctx = SerializationContext(topic, MessageField.VALUE)
    rows = table_rows(reader.dsn)
    new_columns = set(next(iter(rows.values())))
    latest: dict[int, dict[str, Any]] = {}
    read = {old_id: 0, new_id: 0}
    for r in read_topic(reader.bootstrap, topic):
        if r.value is None:
            continue
        assert r.value[0] == 0
        (schema_id,) = struct.unpack(">I", r.value[1:5])
        event = values(r.value, ctx)
        assert isinstance(event, dict)
        after = event["after"]
        assert set(after) == (OLD_COLUMNS if schema_id == old_id else new_columns), r
        read[schema_id] += 1
        latest[after["id"]] = after
    assert read[old_id] >= 5 and read[new_id] >= len(CHANGED), read
    assert set(latest) == set(rows)
    for key in CHANGED:
        assert latest[key] == rows[key], key


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: c.replace(" ", "-"))
def test_a_compatible_change_registers_a_new_version_and_old_records_still_read(
    reader: ReaderEnv, registry: tuple[str, str], case: str
) -> None:
    before = slot_row(reader.dsn, reader.slot)
    _apply(reader.dsn, CASES[case])
    reader.catch_up()
    after = slot_row(reader.dsn, reader.slot)
    assert before is not None and after is not None
    assert (after[1] or 0) > (before[1] or 0)  # the changes were acknowledged
    _check_topic(reader, _client(*registry))


def test_a_refused_change_stops_the_reader_with_the_way_past_it(
    reader: ReaderEnv, registry: tuple[str, str]
) -> None:
    client = _client(*registry)
    subject = f"{table_topic(reader.prefix, 'public', 'items')}-value"
    before = slot_row(reader.dsn, reader.slot)
    _apply(reader.dsn, REFUSED)

    done = reader.run("run", "--until", "current", timeout=300)
    out = done.stdout + done.stderr
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and len(errors) == 1, out[-3000:]
    for part in ("public.items", subject, "409", "compatibility", f"/config/{subject}"):
        assert part in errors[0], (part, errors[0])
    assert client.get_versions(subject) == [1]
    assert slot_row(reader.dsn, reader.slot) == before  # nothing acknowledged from it on

    # The way past it, as the line says: relax the subject's rule, run the reader again.
    client.set_compatibility(subject_name=subject, level="NONE")
    reader.catch_up()
    _check_topic(reader, client)
