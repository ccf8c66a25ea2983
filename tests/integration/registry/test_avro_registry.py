"""The reader writing Avro through a schema registry, read back by a standard Avro consumer.

``PGCDC_TEST_REGISTRY_URL`` (and ``PGCDC_TEST_REGISTRY_USER_INFO``, ``user:password``) point
the test at a real registry with the Confluent API; without them it serves the stand-in of
:mod:`tests.integration.registry.standin` (with basic auth, so the wrong-password case runs). The consumer side is the library's own
``AvroDeserializer`` with its own ``SchemaRegistryClient``: nothing of ours decodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pgcdc.core.contract import table_topic
from tests.conftest import Endpoints, unique
from tests.integration.reader_support import ReaderEnv, read_topic, table_rows
from tests.integration.registry.standin import registry_env, registry_for_tests

pytestmark = pytest.mark.integration

USER_INFO = "cdc-registry:registry-secret-7"
ROWS = 40


@pytest.fixture(scope="module")
def registry() -> Iterator[tuple[str, str]]:
    """The registry's URL and basic-auth user info."""
    with registry_for_tests(USER_INFO) as found:
        yield found


def _consumer_client(url: str, user_info: str) -> SchemaRegistryClient:
    conf: dict[str, Any] = {"url": url}
    if user_info:
        conf["basic.auth.user.info"] = user_info
    return SchemaRegistryClient(conf)


def _fill(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty bigint,"
            " price numeric(10,2), seen timestamptz, flags boolean)"
        )
        conn.execute(
            "INSERT INTO items SELECT g, 'item ' || g, g * 1000000000::bigint,"
            " (g * 1.25)::numeric(10,2), now(), g %% 2 = 0 FROM generate_series(1, %s) g",
            (ROWS,),
        )


def _change(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET name = name || ' (changed)', qty = NULL WHERE id <= 5")
        conn.execute("DELETE FROM items WHERE id BETWEEN 6 AND 8")
        conn.execute("INSERT INTO items VALUES (1000, 'late', 7, 1.5, NULL, NULL)")


def test_standard_avro_consumer_reads_every_key_and_value(
    endpoints: Endpoints, pg_database: str, topic_prefix: str, registry: tuple[str, str]
) -> None:
    url, user_info = registry
    reader = ReaderEnv(
        pg_database,
        endpoints.kafka_bootstrap,
        topic_prefix,
        unique("slot"),
        extra=registry_env(url, user_info),
    )
    _fill(pg_database)
    reader.catch_up()  # the snapshot
    _change(pg_database)
    done = reader.catch_up()  # the stream: updates, deletes (with tombstones), an insert
    assert "registry-secret" not in done.stdout + done.stderr

    topic = table_topic(topic_prefix, "public", "items")
    records = read_topic(endpoints.kafka_bootstrap, topic)
    assert len(records) >= ROWS + 5 + 3 + 1
    client = _consumer_client(url, user_info)
    keys = AvroDeserializer(client)
    values = AvroDeserializer(client)
    state: dict[int, dict[str, Any] | None] = {}
    ops: set[str] = set()
    for r in records:
        # Every record is in Confluent's wire format: magic byte 0, then a 4-byte id.
        assert r.key is not None and r.key[0] == 0
        key = keys(r.key, SerializationContext(topic, MessageField.KEY))
        assert isinstance(key, dict) and set(key) == {"id"}
        if r.value is None:  # a tombstone after a delete
            state[key["id"]] = None
            continue
        assert r.value[0] == 0
        value = values(r.value, SerializationContext(topic, MessageField.VALUE))
        assert isinstance(value, dict)
        ops.add(value["op"])
        assert value["source"]["table"] == "items"
        image = value["before"] if value["op"] == "d" else value["after"]
        assert image["id"] == key["id"]
        state[key["id"]] = None if value["op"] == "d" else value["after"]
    assert ops == {"r", "u", "d", "c"}

    live = {k: v for k, v in state.items() if v is not None}
    rows = table_rows(pg_database)
    assert live.keys() == rows.keys()
    for key_id, row in rows.items():
        got = live[key_id]
        assert got["name"] == row["name"]
        assert got["qty"] == row["qty"]
        assert got["flags"] == row["flags"]
        # numeric(10,2) as Avro's decimal logical type; timestamptz as Debezium's ISO text.
        assert got["price"] == row["price"] and isinstance(got["price"], Decimal)
        assert (got["seen"] is None) == (row["seen"] is None)

    # One subject per key and value schema, named <topic>-key and <topic>-value.
    subjects = set(client.get_subjects())
    assert {f"{topic}-key", f"{topic}-value"} <= subjects


def test_wrong_registry_password_is_one_clear_error(
    endpoints: Endpoints, pg_database: str, topic_prefix: str, registry: tuple[str, str]
) -> None:
    url, user_info = registry
    if not user_info:
        pytest.skip("the registry given has no basic auth")
    user = user_info.split(":", 1)[0]
    reader = ReaderEnv(
        pg_database,
        endpoints.kafka_bootstrap,
        topic_prefix,
        unique("slot"),
        extra=registry_env(url, f"{user}:wrong-password-3"),
    )
    _fill(pg_database)
    done = reader.run("run", "--until", "current", timeout=300)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "schema registry" in errors[0] and "401" in errors[0], out[-2000:]
    assert "wrong-password-3" not in out
