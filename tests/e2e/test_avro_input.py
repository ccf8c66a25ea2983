"""The sync jobs on Avro topics: the followers equal the database, as with JSON.

Two readers write Avro. One is schemaless (its writer schemas in ``schema.avro_schema_dir``),
read by the search job alone. The other is framed through a schema registry (the stack's
Apicurio Registry, or yours with ``PGCDC_TEST_REGISTRY_URL``:
``tests.integration.registry.support``) and carries, beside the workload's key changes and
TOASTed text, a table of numeric, timestamptz, jsonb, bytea and uuid values (TOASTed text,
JSON and bytes that updates leave alone among them): the shared job serves both followers
from it in one run, each value exact, and a new follower rebuilt from offset 0 of the
compacted topics equals the database too. A record that is no Avro event of its topic is
dead-lettered with the reason.
"""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from pydantic import SecretStr

from pgcdc.core.contract import JOBS
from pgcdc.core.settings import SchemaSettings, ValueFormat
from tests.conftest import Endpoints, unique, wait_until
from tests.e2e.pipeline import (
    Pipeline,
    diff,
    leader_state,
    new_pipeline,
    run_jobs_available_now,
    run_reader_until_current,
    run_shared_available_now,
    search_state,
)
from tests.e2e.test_followers import SCHEMA, TABLES, run_workload
from tests.integration.real_databases.exact import (
    cache_exact,
    dead_letters,
    differences,
    leader_exact,
    search_exact,
)
from tests.integration.real_databases.support import Table, cleanup
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


# --- registry-framed Avro: both followers by the shared job, then a rebuild from offset 0 ---

TYPED = Table("public", "typed")
REGISTRY_TABLES = (*(Table("public", t.split(".")[1]) for t in TABLES), TYPED)

TYPED_SCHEMA = """
CREATE TABLE typed (id int PRIMARY KEY, amount numeric(12,2), ratio numeric, at timestamptz,
                    doc jsonb, blob bytea, ref uuid, body text);
-- Out of line and uncompressed: an UPDATE that leaves them alone sends pgoutput's
-- "unchanged TOAST" marker instead of the value.
ALTER TABLE typed ALTER COLUMN body SET STORAGE EXTERNAL, ALTER COLUMN doc SET STORAGE EXTERNAL,
                  ALTER COLUMN blob SET STORAGE EXTERNAL;
"""
BIG = 9_000  # bytes of a TOASTed value


def _typed_row(i: int, gen: int = 0) -> tuple[Any, ...]:
    """Row ``i`` of ``typed`` (``gen`` gives it other values); every 17th is all nulls, every
    3rd has TOASTed text, JSON and bytes."""
    rnd = random.Random(i * 1_000 + gen)
    if i % 17 == 0:
        return (i, None, None, None, None, None, None, None)
    big = i % 3 == 0
    stamps = (
        "1969-12-31 23:59:59.999999+00",
        "1901-02-03 04:05:06.7+05:30",
        "2261-12-31 23:59:59.123456-08",
        "infinity",
    )
    doc = {"n": i, "gen": gen, "tags": ["a", 'q"uote', "ü"], "nested": {"x": rnd.random()}}
    if big:
        doc["pad"] = "".join(rnd.choices(string.ascii_letters, k=BIG))
    return (
        i,
        Decimal(rnd.randint(-(10**9), 10**9)) / 100,
        Decimal(f"{rnd.randint(-(10**30), 10**30)}E-{rnd.randint(0, 25)}"),
        rnd.choice(stamps)
        if i % 5 == 0
        else f"2026-0{rnd.randint(1, 9)}-1{i % 10} 12:34:56.{i:06d}+02",
        orjson.dumps(doc).decode(),
        rnd.randbytes(BIG) if big else (b"" if i % 7 == 0 else b"\x00\xff" + rnd.randbytes(9)),
        str(uuid.UUID(int=rnd.getrandbits(128))),
        "".join(rnd.choices(string.ascii_letters + " ü", k=BIG if big else 20)),
    )


def _insert_typed(dsn: str, ids: range) -> None:
    with psycopg.connect(dsn) as conn:
        conn.cursor().executemany(
            "INSERT INTO typed VALUES (%s, %s, %s, %s::timestamptz, %s::jsonb, %s, %s::uuid, %s)",
            [_typed_row(i) for i in ids],
        )


def _change_typed(dsn: str) -> None:
    """Streamed changes to ``typed``: inserts, a key change of TOASTed rows, updates of every
    column, a new TOASTed text, deletes, and last updates that leave the TOASTed columns
    alone (each such row's newest event, the one compaction keeps)."""
    _insert_typed(dsn, range(61, 121))
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE typed SET id = id + 1000 WHERE id IN (9, 66)")
        for i in range(1, 121, 5):
            _, _, ratio, at, doc, blob, ref, _ = _typed_row(i, gen=1)
            conn.execute(
                "UPDATE typed SET ratio = %s, at = %s::timestamptz, doc = %s::jsonb, blob = %s, "
                "ref = %s::uuid WHERE id = %s",
                (ratio, at, doc, blob, ref, i),
            )
        for i in range(2, 121, 7):
            conn.execute("UPDATE typed SET body = %s WHERE id = %s", (_typed_row(3, i)[7], i))
        conn.execute("DELETE FROM typed WHERE id % 10 = 4")
        conn.execute("UPDATE typed SET amount = amount + 1 WHERE id % 3 = 0")


