"""Helpers for the reader's integration tests: run ``cdc`` as a subprocess, read topics back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from benchmarks.workload import Change, Workload

ROOT = Path(__file__).resolve().parents[2]
# On PYTHONPATH with PGCDC_KILL_AT set, a reader kills itself at a point of its Kafka
# transactions (eos_kill/sitecustomize.py).
KILLER = Path(__file__).resolve().parent / "eos_kill"

__all__ = [
    "Change",
    "ReaderEnv",
    "Record",
    "Workload",
    "end_offset",
    "read_topic",
    "reduce_latest",
    "slot_row",
]


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    commit_lsn: int
    order: int
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def payload(self) -> dict[str, Any] | None:
        if self.value is None:
            return None
        d: dict[str, Any] = orjson.loads(self.value)
        return d.get("payload", d)

    @property
    def key_id(self) -> Any:
        assert self.key is not None
        d: dict[str, Any] = orjson.loads(self.key)
        return d.get("payload", d)["id"]


@dataclass
class ReaderEnv:
    """Environment for a ``cdc`` subprocess against one test's own resources."""

    dsn: str
    bootstrap: str
    prefix: str
    slot: str
    extra: dict[str, str] | None = None

    def env(self, **more: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
        env.update(
            CDC_POSTGRES__DSN=self.dsn,
            CDC_POSTGRES__SLOT_NAME=self.slot,
            CDC_POSTGRES__PUBLICATION_NAME=self.slot,
            CDC_KAFKA__BOOTSTRAP_SERVERS=self.bootstrap,
            CDC_KAFKA__TOPIC_PREFIX=self.prefix,
            # These tests read a table's events back in commit order: one partition (a test
            # that wants more passes CDC_KAFKA__PARTITIONS).
            CDC_KAFKA__PARTITIONS="1",
            # Under the test's prefix, so the topic_prefix fixture deletes it too.
            CDC_KAFKA__HEARTBEAT_TOPIC=f"{self.prefix}.heartbeat",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra or {})
        env.update(more)
        return env

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "cdc", *args]

    def run(
        self, *args: str, timeout: float = 300, **more: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(*args),
            env=self.env(**more),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def catch_up(self, timeout: float = 300, **more: str) -> subprocess.CompletedProcess[str]:
        """``cdc run --until current``; fails the test unless it exits 0."""
        done = self.run("run", "--until", "current", timeout=timeout, **more)
        assert done.returncode == 0, f"cdc run failed ({done.returncode}):\n{done.stderr[-3000:]}"
        return done

    def start(self, *args: str, log_path: Path, **more: str) -> subprocess.Popen[bytes]:
        """``cdc run`` in the background; its output is appended to ``log_path``.

        A file, not a pipe: nobody has to drain it, and a test never blocks reading it.
        """
        with open(log_path, "ab") as out:
            return subprocess.Popen(
                self.cmd("run", *args),
                env=self.env(**more),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )


def end_offset(bootstrap: str, topic: str) -> int:
    """Sum of the topic's partitions' end offsets; 0 while the topic does not exist."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-tests-ends"})
    try:
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return 0
        return sum(
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions
        )
    except KafkaException:  # a new topic whose leader is not elected yet: nothing in it
        return 0
    finally:
        c.close()


def slot_row(dsn: str, slot: str) -> tuple[bool, int | None] | None:
    """(active, confirmed_flush_lsn as a number) of the slot, or None if it does not exist."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT active, confirmed_flush_lsn - '0/0' FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    if row is None:
        return None
    return bool(row[0]), None if row[1] is None else int(row[1])


def read_topic(bootstrap: str, topic: str, timeout: float = 120) -> list[Record]:
    """Every record of ``topic`` from offset 0 up to its end offsets at call time."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "reader-tests",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        ends = {}
        for p in md.partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
        out: list[Record] = []
        if not ends:
            return out
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(ends):
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for m in c.consume(10_000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                        continue
                    raise AssertionError(str(err))
                h = dict(m.headers() or [])
                out.append(
                    Record(
                        m.partition(),
                        m.offset(),
                        m.key(),
                        m.value(),
                        int(h["cdc.commit_lsn"]),
                        int(h["cdc.order"]),
                        tuple(m.headers() or ()),
                    )
                )
                if m.offset() + 1 >= ends[m.partition()]:
                    done.add(m.partition())
        out.sort(key=lambda r: (r.partition, r.offset))
        return out
    finally:
        c.close()


def reduce_latest(records: list[Record]) -> dict[Any, dict[str, Any] | None]:
    """Latest state per key id: the ``after`` image, or None after a delete/tombstone."""
    state: dict[Any, dict[str, Any] | None] = {}
    for r in records:
        if r.key is None:
            continue
        p = r.payload
        state[r.key_id] = None if p is None or p["op"] == "d" else p["after"]
    return state


def table_rows(dsn: str, table: str = "items") -> dict[int, dict[str, Any]]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return {r["id"]: dict(r) for r in conn.execute(f"SELECT * FROM {table}")}


def assert_topic_equals_table(records: list[Record], dsn: str, table: str = "items") -> None:
    """Reduce the topic to the latest event per key; it must equal the table, value by value."""
    state = {k: v for k, v in reduce_latest(records).items() if v is not None}
    rows = table_rows(dsn, table)
    missing = rows.keys() - state.keys()
    extra = state.keys() - rows.keys()
    assert not missing, f"{len(missing)} rows never reached Kafka, e.g. {sorted(missing)[:5]}"
    assert not extra, (
        f"{len(extra)} keys live in Kafka but not in the table, e.g. {sorted(extra)[:5]}"
    )
    diff = [k for k, row in rows.items() if state[k] != row]
    assert not diff, f"{len(diff)} rows differ, e.g. {diff[0]}: {state[diff[0]]} != {rows[diff[0]]}"


def assert_key_order(records: list[Record]) -> None:
    """Per key, events appear in (commit LSN, order) order.

    After a crash the reader replays from its last acknowledged position, so a key may go
    back, but only to a record it already had (a duplicate, never an unseen older change).
    """
    last: dict[tuple[int, bytes], tuple[int, int]] = {}
    seen: dict[tuple[int, bytes], set[tuple[int, int]]] = {}
    for r in records:
        if r.key is None:
            continue
        k = (r.partition, r.key)
        v = (r.commit_lsn, r.order)
        had = seen.setdefault(k, set())
        assert k not in last or last[k] <= v or v in had, (
            f"key {r.key!r} went back from {last[k]} to {v}, a record it never had"
        )
        last[k] = v
        had.add(v)


def assert_no_change_missing(records: list[Record], log: list[Change]) -> None:
    """Every committed change after a writer's first streamed one reached Kafka.

    A writer commits serially, so once one of its changes is in the stream (after the
    consistent point) all later ones are too; earlier ones may have been folded into the
    snapshot, which the table comparison checks.
    """
    streamed: set[str] = set()
    for r in records:
        p = r.payload
        if p is not None and p["op"] in ("c", "u") and p["source"]["snapshot"] == "false":
            streamed.add(p["after"]["marker"])
    by_writer: dict[int, list[Change]] = {}
    for c in log:
        if c.marker is not None:
            by_writer.setdefault(c.writer, []).append(c)
    checked = 0
    for changes in by_writer.values():
        changes.sort(key=lambda c: c.seq)
        first = next((i for i, c in enumerate(changes) if c.marker in streamed), None)
        if first is None:
            continue
        lost = [c for c in changes[first:] if c.marker not in streamed]
        assert not lost, f"{len(lost)} committed changes missing from Kafka, e.g. {lost[0]}"
        checked += len(changes) - first
    assert checked > 0, (
        f"no streamed change to check: {len(streamed)} change events in the topic, none of "
        f"them one of the {len(log)} changes the writers committed"
    )


def force_compaction(bootstrap: str, topics: list[str]) -> None:
    """Topic settings under which the cleaner compacts every rolled segment at once."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100",
        "min.compaction.lag.ms": "0",
    }
    resources = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in configs.items()
            ],
        )
        for topic in topics
    ]
    for fut in admin.incremental_alter_configs(resources).values():
        fut.result(30)
