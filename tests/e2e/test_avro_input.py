"""The sync jobs on Avro topics: the followers equal the database, as with JSON.

Two readers write the same kind of workload as Avro, one schemaless (its writer schemas in
``schema.avro_schema_dir``) and one framed through a schema registry (the stack's Apicurio
Registry, or yours with ``PGCDC_TEST_REGISTRY_URL``: ``tests.integration.registry.support``).
The search job reads the first, the cache job the second, so each follower and each Avro form
is run once. A record that is no Avro event of its topic is dead-lettered with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import Endpoints, unique
from tests.e2e.pipeline import (
    Pipeline,
    cache_state,
    diff,
    leader_state,
    new_pipeline,
    run_jobs_available_now,
    run_reader_until_current,
    search_state,
)
from tests.e2e.test_followers import SCHEMA, TABLES, run_workload
from tests.integration.real_databases.support import cleanup
from tests.integration.registry.support import (
    forget_subjects,
    registry_env,
    registry_for_tests,
)

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def registry() -> Iterator[tuple[str, str]]:
    with registry_for_tests() as found:
        yield found


def _pipeline(endpoints: Endpoints, tmp: pytest.TempPathFactory) -> Pipeline:
    return new_pipeline(endpoints, "avro", SCHEMA, tmp.mktemp("ckpt"))


def _run(p: Pipeline, env: dict[str, str], job: str, logs: Path) -> None:
    """Snapshot, a streamed workload with key changes and TOAST, one poison record, the job."""
    avro_p = replace(p, settings_env=tuple(env.items()))
    run_workload(p.dsn, seed=11, changes_wanted=1_000)
    run_reader_until_current(avro_p)
    assert run_workload(p.dsn, seed=12, changes_wanted=3_000) >= 3_000
    run_reader_until_current(avro_p)
    _produce_poison(p)
    run_jobs_available_now(avro_p, (job,), logs)


def _produce_poison(p: Pipeline) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": p.endpoints.kafka_bootstrap})
    # Bytes no Avro reader takes for this topic: a union index out of range.
    producer.produce(f"{p.name}.public.orders", key=b'{"id": -1}', value=b"\x09\xff\xff\xff")
    assert producer.flush(30) == 0


def _dead_letters(p: Pipeline) -> list[dict[str, object]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": p.endpoints.kafka_bootstrap,
            "group.id": unique("dlq"),
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(f"{p.name}.dlq", 0, 0)])
        letters = []
        while (msg := consumer.poll(5)) is not None:
            if msg.error() is None and msg.value():
                letters.append(orjson.loads(msg.value()))
        return letters
    finally:
        consumer.close()


def _assert_follower_holds_the_tables(
    p: Pipeline, state: Callable[[Pipeline, str], dict[str, dict[str, Any]]], follower: str
) -> None:
    """Each table's rows in the follower, and the poison record dead-lettered as Avro."""
    for table in TABLES:
        leader = leader_state(p.dsn, table)
        assert leader, f"{table} is empty"
        problems = diff(leader, state(p, table))
        assert not problems, f"{follower} differs from {table}:\n{problems}"
    letters = _dead_letters(p)
    assert any("Avro" in str(letter.get("reason", "")) for letter in letters), letters


def test_the_search_follower_on_schemaless_avro(
    endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory
) -> None:
    p = _pipeline(endpoints, tmp_path_factory)
    schemas = tmp_path_factory.mktemp("avsc")
    env = {"CDC_SCHEMA__VALUE_FORMAT": "avro", "CDC_SCHEMA__AVRO_SCHEMA_DIR": str(schemas)}
    try:
        _run(p, env, "search_sync", tmp_path_factory.mktemp("logs"))
        assert {f.name for f in schemas.iterdir()} >= {
            f"{p.name}.{t}-{part}.avsc" for t in TABLES for part in ("key", "value")
        }
        _assert_follower_holds_the_tables(p, search_state, "OpenSearch")
    finally:
        cleanup(p)


def test_the_cache_follower_on_registry_framed_avro(
    endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory, registry: tuple[str, str]
) -> None:
    p = _pipeline(endpoints, tmp_path_factory)
    try:
        _run(p, registry_env(*registry), "cache_sync", tmp_path_factory.mktemp("logs"))
        _assert_follower_holds_the_tables(p, cache_state, "Redis")
    finally:
        cleanup(p)
        forget_subjects(*registry, p.name)
