"""Who owns a topic prefix and a replication slot: nothing is written, dropped or advanced
that this reader cannot prove is its own.

A **source** is one database of one PostgreSQL cluster: the cluster's system identifier
(kept by its physical standbys, so a failover stays the same source) and the database name.
The first reader that writes under a topic prefix records its source in the prefix's state
topic (key :data:`SOURCE_KEY`); a reader of another source refuses the prefix before it
writes anything, naming both sources and the setting to change. State topics written before
this record existed are judged by the databases their slot records name.

A **slot** is this reader's when the prefix's state topic holds a record for it: the reader
wrote that record before it created the slot. A slot that exists without one was made by
another tool, or by this pipeline under another prefix (the state topics of the other
prefixes on the same Kafka say which); either way it is refused with one line, unless
``postgres.adopt_slot`` takes it over. The decisions here are pure; :mod:`cdc.pipeline`
reads the records and the catalog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg

SOURCE_KEY = b"#source"
STATE_TOPIC_SUFFIX = ".__cdc_state"


@dataclass(frozen=True)
class Source:
    """One database of one PostgreSQL cluster, and the slot its reader uses."""

    system_identifier: str
    database: str
    slot: str = ""

    def same_as(self, other: Source) -> bool:
        """Whether ``other`` is the same source (the slot does not matter: a new slot of the
        same database writes the same rows)."""
        return self.database == other.database and (
            not self.system_identifier
            or not other.system_identifier
            or self.system_identifier == other.system_identifier
        )

    def describe(self) -> str:
        server = f"server {self.system_identifier}" if self.system_identifier else "a server"
        slot = f", slot {self.slot}" if self.slot else ""
        return f"database {self.database} on {server}{slot}"

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "system_identifier": self.system_identifier,
                "database": self.database,
                "slot": self.slot,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Source:
        d: dict[str, Any] = orjson.loads(data)
        return cls(
            str(d.get("system_identifier") or ""), str(d["database"]), str(d.get("slot", ""))
        )


def system_identifier(conn: psycopg.Connection[Any]) -> str:
    """The cluster's system identifier (``pg_control_system()``, executable by PUBLIC by
    default); empty where the server does not answer it, and then only the database name
    tells sources apart."""
    try:
        with conn.transaction():
            row = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
    except psycopg.errors.Error:
        return ""
    return str(row[0]) if row and row[0] is not None else ""


def slot_record_database(key: bytes, value: bytes | None) -> str | None:
    """The database a state record of a slot names (``<database>/<slot>``), None for other
    records and tombstones."""
    if value is None or key.startswith(b"#") or b"#" in key or b"/" not in key:
        return None
    try:
        return str(orjson.loads(value)["database"])
    except (ValueError, KeyError, TypeError):
        return key.rsplit(b"/", 1)[0].decode(errors="replace")


def prefix_owner(records: Mapping[bytes, bytes | None]) -> Source | None:
    """The source recorded in a state topic's latest records, if any."""
    data = records.get(SOURCE_KEY)
    return Source.from_json(data) if data else None


def claim_prefix(
    records: Mapping[bytes, bytes | None], me: Source, prefix: str, topic: str
) -> bool:
    """Whether ``me`` must record itself as the prefix's source (nobody did yet). Raises
    :class:`PrefixOwnedError` when another source owns it."""
    owner = prefix_owner(records)
    if owner is not None:
        if not owner.same_as(me):
            raise PrefixOwnedError(prefix, topic, owner, me)
        # Recorded without a system identifier (the server did not say): complete it.
        return not owner.system_identifier and bool(me.system_identifier)
    # Written before sources were recorded: the slot records say which databases wrote here.
    for key, value in records.items():
        database = slot_record_database(key, value)
        if database is not None and database != me.database:
            other = Source("", database, key.rsplit(b"/", 1)[-1].decode(errors="replace"))
            raise PrefixOwnedError(prefix, topic, other, me)
    return True


class PrefixOwnedError(Exception):
    """Raised by :func:`claim_prefix`; :mod:`cdc.pipeline` turns it into a ConfigError."""

    def __init__(self, prefix: str, topic: str, owner: Source, me: Source) -> None:
        self.owner, self.me = owner, me
        super().__init__(
            f"topic prefix {prefix} belongs to another source: {owner.describe()} writes its "
            f"topics (recorded in {topic}), and this reader reads {me.describe()}; writing "
            "here would overwrite that source's keys and tombstone the ones this database "
            "lacks. Give this source its own prefix: kafka.topic_prefix "
            f"(CDC_KAFKA__TOPIC_PREFIX), e.g. {suggested_prefix(prefix, me.database)}; or, if "
            "it is the same database on a new server (pg_upgrade, a restore), take the prefix "
            "over with CDC_KAFKA__CLAIM_PREFIX=true"
        )


def suggested_prefix(prefix: str, database: str) -> str:
    """A prefix for a second source: the old one with the database's name."""
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in database) or "db"
    return f"{prefix}_{name}"


def state_topic_prefixes(topics: Iterable[str], own_prefix: str) -> list[str]:
    """The other prefixes whose state topics are among ``topics``."""
    return sorted(
        t[: -len(STATE_TOPIC_SUFFIX)]
        for t in topics
        if t.endswith(STATE_TOPIC_SUFFIX) and t[: -len(STATE_TOPIC_SUFFIX)] != own_prefix
    )


def slot_claimed_in(records: Mapping[bytes, bytes | None], me: Source) -> bool:
    """Whether a state topic's records hold a live record of ``me``'s slot (from the same
    source)."""
    owner = prefix_owner(records)
    if owner is not None and not owner.same_as(me):
        return False
    return records.get(f"{me.database}/{me.slot}".encode()) is not None


def unowned_slot_message(
    slot: str, prefix: str, owners: list[str], holder: str | None, lost: bool
) -> str:
    """The one line for a slot that exists but that no record under ``prefix`` claims."""
    if owners:
        who = (
            f"this pipeline created it under topic prefix {', '.join(owners)} "
            f"({owners[0]}{STATE_TOPIC_SUFFIX}), not under {prefix}; its position is that "
            "prefix's, and moving it here would leave that prefix's topics silently short"
        )
    else:
        who = (
            "no pgcdc reader on this Kafka recorded creating it, so it belongs to another "
            "tool (Debezium, a migration or replication tool) or to a pipeline on another Kafka"
        )
    used = f"; it is in use by {holder}" if holder else ""
    state = " and lost (wal_status = lost)" if lost else ""
    return (
        f"replication slot {slot} exists{state}{used}, but {who}. The reader leaves it as it "
        "is (not dropped, recreated or advanced). Give this reader its own slot: "
        "postgres.slot_name (CDC_POSTGRES__SLOT_NAME); or, if the slot is yours to take, "
        "run with --adopt-slot (CDC_POSTGRES__ADOPT_SLOT=true): the reader streams from its "
        "position and snapshots every captured table incrementally while it streams"
    )
