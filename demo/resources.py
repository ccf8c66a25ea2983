"""The demo's own names on every server, and removing what a previous run left behind.

The demo never touches anything outside these names: database ``demo``, slot ``demo_slot``,
publication ``demo_pub``, topics ``demo.*`` and the heartbeat topic of prefix ``demo``, indices
``demo-*``, Redis keys ``demo:*``, and ``.stack/demo/`` for checkpoints, logs and the ids of
its child processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg
import redis
from confluent_kafka.admin import AdminClient
from opensearchpy import OpenSearch
from psycopg import sql
from psycopg.conninfo import make_conninfo

from demo.processes import ROOT
from pgcdc.core.contract import heartbeat_topic
from pgcdc.core.ports import READER_PASSWORD, READER_ROLE
from pgcdc.core.settings import KafkaSettings


@dataclass(frozen=True)
class DemoNames:
    """Where the demo's data lives, on the local stack given by ``admin_dsn`` etc."""

    admin_dsn: str  # a superuser connection to another database, to create/drop ``demo``
    kafka_bootstrap: str
    redis_url: str
    search_url: str
    database: str = "demo"
    slot: str = "demo_slot"
    publication: str = "demo_pub"
    topic_prefix: str = "demo"
    index_prefix: str = "demo"
    key_prefix: str = "demo"
    home: Path = ROOT / ".stack" / "demo"

    @property
    def dsn(self) -> str:
        return make_conninfo(self.admin_dsn, dbname=self.database)

    @property
    def reader_dsn(self) -> str:
        """The reader's connection: the least-privilege role (:func:`grant_reader`)."""
        return make_conninfo(self.dsn, user=READER_ROLE, password=READER_PASSWORD)

    @property
    def checkpoint_dir(self) -> Path:
        return self.home / "checkpoints"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def pid_file(self) -> Path:
        return self.home / "pids.json"

    def env(self) -> dict[str, str]:
        """The environment for the reader and the jobs: every ``CDC_*`` setting they use."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
        env.update(
            # The reader runs as the least-privilege role, on the publication the tables'
            # owner made (grant_reader), as docs/own-postgres.md advises for a real database.
            CDC_POSTGRES__DSN=self.reader_dsn,
            CDC_POSTGRES__SLOT_NAME=self.slot,
            CDC_POSTGRES__PUBLICATION_NAME=self.publication,
            CDC_POSTGRES__PUBLICATION_AUTOCREATE_MODE="disabled",
            CDC_KAFKA__BOOTSTRAP_SERVERS=self.kafka_bootstrap,
            CDC_KAFKA__TOPIC_PREFIX=self.topic_prefix,
            CDC_KAFKA__DEAD_LETTER_TOPIC=f"{self.topic_prefix}.dlq",
            # The reader's heartbeats carry its acknowledged LSN; the jobs record the newest
            # one they applied as their watermark. Once a second, for a lively screen.
            CDC_KAFKA__HEARTBEAT_TOPIC=self.heartbeat_topic,
            CDC_POSTGRES__STATUS_INTERVAL_S="1",
            CDC_REDIS__URL=self.redis_url,
            CDC_REDIS__KEY_PREFIX=self.key_prefix,
            CDC_SEARCH__URL=self.search_url,
            CDC_SEARCH__INDEX_PREFIX=self.index_prefix,
            CDC_SPARK__CHECKPOINT_DIR=str(self.checkpoint_dir),
        )
        return env

    @property
    def heartbeat_topic(self) -> str:
        """The reader's default heartbeat topic for the demo's prefix (the jobs expect it)."""
        topic = heartbeat_topic(KafkaSettings(topic_prefix=self.topic_prefix))
        assert topic is not None  # heartbeats are on by default
        return topic


def grant_reader(names: DemoNames) -> None:
    """What the reader's least-privilege role needs, made by the superuser and tables'
    owner: the role (LOGIN REPLICATION, once per server), the publication of every table,
    and SELECT on them (docs/own-postgres.md, "The role: least privilege")."""
    role = sql.Identifier(READER_ROLE)
    with psycopg.connect(names.dsn, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (READER_ROLE,)
        ).fetchone()
        if exists is None:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                    role, sql.Literal(READER_PASSWORD)
                )
            )
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(
                sql.Identifier(names.publication)
            )
        )
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(role))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(role))


def remember_pids(names: DemoNames, pids: list[int]) -> None:
    """Note the child process groups, so a demo killed hard can be cleaned up next time."""
    names.home.mkdir(parents=True, exist_ok=True)
    names.pid_file.write_text(json.dumps(pids))


def _stop_leftover_children(names: DemoNames) -> list[str]:
    """End the process groups a previous demo started, if they still run our commands."""
    done: list[str] = []
    if not names.pid_file.exists():
        return done
    for pid in json.loads(names.pid_file.read_text()):
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        # Only a group leader still running one of our commands (pids get reused).
        if os.getpgid(pid) != pid or not ("spark_jobs/" in cmd or "-m cdc run" in cmd):
            continue
        try:
            os.killpg(pid, signal.SIGKILL)
            done.append(f"killed leftover process group {pid}")
        except ProcessLookupError:
            pass
    names.pid_file.unlink()
    return done


def clean(names: DemoNames, timeout_s: float = 60.0) -> list[str]:
    """Drop everything a previous demo run left; returns what was removed, for the screen."""
    done = _stop_leftover_children(names)
    with psycopg.connect(names.admin_dsn, autocommit=True) as conn:
        deadline = time.monotonic() + timeout_s
        while True:
            row = conn.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (names.slot,)
            ).fetchone()
            if row is None:
                break
            if row[0] is None:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (names.slot,))
                done.append(f"dropped slot {names.slot}")
                break
            conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            if time.monotonic() > deadline:
                raise TimeoutError(f"slot {names.slot} stays active (pid {row[0]})")
            time.sleep(0.2)
        if conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (names.database,)
        ).fetchone():
            conn.execute(f'DROP DATABASE "{names.database}" WITH (FORCE)')
            done.append(f"dropped database {names.database}")

    admin = AdminClient({"bootstrap.servers": names.kafka_bootstrap})
    prefix = names.topic_prefix + "."

    def ours() -> list[str]:
        return [
            t
            for t in admin.list_topics(timeout=10).topics
            if t.startswith(prefix) or t == names.heartbeat_topic
        ]

    topics = ours()
    if topics:
        for fut in admin.delete_topics(topics, operation_timeout=30).values():
            fut.result()
        # Deletion is asynchronous; a topic re-created too early would keep its old records.
        deadline = time.monotonic() + timeout_s
        while ours():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka still lists topics {ours()}")
            time.sleep(0.5)
        done.append(f"deleted {len(topics)} Kafka topics {prefix}* and the heartbeat topic")

    client = OpenSearch(names.search_url, timeout=30)
    try:
        indices = list(client.indices.get(index=f"{names.index_prefix}-*", expand_wildcards="all"))
        if indices:
            client.indices.delete(index=",".join(indices))
            done.append(f"deleted {len(indices)} OpenSearch indices {names.index_prefix}-*")
    finally:
        client.close()

    r = redis.Redis.from_url(names.redis_url)
    try:
        n = 0
        for k in r.scan_iter(match=f"{names.key_prefix}:*", count=5000):
            n += r.delete(k)
        if n:
            done.append(f"deleted {n} Redis keys {names.key_prefix}:*")
    finally:
        r.close()

    if names.checkpoint_dir.exists():
        shutil.rmtree(names.checkpoint_dir)
        done.append(f"removed {names.checkpoint_dir.relative_to(ROOT)}")
    if names.log_dir.exists():
        shutil.rmtree(names.log_dir)
    return done
