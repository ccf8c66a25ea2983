"""Capture the parity database with Debezium Server and our reader, the same snapshot and the
same changes, and read back every record each wrote.

Order: the database is built; Debezium Server starts (its JVM takes a while) while our reader
snapshots; once Debezium's snapshot is in Kafka too, the changes are made, in phases: our
reader catches up after each (so it is started again mid-stream), and Debezium is stopped
once the sentinel row's record has reached its topic. Then the same again, smaller, with the
non-default modes (:func:`modes_plan`): a second Debezium Server start.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

from benchmarks.env import BenchEnv
from pgcdc.core.contract import table_topic, truncate_topic
from tests.integration.debezium_parity import scenario
from tests.integration.debezium_parity.peers import (
    ParityDebezium,
    Record,
    read_topics,
    topics_with_prefix,
)
from tests.integration.reader_support import ReaderEnv
from tests.unit.schemas.capture import describe

log = logging.getLogger(__name__)

DEBEZIUM_START_TIMEOUT_S = 180.0
DEBEZIUM_STREAM_TIMEOUT_S = 120.0


@dataclass
class Captured:
    """What both systems wrote, and what the comparison needs to know about the run."""

    debezium: list[Record]
    ours: list[Record]
    debezium_prefix: str
    our_prefix: str
    database: str
    timings: dict[str, float] = field(default_factory=dict)
    # Our reader's failures (exit code and the end of its output): the capture goes on, so
    # Debezium's side is still there to look at.
    reader_errors: list[str] = field(default_factory=list)
    # all_types as the golden unit tests' fixture holds it (tests.unit.schemas.capture).
    golden_base: dict[str, Any] = field(default_factory=dict)
    # The server's WAL position when our reader was started again mid-stream: the first
    # transaction after it is the first our reader streamed after a restart.
    restarts: list[int] = field(default_factory=list)
    # The same for the non-default modes (hstore map, time connect, unknown types dropped).
    modes: Captured | None = None
    tables: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Plan:
    """One capture: the tables, the changes (our reader starts again between phases while
    Debezium streams on), the table whose row ends it, and both systems' settings."""

    role: str
    tables: list[str]
    phases: tuple[tuple[tuple[str, ...], ...], ...]
    sentinel: tuple[str, str]
    debezium: dict[str, str] = field(default_factory=dict)  # debezium.source.* properties
    ours: dict[str, str] = field(default_factory=dict)  # CDC_* environment


def main_plan() -> Plan:
    """Every type with the default modes, every kind of change, one restart of ours."""
    changes = (*scenario.CHANGES, scenario.FINISH)
    cut = scenario.RESTART_AFTER
    return Plan("", scenario.captured(), (changes[:cut], changes[cut:]), scenario.SENTINEL)


def modes_plan() -> Plan:
    """The columns the non-default modes change, with those modes on both sides."""
    return Plan(
        "m",
        scenario.modes_captured(),
        (scenario.MODES_CHANGES,),
        scenario.MODES_SENTINEL,
        scenario.MODES_DEBEZIUM,
        scenario.MODES_OURS,
    )


def build_database(env: BenchEnv) -> None:
    """Create the tables of both captures and their first rows."""
    env.create_database()
    with env.connect() as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET TimeZone = {}").format(
                sql.Identifier(env.database), sql.Literal(scenario.TIME_ZONE)
            )
        )
    with env.connect() as conn:
        for stmt in (*scenario.SETUP, *scenario.GOLDEN_SETUP):
            conn.execute(stmt)
        for table in (*scenario.TABLES, *scenario.MODES_TABLES):
            for stmt in table.ddl:
                conn.execute(stmt)
            for stmt in table.rows:
                conn.execute(stmt)


def count_rows(env: BenchEnv, tables: list[str]) -> int:
    """How many rows a snapshot of ``tables`` reads."""
    total = 0
    with env.connect() as conn:
        for t in tables:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*t.split(".", 1)))
            ).fetchone()
            total += int(row[0]) if row else 0
    return total


def apply_changes(env: BenchEnv, changes: tuple[tuple[str, ...], ...]) -> None:
    """The streamed changes, one transaction each."""
    with psycopg.connect(env.dsn) as conn:
        for txn in changes:
            with conn.transaction():
                for stmt in txn:
                    conn.execute(stmt)


def our_reader(env: BenchEnv, plan: Plan) -> ReaderEnv:
    """Our reader on this run's database, set up to write what Debezium writes."""
    names = env.names_for("ours" + plan.role)
    extra = {
        "CDC_POSTGRES__TABLES": orjson.dumps(plan.tables).decode(),
        # Debezium's TOAST behaviour: the placeholder, never a read by key.
        "CDC_POSTGRES__COMPLETE_UNCHANGED_TOAST": "false",
        "CDC_POSTGRES__SKIPPED_OPERATIONS": "none",  # Debezium is set the same way
        # Debezium Server writes its headers with JsonConverter (debezium.format.header=json);
        # our default is Kafka Connect's SimpleHeaderConverter form (the Connect sink test).
        "CDC_SCHEMA__HEADER_FORMAT": "json",
        **plan.ours,
    }
    return ReaderEnv(env.dsn, env.bootstrap, names.prefix, names.slot, extra)


