"""Keys and TRUNCATE on a real database (issue 10, acceptance cases 1, 2, 3 and 5).

One database holds the tables of every case (:mod:`.keys_catalog`). The reader (base64
binary mode, ``complete_unchanged_toast`` false, Debezium's ``t`` events on) snapshots it and
streams the changes (truncates in every form, keyless tables, a replica identity index,
updates that leave TOASTed values alone); then ``r_bigint``'s key becomes bigint and the
reader takes a new snapshot (``cdc reset-state --drop-slot``, ``cdc run --until current``);
then a second one with ``schemas_enable`` switched off (of the tables whose values need no
schema, r_bigint aside so the followers show the first one's outcome). Both jobs run once,
in micro-batches of a few hundred records (so rows are written, then truncated), beside a
brand-new follower built from offset 0 in one pass. Readers of other binary modes and
``complete_unchanged_toast`` values run on the TOAST tables.

- 1: every truncated table equals the database in both followers, in the rebuilt follower
  and in the topics as compaction leaves them (the newest record of each key).
- 2: keyless tables (no key; REPLICA IDENTITY FULL without a key) run to the end on topics
  that are not compacted; a table keyed by its identity index (not its primary key) and one
  keyed by ``message_key_columns`` equal the database.
- 3: no follower row that exists is deleted by either new snapshot.
- 5: a TOASTed primary key and TOASTed numeric, int[], jsonb, bytea and text values left
  alone by updates: in every binary handling mode, with ``complete_unchanged_toast`` true
  and false, the reader never puts the placeholder in a key, names the unchanged columns in
  the ``cdc.unchanged`` header and types the placeholders; the followers equal the database
  and never hold a placeholder (base64; the slow test adds bytes and hex).

The slow test truncates a table of 500,000 rows and counts the Python objects its scan of
the live keys holds.
"""

from __future__ import annotations

import base64
import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from cdc.live_keys import keys_live_before
from pgcdc.core.contract import (
    HEADER_UNCHANGED,
    UNAVAILABLE_VALUE_PLACEHOLDER,
    decode_unchanged_header,
    truncate_topic,
)
from pgcdc.core.settings import KafkaSettings
from tests.conftest import Endpoints
from tests.integration.reader_support import Record, read_topic
from tests.integration.real_databases import keys_catalog as kc
from tests.integration.real_databases.keys_support import (
    PLACEHOLDER_FORMS,
    cleanup_policy,
    drop_heartbeats,
    finish,
    follower_problems,
    live_ids,
    reset_state,
    run_jobs_together,
    start_reader,
    tombstone_and_row_versions,
    variant,
)
from tests.integration.real_databases.support import (
    Pipeline,
    Table,
    assert_followers_equal,
    fresh_pipeline,
    leader_rows,
)

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.spark]

MODES = ("bytes", "base64", "hex")
MAIN = ("base64", False)  # the main pipeline's binary mode and complete_unchanged_toast
MAIN_ENV = {
    "CDC_POSTGRES__MESSAGE_KEY_COLUMNS": kc.MESSAGE_KEY_COLUMNS,
    "CDC_POSTGRES__SKIPPED_OPERATIONS": "none",  # Debezium's t events too
    "CDC_POSTGRES__COMPLETE_UNCHANGED_TOAST": "false",
}
MAIN_SCHEMA = {"binary_handling_mode": "base64"}
MAX_OFFSETS_PER_TRIGGER = "1000"


# --- the module's database, run once -------------------------------------------------------


@dataclasses.dataclass
class World:
    p: Pipeline
    rebuilt: Pipeline
    variants: dict[tuple[str, bool], Pipeline]  # reader-only pipelines of the other modes
    first_run_log: str


