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
from tests.integration.debezium_parity.compare import (
    Comparison,
    Difference,
    Event,
    compare,
    events,
)
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


def _events(got: Captured) -> tuple[list[Event], list[Event]]:
    tables = [tuple(t.split(".", 1)) for t in got.tables]
    dbz_topics = {
        ParityDebezium.topic_of(got.debezium_prefix, f"{s}.{t}"): (s, t) for s, t in tables
    }
    our_topics = {table_topic(got.our_prefix, s, t): (s, t) for s, t in tables}
    return (
        events("debezium", got.debezium, got.debezium_prefix, dbz_topics),
        events("ours", got.ours, got.our_prefix, our_topics),
    )


def _modes(captured: Captured) -> Captured:
    assert captured.modes is not None
    return captured.modes


@pytest.fixture(scope="module")
def both(captured: Captured) -> tuple[list[Event], list[Event]]:
    return _events(captured)


@pytest.fixture(scope="module")
def comparison(both: tuple[list[Event], list[Event]]) -> Comparison:
    return compare(*both)


@pytest.fixture(scope="module")
def modes_both(captured: Captured) -> tuple[list[Event], list[Event]]:
    return _events(_modes(captured))


@pytest.fixture(scope="module")
def modes_comparison(modes_both: tuple[list[Event], list[Event]]) -> Comparison:
    return compare(*modes_both)


def test_our_reader_ran_to_the_end(captured: Captured) -> None:
    assert not captured.reader_errors, "\n".join(captured.reader_errors)
    assert not _modes(captured).reader_errors, "\n".join(_modes(captured).reader_errors)


def test_every_kind_of_record_is_compared(both: tuple[list[Event], list[Event]]) -> None:
    dbz, _ = both
    kinds = collections.Counter("tombstone" if e.value is None else e.op for e in dbz)
    assert {"r", "c", "u", "d", "t", "tombstone"} <= kinds.keys(), kinds
    assert {e.table for e in dbz} == {tuple(t.split(".", 1)) for t in scenario.captured()}


def _unexplained(name: str, comparison: Comparison, captured: Captured) -> list[Difference]:
    unexplained = [d for d in comparison.differences if explain(d) is None]
    used = collections.Counter(dep.name for d in comparison.differences if (dep := explain(d)))
    print(
        f"\n{name}: compared {comparison.pairs} record pairs and {comparison.fields} fields "
        f"({comparison.debezium_records} Debezium records, {comparison.our_records} ours); "
        f"{len(comparison.differences)} differences, all but {len(unexplained)} allowed: "
        f"{dict(used)}; timings {captured.timings}"
    )
    return unexplained


def _report(unexplained: list[Difference]) -> str:
    return f"{len(unexplained)} unexplained differences:\n" + "\n".join(
        d.describe() for d in unexplained[:60]
    )


def test_records_equal_debeziums_but_for_the_allow_list(
    comparison: Comparison, captured: Captured
) -> None:
    unexplained = _unexplained("default modes", comparison, captured)
    assert comparison.pairs >= 350, comparison.pairs
    assert not unexplained, _report(unexplained)


def test_records_in_the_other_modes_equal_debeziums(
    modes_comparison: Comparison, modes_both: tuple[list[Event], list[Event]], captured: Captured
) -> None:
    """hstore.handling.mode=map, time.precision.mode=connect, include.unknown.datatypes=false
    on both sides, over the columns they change."""
    unexplained = _unexplained("other modes", modes_comparison, _modes(captured))
    assert modes_comparison.pairs >= 80, modes_comparison.pairs
    assert not unexplained, _report(unexplained)
    # The modes were in force on both sides (so the comparison above compared them).
    for side in modes_both:
        fields = {
            c["field"]: c
            for e in side
            if e.value is not None and e.table == ("public", "modes")
            for f in e.value["schema"]["fields"]
            if f["field"] == "after"
            for c in f["fields"]
        }
        assert fields["c_hstore"]["type"] == "map", fields["c_hstore"]
        assert fields["c_ts"]["name"] == "org.apache.kafka.connect.data.Timestamp"
        assert fields["c_time"]["name"] == "org.apache.kafka.connect.data.Time"
        assert fields["c_date_arr"]["items"]["name"] == "org.apache.kafka.connect.data.Date"
        assert "c_box" not in fields and "c_pg_lsn" not in fields, sorted(fields)


def test_every_allow_list_entry_explains_something(
    comparison: Comparison, modes_comparison: Comparison
) -> None:
    # Each entry still has work to do: one that explains nothing is stale.
    used = {
        dep.name
        for c in (comparison, modes_comparison)
        for d in c.differences
        if (dep := explain(d)) is not None
    }
    assert {dep.name for dep in ALLOWED} == used, {dep.name for dep in ALLOWED} - used


def test_streamed_records_carry_debeziums_lsn_and_txid(
    comparison: Comparison, modes_comparison: Comparison
) -> None:
    # Not allow-listed anywhere: a streamed pair with another lsn or txId is a difference.
    for c in (comparison, modes_comparison):
        assert not [
            d for d in c.differences if not d.snapshot and d.path[-1] in ("lsn", "txId", "sequence")
        ]


def _sequence(e: Event) -> list[str | None]:
    seq: list[str | None] = orjson.loads(e.payload["source"]["sequence"])
    return seq


def test_sequence_after_a_restart_is_debeziums(
    both: tuple[list[Event], list[Event]], captured: Captured
) -> None:
    """Our reader was stopped and started again mid-stream (Debezium streamed on): the first
    transaction after the restart says where the previous commit ends, as Debezium does."""
    assert len(captured.restarts) == 1, captured.restarts
    restart = captured.restarts[0]
    dbz, ours = both

    def first_after(evs: list[Event]) -> Event:
        streamed = [e for e in evs if e.value is not None and not e.snapshot]
        return min((e for e in streamed if int(e.lsn) > restart), key=lambda e: int(e.lsn))

    theirs, mine = first_after(dbz), first_after(ours)
    assert theirs.lsn == mine.lsn
    assert _sequence(mine)[0] is not None, _sequence(mine)
    assert _sequence(mine) == _sequence(theirs)
    # The previous commit ends where (or before) this transaction's first change starts.
    assert int(_sequence(mine)[0] or 0) <= int(mine.lsn)


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


def test_kafka_connect_reads_every_record_in_the_other_modes(captured: Captured) -> None:
    modes = _modes(captured)
    _connect_reads("debezium (other modes)", modes.debezium)
    _connect_reads("ours (other modes)", modes.ours)


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