def _run_reader(ours: ReaderEnv, errors: list[str]) -> None:
    done = ours.run("run", "--until", "current")
    if done.returncode != 0:
        errors.append(f"cdc run exited {done.returncode}:\n{done.stderr[-3000:]}")


def _wait(what: str, done: Callable[[], bool], timeout_s: float, dbz: ParityDebezium) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout_s:.0f}s; Debezium:\n{dbz.log_tail(30)}")
        time.sleep(0.5)


def _end_offsets(env: BenchEnv, topics: list[str]) -> int:
    from tests.integration.reader_support import end_offset

    return sum(end_offset(env.bootstrap, t) for t in topics)


def _wal_position(env: BenchEnv) -> int:
    with env.connect() as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def run_plan(env: BenchEnv, plan: Plan) -> Captured:
    """Both systems over one plan's tables: the same snapshot, the same changes."""
    timings: dict[str, float] = {}
    errors: list[str] = []
    restarts: list[int] = []
    t0 = time.monotonic()
    snapshot_rows = count_rows(env, plan.tables)
    dbz = ParityDebezium(env, plan.tables, role="dbz" + plan.role, extra=plan.debezium)
    reason = dbz.available()
    if reason:
        raise RuntimeError(f"Debezium Server cannot run: {reason}")
    dbz.prepare()
    ours = our_reader(env, plan)
    server = dbz.launch()
    try:
        _run_reader(ours, errors)  # the snapshot, while the JVM starts
        timings["our_snapshot_s"] = time.monotonic() - t0
        dbz_topics = [dbz.topic(t) for t in plan.tables]
        _wait(
            "Debezium's snapshot did not reach Kafka",
            lambda: server.running() and _end_offsets(env, dbz_topics) >= snapshot_rows,
            DEBEZIUM_START_TIMEOUT_S,
            dbz,
        )
        timings["debezium_snapshot_s"] = time.monotonic() - t0
        for i, phase in enumerate(plan.phases):
            if i:
                restarts.append(_wal_position(env))
            apply_changes(env, phase)
            _run_reader(ours, errors)
        timings["our_stream_s"] = time.monotonic() - t0
        sentinel = dbz.topic(".".join(plan.sentinel))
        _wait(
            "Debezium did not stream the changes",
            lambda: _end_offsets(env, [sentinel]) >= 1,
            DEBEZIUM_STREAM_TIMEOUT_S,
            dbz,
        )
        timings["debezium_stream_s"] = time.monotonic() - t0
    finally:
        dbz.finish(server)
    wanted = {table_topic(ours.prefix, *t.split(".", 1)) for t in plan.tables}
    wanted.add(truncate_topic(ours.prefix))
    our_topics = [t for t in topics_with_prefix(env.bootstrap, ours.prefix) if t in wanted]
    return Captured(
        debezium=read_topics(env.bootstrap, topics_with_prefix(env.bootstrap, dbz.prefix)),
        ours=read_topics(env.bootstrap, our_topics),
        debezium_prefix=dbz.prefix,
        our_prefix=ours.prefix,
        database=env.database,
        timings=timings,
        reader_errors=errors,
        restarts=restarts,
        tables=plan.tables,
    )


def capture(env: BenchEnv, *, modes: bool = True) -> Captured:
    """Run both systems over the scenario, then (``modes``) over the modes' tables with the
    non-default modes; ``env`` is cleaned up by the caller."""
    build_database(env)
    with env.connect() as conn:
        golden_base = describe(conn, "all_types", scenario.GOLDEN_SCHEMA)
    got = run_plan(env, main_plan())
    got.golden_base = golden_base
    if modes:
        got.modes = run_plan(env, modes_plan())
    return got


def _dump(got: Captured, out: Path, tag: str) -> None:
    for side, records in (("debezium", got.debezium), ("ours", got.ours)):
        with open(out / f"{side}{tag}.jsonl", "wb") as f:
            for r in records:
                f.write(
                    orjson.dumps(
                        {
                            "topic": r.topic,
                            "offset": r.offset,
                            "key": r.key_json(),
                            "value": r.value_json(),
                            "headers": [
                                (k, None if v is None else v.decode("utf-8", "replace"))
                                for k, v in r.headers
                            ],
                        }
                    )
                    + b"\n"
                )


def main(out: Path) -> None:
    """Capture once and dump both sides' records as JSON lines (for a look by hand)."""
    logging.basicConfig(level=logging.INFO)
    env = BenchEnv(out_dir=out)
    try:
        got = capture(env)
        _dump(got, out, "")
        if got.modes is not None:
            _dump(got.modes, out, "-modes")
        (out / "captured.pickle").write_bytes(pickle.dumps(got))
        print(got.timings, len(got.debezium), len(got.ours), *got.reader_errors)
    finally:
        print(env.cleanup())


if __name__ == "__main__":
    import sys

    main(Path(sys.argv[1]))
