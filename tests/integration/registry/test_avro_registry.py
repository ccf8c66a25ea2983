"""The reader writing Avro through a schema registry, read back by a standard Avro consumer.

The registry is the stack's Apicurio Registry (``scripts/stack up registry``), or yours with
``PGCDC_TEST_REGISTRY_URL`` (:mod:`tests.integration.registry.support`); the basic-auth case
runs on a second Apicurio Registry that asks for a password. The consumer side is the
library's own ``AvroDeserializer`` with its own ``SchemaRegistryClient``: nothing of ours
decodes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pgcdc.core.contract import table_topic
from tests.conftest import Endpoints, unique
from tests.integration.reader_support import ReaderEnv, read_topic, table_rows
from tests.integration.registry.support import (
    forget_subjects,
    registry_env,
    registry_for_tests,
    registry_with_users,
)

pytestmark = pytest.mark.integration

USER, PASSWORD = "cdc-registry", "registry-secret-7"
ROWS = 40


@pytest.fixture(scope="module")
def registry() -> Iterator[tuple[str, str]]:
    """The registry's URL and basic-auth user info ('' for none)."""
    with registry_for_tests() as found:
        yield found


@pytest.fixture(scope="module")
def registry_with_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A registry that asks for basic auth: yours when ``PGCDC_TEST_REGISTRY_USER_INFO`` is
    set, else a second Apicurio Registry with one user; its URL and the right user info."""
    if os.environ.get("PGCDC_TEST_REGISTRY_URL"):
        user_info = os.environ.get("PGCDC_TEST_REGISTRY_USER_INFO", "")
        if not user_info:
            pytest.skip("the registry given has no basic auth")
        yield os.environ["PGCDC_TEST_REGISTRY_URL"], user_info
        return
    state: Path = tmp_path_factory.mktemp("registry-auth")
    with registry_with_users(state, {USER: PASSWORD}) as url:
        yield url, f"{USER}:{PASSWORD}"


# How a consumer reading these topics through Apicurio Registry configures the library: the
# subject of a record is <topic>-key/-value (Confluent's classic TOPIC strategy). The library's
# default strategy now asks the registry's /associations API first, which Apicurio 3.3.3 lacks:
# its empty 404 left about one request in 1,000 without an answer here (docs/avro.md), and the
# client waits for ever unless it has a timeout.
DESERIALIZER_CONF = {"subject.name.strategy.type": "TOPIC"}


def _consumer_client(url: str, user_info: str) -> SchemaRegistryClient:
    conf: dict[str, Any] = {"url": url, "timeout": 30}
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
    try:
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
        reader.catch_up()  # the stream: updates, deletes (with tombstones), an insert

        topic = table_topic(topic_prefix, "public", "items")
        records = read_topic(endpoints.kafka_bootstrap, topic)
        assert len(records) >= ROWS + 5 + 3 + 1
        client = _consumer_client(url, user_info)
        keys = AvroDeserializer(client, conf=DESERIALIZER_CONF)
        values = AvroDeserializer(client, conf=DESERIALIZER_CONF)
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
    finally:
        forget_subjects(url, user_info, topic_prefix)


def test_registry_basic_auth_right_and_wrong_password(
    endpoints: Endpoints,
    pg_database: str,
    topic_prefix: str,
    registry_with_auth: tuple[str, str],
) -> None:
    """The right password registers the schemas; a wrong one is one clear error line (the
    registry's 401), and neither password is ever printed."""
    url, user_info = registry_with_auth
    user, password = user_info.split(":", 1)
    _fill(pg_database)
    try:
        right = ReaderEnv(
            pg_database,
            endpoints.kafka_bootstrap,
            topic_prefix,
            unique("slot"),
            extra=registry_env(url, user_info),
        )
        done = right.catch_up()
        assert password not in done.stdout + done.stderr
        topic = table_topic(topic_prefix, "public", "items")
        subjects = set(_consumer_client(url, user_info).get_subjects())
        assert {f"{topic}-key", f"{topic}-value"} <= subjects

        wrong = ReaderEnv(
            pg_database,
            endpoints.kafka_bootstrap,
            f"{topic_prefix}.wrong",
            unique("slot"),
            extra=registry_env(url, f"{user}:wrong-password-3"),
        )
        done = wrong.run("run", "--until", "current", timeout=300)
        assert done.returncode != 0
        out = done.stdout + done.stderr
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        tail = out[-2000:]
        assert len(errors) == 1 and "schema registry" in errors[0] and "401" in errors[0], tail
        assert "wrong-password-3" not in out and password not in out
    finally:
        forget_subjects(url, user_info, topic_prefix)
