"""Where a benchmark run lives: its own database, slots, publications and topic prefixes.

Everything a run creates is registered here and removed by :meth:`BenchEnv.cleanup`, slots
first: a leftover slot keeps the server's WAL forever.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from pgcdc.core import ports
from pgcdc.core.contract import heartbeat_topic
from pgcdc.core.settings import KafkaSettings

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ADMIN_DSN = ports.POSTGRES_DSN
DEFAULT_BOOTSTRAP = ports.KAFKA_BOOTSTRAP
# Every bench topic: compacted like the reader's, and stamped by the broker on append, so a
# record's timestamp is when Kafka had it, the same way for every system measured.
TOPIC_CONFIG = {"cleanup.policy": "compact", "message.timestamp.type": "LogAppendTime"}


def dead_letter_topic(prefix: str) -> str:
    """The followers' dead-letter topic of a bench topic prefix."""
    return f"{prefix}_dlq"


def unlink_matching(redis_url: str, match: str, page: int = 10_000) -> None:
    """Remove the Redis keys that match the glob ``match``: a call a page of keys, not one a
    key (a run leaves hundreds of thousands)."""
    import redis

    r = redis.Redis.from_url(redis_url)
    try:
        keys: list[Any] = []
        for k in r.scan_iter(match=match, count=page):
            keys.append(k)
            if len(keys) >= page:
                r.unlink(*keys)
                keys.clear()
        if keys:
            r.unlink(*keys)
    finally:
        r.close()


def with_database(dsn: str, database: str) -> str:
    """The same DSN (URL form) pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


@dataclass(frozen=True)
class SystemNames:
    """A system's own slot, publication, topic prefix and work folder in one run."""

    role: str
    slot: str
    publication: str
    prefix: str
    workdir: Path