def _assert_followers_equal_exactly(p: Pipeline) -> None:
    """Every table's rows in Redis and OpenSearch, each value exact for its type."""
    problems = []
    for table in REGISTRY_TABLES:
        leader = leader_exact(p, table)
        assert leader, f"{table.name} is empty"
        for follower, rows in (
            ("Redis", cache_exact(p, table)),
            ("OpenSearch", search_exact(p, table)),
        ):
            found = differences(leader, rows)
            if found:
                shown = "\n".join(f"  {k}: {v}" for k, v in sorted(found.items())[:5])
                problems.append(
                    f"{follower} differs from {table.name} ({len(found)} ids):\n{shown}"
                )
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def framed(
    endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory, registry: tuple[str, str]
) -> Iterator[Pipeline]:
    """A pipeline writing registry-framed Avro: a snapshot, streamed changes (key changes and
    TOAST in both), a poison record, then the shared job once for both followers."""
    p = new_pipeline(endpoints, "avroreg", SCHEMA + TYPED_SCHEMA, tmp_path_factory.mktemp("ckpt"))
    p = replace(p, settings_env=tuple(registry_env(*registry).items()))
    try:
        run_workload(p.dsn, seed=21, changes_wanted=200)
        _insert_typed(p.dsn, range(1, 61))
        run_reader_until_current(p)
        run_workload(p.dsn, seed=22, changes_wanted=400)
        _change_typed(p.dsn)
        run_reader_until_current(p)
        _produce_poison(p)
        run_shared_available_now(p, tmp_path_factory.mktemp("logs"))
        yield p
    finally:
        cleanup(p)
        forget_subjects(*registry, p.name)


def _records(p: Pipeline, table: Table) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record of the table's topic, from its start to its end."""
    from cdc.kafka_clients import read_topic

    msgs = read_topic(p.endpoints.kafka_bootstrap, table.topic(p.name), unique("check"), 60)
    return [(m.key(), m.value()) for m in msgs]


def _end(p: Pipeline, table: Table) -> int:
    """How many records the table's topic has had (its partitions' end offsets, summed)."""
    from confluent_kafka import Consumer, TopicPartition

    topic = table.topic(p.name)
    consumer = Consumer({"bootstrap.servers": p.endpoints.kafka_bootstrap, "group.id": unique("c")})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, n), timeout=10)[1] for n in parts
        )
    finally:
        consumer.close()


def test_both_followers_on_registry_framed_avro_equal_the_database(
    framed: Pipeline, registry: tuple[str, str]
) -> None:
    _assert_followers_equal_exactly(framed)
    # The records are Confluent's wire format, and an update that left TOASTed columns alone
    # carries them whole (what a follower rebuilt from the compacted topic needs).
    from spark_jobs.avro_input import AvroTranscoder

    url, user_info = registry
    transcoder = AvroTranscoder(
        SchemaSettings(
            value_format=ValueFormat.AVRO,
            registry_url=url,
            registry_basic_auth_user_info=SecretStr(user_info) if user_info else None,
        )
    )
    topic = TYPED.topic(framed.name)
    updated_whole = 0
    for key, value in _records(framed, TYPED):
        assert key is not None and key[:1] == b"\x00", key
        if value is None:
            continue
        assert value[:1] == b"\x00", value[:16]
        _, as_json, error = transcoder.transcode(topic, key, value)
        assert error is None and as_json is not None, error
        event = orjson.loads(as_json)["payload"]
        after = event["after"] or {}
        if event["op"] == "u" and after["id"] % 3 == 0 and after["id"] % 17:
            assert len(after["body"]) == BIG, after["body"][:60]
            updated_whole += 1
    assert updated_whole >= 30, updated_whole
    letters = dead_letters(framed)
    jobs = {letter.job for letter in letters if letter.reason.startswith("Avro: ")}
    assert jobs == set(JOBS), letters


def test_a_follower_rebuilt_from_the_compacted_topics_equals_the_database(
    framed: Pipeline, tmp_path: Path
) -> None:
    from tests.integration.reader_support import force_compaction

    topics = [t.topic(framed.name) for t in REGISTRY_TABLES]
    force_compaction(framed.endpoints.kafka_bootstrap, topics)
    # New writes (more than segment.ms later) roll the active segments, which the cleaner
    # never touches, so the older ones become cleanable.
    run_workload(framed.dsn, seed=23, changes_wanted=100)
    with psycopg.connect(framed.dsn, autocommit=True) as conn:
        conn.execute("UPDATE typed SET amount = amount - 1 WHERE id IN (1, 2)")
    run_reader_until_current(framed)

    def compacted() -> bool:
        return all(len(_records(framed, t)) < _end(framed, t) for t in REGISTRY_TABLES)

    wait_until(compacted, timeout=300, interval=2, what="the cleaner to compact every topic")
    fresh = framed.with_follower("r")
    run_shared_available_now(fresh, tmp_path)
    _assert_followers_equal_exactly(fresh)