@pytest.fixture(scope="module")
def world(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    work = tmp_path_factory.mktemp("keys_truncate")
    with fresh_pipeline(endpoints, work, "rdbk") as p:
        variants = {
            (m, c): variant(p, f"_{m}{int(c)}")
            for m in MODES
            for c in (True, False)
            if (m, c) != MAIN
        }
        try:
            yield _build(p, variants, work)
        finally:
            drop_heartbeats(endpoints, variants.values())


def _main_reader(
    p: Pipeline, work: Path, tables: list[Table], **schema: Any
) -> subprocess.Popen[str]:
    env = {**MAIN_ENV, "CDC_POSTGRES__TABLES": kc.table_list(tables)}
    return start_reader(p, work, {**MAIN_SCHEMA, **schema}, **env)


def _variant_reader(v: Pipeline, mode: str, complete: bool, work: Path) -> subprocess.Popen[str]:
    return start_reader(
        v,
        work,
        {"binary_handling_mode": mode},
        CDC_POSTGRES__TABLES=kc.table_list(kc.TOASTED),
        CDC_POSTGRES__COMPLETE_UNCHANGED_TOAST=str(complete).lower(),
    )


def _build(p: Pipeline, variants: dict[tuple[str, bool], Pipeline], work: Path) -> World:
    started = time.monotonic()

    def phase(name: str) -> None:
        print(f"{name}: {time.monotonic() - started:.0f}s")

    with psycopg.connect(p.dsn, autocommit=True) as conn:
        kc.create(conn)
    readers = [_main_reader(p, work, kc.ALL)]
    readers += [_variant_reader(v, m, c, work) for (m, c), v in variants.items()]
    first_run_log = finish(*readers)[0]  # snapshots
    with psycopg.connect(p.dsn, autocommit=True) as conn:
        kc.stream_changes(conn)
    readers = [_main_reader(p, work, kc.ALL)]
    readers += [_variant_reader(v, m, c, work) for (m, c), v in variants.items()]
    finish(*readers)  # the changes, streamed
    phase("snapshot and stream")
    # Case 3: the key column becomes bigint, then a new snapshot of everything...
    with psycopg.connect(p.dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE r_bigint ALTER COLUMN id TYPE bigint")
    reset_state(p)
    finish(_main_reader(p, work, kc.ALL))
    # ... and another one, schemas_enable switched off.
    reset_state(p)
    finish(_main_reader(p, work, kc.SCHEMALESS, schemas_enable=False))
    phase("new snapshots")
    rebuilt = p.with_follower("_rebuilt")
    run_jobs_together(
        [
            (p, work / "jobs", ("--max-offsets-per-trigger", MAX_OFFSETS_PER_TRIGGER)),
            (rebuilt, work / "jobs-rebuilt", ()),
        ]
    )
    phase("jobs")
    return World(p, rebuilt, variants, first_run_log)


# -- case 1 ---------------------------------------------------------------------------------


def test_case1_the_followers_equal_every_truncated_table(world: World) -> None:
    """TRUNCATE stopped the reader for good ("Broker failed to validate record"): the t event
    had no key. Now every form reaches both followers."""
    ids = {t.name: set(leader_rows(world.p.dsn, t)) for t in kc.TRUNCATED}
    assert ids["t_single"] == {str(i) for i in range(45, 56)}
    assert ids["t_pair_a"] == {"3"} and ids["t_parent"] == {"1"}
    assert ids["t_ident"] == {"1", "2", "3", "4", "5"}  # RESTART IDENTITY reused the keys
    assert ids["t_txn"] == {"7", "2000"}  # before it in its transaction: gone; after: kept
    assert not ids["t_pair_b"] and not ids["t_child"]  # CASCADE
    for t in kc.TRUNCATED:
        assert_followers_equal(world.p, [t], allow_empty=t in kc.EMPTY_AFTER)


def test_case1_a_follower_rebuilt_from_offset_0_equals_the_database(world: World) -> None:
    for t in [*kc.TRUNCATED, *kc.KEYED, *kc.RESNAPSHOT]:
        assert_followers_equal(world.rebuilt, [t], allow_empty=t in kc.EMPTY_AFTER)
    for t in kc.TOASTED:
        assert follower_problems(world.rebuilt, t) == [], t.name


def test_case1_the_compacted_topics_hold_exactly_the_live_rows(world: World) -> None:
    """What compaction keeps (each key's newest record) names exactly the table's rows, each
    under one key form: a re-snapshot's old key bytes are tombstoned."""
    p = world.p
    for t in [*kc.TRUNCATED, *kc.KEYED, *kc.RESNAPSHOT, *kc.TOASTED]:
        live = live_ids(read_topic(p.endpoints.kafka_bootstrap, t.topic(p.name)))
        assert sorted(live) == sorted(leader_rows(p.dsn, t)), t.name


def test_case1_debeziums_t_events_go_to_the_truncate_topic(world: World) -> None:
    p = world.p
    records = read_topic(p.endpoints.kafka_bootstrap, truncate_topic(p.name))
    truncated = sorted(orjson.loads(r.key or b"")["payload"] for r in records)
    assert truncated == sorted(
        f"public.{n}"
        for n in ("t_single", "t_pair_a", "t_pair_b", "t_parent", "t_child", "t_ident", "t_txn")
    )
    assert all(r.payload and r.payload["op"] == "t" for r in records)
    assert cleanup_policy(p, truncate_topic(p.name)) == "delete"


# -- case 2 ---------------------------------------------------------------------------------


def test_case2_keyless_tables_run_to_the_end_on_topics_that_keep_null_keys(world: World) -> None:
    """A table without a primary key stopped the reader during the snapshot ("Broker failed
    to validate record"). Now its events, null keys and all, go to a non-compacted topic."""
    p = world.p
    ops = {}
    for t in kc.KEYLESS:
        topic = t.topic(p.name)
        assert cleanup_policy(p, topic) == "delete"
        records = read_topic(p.endpoints.kafka_bootstrap, topic)
        assert all(r.key is None for r in records)
        ops[t.name] = [r.payload["op"] if r.payload else None for r in records]
        # One warning per keyless table, naming it and the setting that keys it.
        lines = [
            ln for ln in world.first_run_log.splitlines() if f"table public.{t.name} has no" in ln
        ]
        assert len(lines) == 1 and "CDC_POSTGRES__MESSAGE_KEY_COLUMNS" in lines[0]
    # Snapshot, stream, then the first new snapshot (a keyless topic keeps every copy).
    assert ops["k_log"] == ["r"] * 10 + ["c"] + ["r"] * 11
    assert ops["k_full"] == ["r"] * 10 + ["u"] * 3 + ["d", None] * 2 + ["r"] * 8


def test_case2_an_identity_index_and_message_key_columns_key_their_tables(world: World) -> None:
    """With REPLICA IDENTITY USING INDEX (email) every delete failed for ever ("a key column
    is null"). Now the index keys the table, as deletes carry only it."""
    assert_followers_equal(world.p, kc.KEYED)
    p = world.p
    for t in kc.KEYED:
        records = read_topic(p.endpoints.kafka_bootstrap, t.topic(p.name))
        keys = [orjson.loads(r.key or b"{}") for r in records]
        fields = {tuple(k.get("payload", k)) for k in keys}
        assert fields == {t.key}, (t.name, fields)


def test_case2_what_cannot_be_carried_stops_at_start_with_one_line(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    """A message_key_columns entry the old rows cannot carry, and a keyless table whose topic
    exists compacted, each stop the run before anything is read, with one line naming the
    table and the setting; a table that joined the publication while the reader was stopped
    is named in one warning."""
    with fresh_pipeline(endpoints, tmp_path, "rdbs") as p:
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE keyed (id int PRIMARY KEY, code text NOT NULL)")
            conn.execute("INSERT INTO keyed VALUES (1, 'a')")
        bad = start_reader(p, tmp_path, {}, CDC_POSTGRES__MESSAGE_KEY_COLUMNS="public\\.keyed:code")
        _, err = bad.communicate(timeout=300)
        assert bad.returncode != 0
        [line] = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert "public.keyed" in line and "CDC_POSTGRES__MESSAGE_KEY_COLUMNS" in line, line
        finish(start_reader(p, tmp_path, {}))
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE joined (id int PRIMARY KEY)")
            conn.execute("INSERT INTO joined VALUES (1)")
            conn.execute("ALTER TABLE keyed DROP CONSTRAINT keyed_pkey")  # keyless now
        bad = start_reader(p, tmp_path, {})
        _, err = bad.communicate(timeout=300)
        assert bad.returncode != 0
        [line] = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert "public.keyed has no key" in line and "compacted" in line, line
        assert "CDC_POSTGRES__MESSAGE_KEY_COLUMNS" in line
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE keyed ADD PRIMARY KEY (id)")
        log = finish(start_reader(p, tmp_path, {}))[0]
        warned = [ln for ln in log.splitlines() if "public.joined joined the captured" in ln]
        # postgres.snapshot_new_tables (on by default) snapshots it incrementally (issue 11).
        assert len(warned) == 1 and "snapshotted incrementally" in warned[0]
        assert "incremental snapshot of public.joined complete: 1 rows" in log


# -- case 3 ---------------------------------------------------------------------------------


def test_case3_a_snapshot_after_int_to_bigint_deletes_no_row(world: World) -> None:
    """Every old key looked stale by its bytes (its schema said int32) and got a tombstone
    after its new row: the followers deleted every row. Now the old bytes' tombstone comes
    first, and the followers keep every row."""
    assert len(leader_rows(world.p.dsn, kc.R_BIGINT)) == kc.RESNAPSHOT_ROWS
    assert_followers_equal(world.p, [kc.R_BIGINT])
    pairs = tombstone_and_row_versions(world.p, kc.R_BIGINT, kc.RESNAPSHOT_ROWS)
    # A lower LSN, not only a lower order: OpenSearch compares the LSN alone.
    assert all(tombstone[0] < row[0] for tombstone, row in pairs)


def test_case3_a_snapshot_with_schemas_enable_switched_deletes_no_row(world: World) -> None:
    assert len(leader_rows(world.p.dsn, kc.R_SWITCH)) == kc.RESNAPSHOT_ROWS
    for t in kc.SCHEMALESS:
        assert_followers_equal(world.p, [t], allow_empty=t in kc.EMPTY_AFTER)
    pairs = tombstone_and_row_versions(world.p, kc.R_SWITCH, kc.RESNAPSHOT_ROWS)
    # A lower LSN, not only a lower order: OpenSearch compares the LSN alone.
    assert all(tombstone[0] < row[0] for tombstone, row in pairs)


# -- case 5 ---------------------------------------------------------------------------------


def test_case5_the_followers_hold_every_toasted_value(world: World) -> None:
    """An unchanged TOASTed primary key became a key change to the placeholder (the real row
    deleted); numeric and int[] placeholders were null. Now the followers equal the database
    and hold no placeholder (base64, complete_unchanged_toast false)."""
    for t in kc.TOASTED:
        assert follower_problems(world.p, t) == [], t.name


def _updates(records: list[Record]) -> list[Record]:
    return [r for r in records if r.payload is not None and r.payload["op"] == "u"]


@pytest.mark.parametrize("complete", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_case5_the_reader_types_and_names_the_unchanged_values(
    world: World, mode: str, complete: bool
) -> None:
    v = world.variants.get((mode, complete), world.p)
    bootstrap = v.endpoints.kafka_bootstrap
    keyed = read_topic(bootstrap, kc.TOAST_KEY.topic(v.name))
    assert {r.payload["op"] for r in keyed if r.payload} == {"r", "u"}  # no key change
    big = [r for r in _updates(keyed) if orjson.loads(r.key or b"")["payload"]["id"] == kc.BIG_KEY]
    assert len(big) == 1 and big[0].payload and big[0].payload["after"]["id"] == kc.BIG_KEY
    updates = _updates(read_topic(bootstrap, kc.TOAST_TYPES.topic(v.name)))
    assert len(updates) == 4 + 1
    for r in updates:
        assert r.payload is not None
        after = r.payload["after"]
        named = decode_unchanged_header(dict(r.headers).get(HEADER_UNCHANGED))
        if complete:  # the values were read by key: whole rows, no placeholder
            assert not named and not PLACEHOLDER_FORMS & set(map(str, after.values()))
            continue
        changed = {"txt"} if after["txt"] == "changed" else set()
        assert named == set(kc.TOAST_COLUMNS) - changed
        assert after["n"] is None and after["ints"] is None  # no room: null, named
        assert after["doc"] == UNAVAILABLE_VALUE_PLACEHOLDER
        assert base64.b64decode(after["n_fixed"]) == UNAVAILABLE_VALUE_PLACEHOLDER.encode()
        expected_b = {
            "bytes": base64.b64encode(UNAVAILABLE_VALUE_PLACEHOLDER.encode()).decode(),
            "base64": base64.b64encode(UNAVAILABLE_VALUE_PLACEHOLDER.encode()).decode(),
            "hex": UNAVAILABLE_VALUE_PLACEHOLDER.encode().hex(),
        }[mode]
        assert after["b"] == expected_b


@pytest.mark.slow
def test_case5_the_followers_hold_every_toasted_value_in_the_other_binary_modes(
    world: World,
) -> None:
    """The placeholder in hex was not recognised by the followers; with the cdc.unchanged
    header, no mode lets it through."""
    others = [(m, False) for m in MODES if (m, False) != MAIN]
    work = world.p.checkpoint_dir.parent
    run_jobs_together([(world.variants[o], work / f"jobs-{o[0]}", ()) for o in others])
    for mode, complete in others:
        v = world.variants[(mode, complete)]
        for t in kc.TOASTED:
            assert follower_problems(v, t, binary_mode=mode) == [], v.name


# -- half a million rows ----------------------------------------------------------------------

# Enough to tell keys on disk from keys in Python: a key held in Python is a block at least,
# so holding them would pass the bound below by 200,000 (a million before: the same proof at
# twice the time).
ROWS = 500_000
# Python objects that a truncate's scan of 500,000 live keys may add at any point, in
# blocks (sys.getallocatedblocks): one consume batch of 10,000 records with their headers
# (measured: 118,530) and room; the keys themselves would be 500,000 (a bytes object each).
LIVE_KEYS_PYTHON_BLOCKS = 300_000
AFTER_EVERYTHING = (2**64, 0)  # a truncate version no record is newer than


class BlocksPeak:
    """The most Python blocks allocated beyond those at creation, sampled at each call (the
    scan calls its tick every 4,096 records)."""

    def __init__(self) -> None:
        self.base = sys.getallocatedblocks()
        self.peak = 0
        self.samples = 0

    def __call__(self) -> None:
        self.samples += 1
        self.peak = max(self.peak, sys.getallocatedblocks() - self.base)


@pytest.mark.slow
def test_truncating_half_a_million_rows_keeps_their_keys_out_of_memory(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    """The live keys of a truncated table are kept on disk (SQLite), not in Python: the
    truncate's scan of a topic of 500,000 keys, then a walk over all of them, never holds
    more than 300,000 Python blocks beyond where it began (counted, so the same on a busy
    machine: the reader's RSS was not, two identical snapshots of these rows peaking at 141
    and 267 MiB); then the reader truncates them all and only the row inserted after lives."""
    with fresh_pipeline(endpoints, tmp_path, "rdbm") as p:
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO big SELECT g, 'v' FROM generate_series(1, {ROWS}) g")
        finish(start_reader(p, tmp_path, {"schemas_enable": False}), timeout=900)
        topic = Table("public", "big").topic(p.name)
        kafka = KafkaSettings(bootstrap_servers=p.endpoints.kafka_bootstrap)
        blocks = BlocksPeak()
        with keys_live_before(kafka, topic, AFTER_EVERYTHING, tick=blocks) as live:
            walked = 0
            for _ in live:
                walked += 1
                if not walked & 0xFFF:
                    blocks()
            counted = len(live)
        print(f"live keys: {walked}, at most {blocks.peak} more Python blocks")
        assert walked == counted == ROWS
        assert blocks.samples >= 2 * ROWS // 4096  # sampled through the scan and the walk
        assert blocks.peak < LIVE_KEYS_PYTHON_BLOCKS
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE big")
            conn.execute("INSERT INTO big VALUES (1, 'after')")
        log = finish(start_reader(p, tmp_path, {"schemas_enable": False}), timeout=900)[0]
        assert f"truncate: {ROWS} keys deleted" in log
        with keys_live_before(kafka, topic, AFTER_EVERYTHING) as live:
            assert [orjson.loads(k) for k in live] == [{"id": 1}]