@dataclass
class BenchEnv:
    """One run's isolated resources on the shared stack."""

    admin_dsn: str = DEFAULT_ADMIN_DSN
    bootstrap: str = DEFAULT_BOOTSTRAP
    quick: bool = False
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    out_dir: Path = ROOT / "bench-results"
    keep: bool = False
    slots: list[str] = field(default_factory=list)
    topic_prefixes: list[str] = field(default_factory=list)
    database_created: bool = False

    @classmethod
    def from_environ(cls) -> BenchEnv:
        """Settings from BENCH_* (and the reader's CDC_*) environment variables."""
        return cls(
            admin_dsn=os.environ.get("BENCH_ADMIN_DSN")
            or os.environ.get("CDC_POSTGRES__DSN")
            or DEFAULT_ADMIN_DSN,
            bootstrap=os.environ.get("CDC_KAFKA__BOOTSTRAP_SERVERS") or DEFAULT_BOOTSTRAP,
            quick=os.environ.get("BENCH_QUICK", "") not in ("", "0"),
            out_dir=Path(os.environ.get("BENCH_OUT", str(ROOT / "bench-results"))),
            keep=os.environ.get("BENCH_KEEP", "") not in ("", "0"),
        )

    @property
    def database(self) -> str:
        return f"bench_{self.run_id}"

    @property
    def dsn(self) -> str:
        """DSN of this run's database."""
        return with_database(self.admin_dsn, self.database)

    @property
    def run_dir(self) -> Path:
        d = self.out_dir / self.run_id
        d.mkdir(parents=True, exist_ok=True)
        return d

    def name(self, role: str) -> str:
        """A slot/publication/topic-prefix name unique to this run, e.g. bench_ab12cd_ours."""
        return f"bench_{self.run_id}_{role}"

    def names_for(self, role: str) -> SystemNames:
        """Names for the system playing ``role``; cleanup drops its slot and topics."""
        name = self.name(role)
        workdir = self.run_dir / role
        workdir.mkdir(parents=True, exist_ok=True)
        slot, prefix = self.register_slot(name), self.register_prefix(name)
        return SystemNames(role, slot, name + "_pub", prefix, workdir)

    # --- PostgreSQL -----------------------------------------------------------------------

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """An autocommit connection to this run's database."""
        return psycopg.connect(self.dsn, autocommit=True, **kwargs)

    def create_database(self) -> None:
        """Create this run's database, once (fails if PostgreSQL is unreachable): a group of
        ``make bench`` that loads its own tables into it (the backlog's) found it made by the
        run's setup, and failed with DuplicateDatabase."""
        if self.database_created:
            return
        with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self.database_created = True

    def register_slot(self, slot: str) -> str:
        """Remember a slot so cleanup drops it."""
        if slot not in self.slots:
            self.slots.append(slot)
        return slot

    def register_prefix(self, prefix: str) -> str:
        """Remember a topic prefix so cleanup deletes its topics."""
        if prefix not in self.topic_prefixes:
            self.topic_prefixes.append(prefix)
        return prefix

    def drop_slot(self, slot: str) -> None:
        """Drop a slot of this run if it exists (terminating a walsender still holding it)."""
        with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (slot,),
            )
            # The walsender may take a moment to release the slot after its backend ends.
            for _ in range(50):
                row = conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
                if row is None:
                    return
                if not row[0]:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    return
                conn.execute("SELECT pg_sleep(0.1)")
            raise RuntimeError(f"slot {slot} stayed active; drop it by hand")

    # --- Kafka ----------------------------------------------------------------------------

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topics(self, topics: list[str], partitions: int = 1) -> None:
        """Create topics with :data:`TOPIC_CONFIG` (existing ones are left alone)."""
        admin = self.admin()  # must outlive the futures
        futures = admin.create_topics(
            [NewTopic(t, partitions, 1, config=dict(TOPIC_CONFIG)) for t in topics],
            operation_timeout=30,
        )
        for _topic, fut in futures.items():
            try:
                fut.result()
            except KafkaException as e:
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    raise

    # --- cleanup --------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Drop slots, the database and the topics of this run; returns what failed."""
        problems: list[str] = []
        for slot in self.slots:
            try:
                self.drop_slot(slot)
            except Exception as e:  # keep cleaning; report what is left behind
                problems.append(f"slot {slot}: {e}")
        # Slots are per database: any slot left on it (e.g. a tool's default) also goes.
        try:
            with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5) as conn:
                left = [
                    r[0]
                    for r in conn.execute(
                        "SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                        (self.database,),
                    )
                ]
            for slot in left:
                self.drop_slot(slot)
        except Exception as e:
            problems.append(f"slots of {self.database}: {e}")
        if self.keep:
            log.info("BENCH_KEEP set: keeping database %s and its topics", self.database)
            return problems
        if self.database_created:
            try:
                with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(self.database)
                        )
                    )
            except Exception as e:
                problems.append(f"database {self.database}: {e}")
        try:
            admin = self.admin()
            topics = [
                t
                for t in admin.list_topics(timeout=10).topics
                # Table topics, the reader's heartbeat topic, the followers' dead letters.
                if any(
                    t.startswith(p + ".")
                    or t == heartbeat_topic(KafkaSettings(topic_prefix=p))
                    or t == dead_letter_topic(p)
                    for p in self.topic_prefixes
                )
            ]
            if topics:
                for _t, fut in admin.delete_topics(topics, operation_timeout=30).items():
                    fut.result()
        except Exception as e:
            problems.append(f"topics: {e}")
        return problems


def run_alone(keep: bool, name: str, measure: Callable[[BenchEnv], dict[str, Any]]) -> int:
    """One benchmark module run by itself (``python -m benchmarks.<name>``): its figures from
    ``measure`` on a fresh environment, written to the run's ``<name>.json`` and printed. The
    environment is removed after, but for its database and topics with ``keep``
    (:meth:`BenchEnv.cleanup`)."""
    env = BenchEnv.from_environ()
    env.keep = env.keep or keep
    try:
        result = measure(env)
    finally:
        # With ``keep`` too: its database and topics stay, its slots go (a kept slot held
        # the server's WAL, and a few kept runs used up max_replication_slots).
        for problem in env.cleanup():
            log.warning("cleanup: %s", problem)
    out: Path = env.run_dir / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0
