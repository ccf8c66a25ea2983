"""Debezium parity, proven against Debezium itself.

Debezium Server 3.6 and our reader capture the same database (every type family the type map
knows with edge values; inserts, updates, deletes, key changes, TRUNCATE, a keyless table,
REPLICA IDENTITY FULL and USING INDEX, TOAST, column defaults, quoted and mixed-case names),
the same snapshot and the same changes. Their records are compared record by record and leaf
by leaf (keys, value schemas, payloads, tombstones, headers, ``source``): every difference must
be an intended departure (:mod:`~tests.integration.debezium_parity.allowlist`). Kafka Connect's
own JsonConverter then reads every record of both back, keys, values and headers: none may be
refused. One Debezium start for the whole module.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from benchmarks.env import BenchEnv
from pgcdc.core.contract import table_topic, truncate_topic
from tests.conftest import Endpoints
from tests.integration.debezium_parity import scenario
from tests.integration.debezium_parity.allowlist import ALLOWED, explain
from tests.integration.debezium_parity.capture import Captured, capture
from tests.integration.debezium_parity.compare import Comparison, Event, compare, events
from tests.integration.debezium_parity.connect_check import check_records
from tests.integration.debezium_parity.golden import debezium_part, fixture
from tests.integration.debezium_parity.peers import ParityDebezium, Record
from tests.unit.schemas.capture import FIXTURE, write_fixture

pytestmark = [pytest.mark.integration, pytest.mark.debezium]

# Set to 1 to rewrite the golden unit tests' fixture from this run's Debezium records.
REGENERATE = os.environ.get("PGCDC_REGENERATE_GOLDEN") == "1"


@pytest.fixture(scope="module")
def captured(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    env = BenchEnv(
        admin_dsn=endpoints.postgres_dsn,
        bootstrap=endpoints.kafka_bootstrap,
        out_dir=tmp_path_factory.mktemp("debezium_parity"),
    )
    try:
        yield capture(env)
    finally:
        problems = env.cleanup()
        assert not problems, problems


@pytest.fixture(scope="module")
def both(captured: Captured) -> tuple[list[Event], list[Event]]:
    tables = [tuple(t.split(".", 1)) for t in scenario.captured()]
    dbz_topics = {
        ParityDebezium.topic_of(captured.debezium_prefix, f"{s}.{t}"): (s, t) for s, t in tables
    }
    our_topics = {table_topic(captured.our_prefix, s, t): (s, t) for s, t in tables}
    return (
        events("debezium", captured.debezium, captured.debezium_prefix, dbz_topics),
        events("ours", captured.ours, captured.our_prefix, our_topics),
    )


@pytest.fixture(scope="module")
def comparison(both: tuple[list[Event], list[Event]]) -> Comparison:
    return compare(*both)


def test_our_reader_ran_to_the_end(captured: Captured) -> None:
    assert not captured.reader_errors, "\n".join(captured.reader_errors)


def test_every_kind_of_record_is_compared(both: tuple[list[Event], list[Event]]) -> None:
    dbz, _ = both
    kinds = collections.Counter("tombstone" if e.value is None else e.op for e in dbz)
    assert {"r", "c", "u", "d", "t", "tombstone"} <= kinds.keys(), kinds
    assert {e.table for e in dbz} == {tuple(t.split(".", 1)) for t in scenario.captured()}


def test_records_equal_debeziums_but_for_the_allow_list(
    comparison: Comparison, captured: Captured
) -> None:
    unexplained = [d for d in comparison.differences if explain(d) is None]
    used = collections.Counter(dep.name for d in comparison.differences if (dep := explain(d)))
    print(
        f"\ncompared {comparison.pairs} record pairs and {comparison.fields} fields "
        f"({comparison.debezium_records} Debezium records, {comparison.our_records} ours); "
        f"{len(comparison.differences)} differences, all but {len(unexplained)} allowed: "
        f"{dict(used)}; timings {captured.timings}"
    )
    assert comparison.pairs >= 350, comparison.pairs
    assert not unexplained, f"{len(unexplained)} unexplained differences:\n" + "\n".join(
        d.describe() for d in unexplained[:60]
    )
    # Each entry still has work to do: one that explains nothing is stale.
    assert {dep.name for dep in ALLOWED} == set(used), set(dep.name for dep in ALLOWED) - set(used)


def test_streamed_records_carry_debeziums_lsn_and_txid(comparison: Comparison) -> None:
    # Not allow-listed anywhere: a streamed pair with another lsn or txId is a difference.
    assert not [
        d
        for d in comparison.differences
        if not d.snapshot and d.path[-1] in ("lsn", "txId", "sequence")
    ]


def _connect_reads(side: str, records: list[Record]) -> None:
    result = check_records(records)
    print(
        f"\nJsonConverter read {result.records} {side} records "
        f"({result.conversions} keys, values and headers): {len(result.refusals)} refused"
    )
    assert result.records == len(records) > 0
    assert not result.refusals, "\n".join(
        f"{r.record.topic}@{r.record.offset} {r.part}: {r.error}" for r in result.refusals[:20]
    )


def test_kafka_connect_reads_every_table_topic_record(captured: Captured) -> None:
    # Debezium's records and ours in the table topics: every key, value and header.
    truncates = truncate_topic(captured.our_prefix)
    _connect_reads("debezium", captured.debezium)
    _connect_reads("ours", [r for r in captured.ours if r.topic != truncates])


def test_kafka_connect_reads_the_truncate_topic(captured: Captured) -> None:
    truncates = truncate_topic(captured.our_prefix)
    _connect_reads("truncate topic", [r for r in captured.ours if r.topic == truncates])


def test_golden_fixture_is_debeziums_output(captured: Captured) -> None:
    """tests/unit/schemas/fixtures/all_types.json holds what Debezium wrote for all_types."""
    if REGENERATE:
        write_fixture(fixture(captured))
    committed: dict[str, Any] = orjson.loads(FIXTURE.read_bytes())
    fresh = debezium_part(captured)
    hint = "regenerate it: PGCDC_REGENERATE_GOLDEN=1 or python -m tests.integration.debezium_parity.golden"
    assert committed.get("debezium") == fresh, f"{FIXTURE} is not Debezium's output; {hint}"
    assert committed["rows"] == captured.golden_base["rows"], hint

    def columns(table: dict[str, Any]) -> list[tuple[Any, ...]]:
        # Extension and enum type OIDs differ from one database to the next: names count.
        return [
            (
                c["name"],
                c["type"]["name"],
                c["type_modifier"],
                c["optional"],
                c["default"],
                c["dims"],
            )
            for c in table["columns"]
        ]

    assert columns(committed["table"]) == columns(captured.golden_base["table"]), hint
