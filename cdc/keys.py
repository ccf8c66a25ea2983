"""Which columns key a table's Kafka records: one rule, for the snapshot and the stream alike.

The key is what every UPDATE and DELETE can name, so it follows the replica identity (what
PostgreSQL puts in the old row of an UPDATE or DELETE):

1. an entry of ``postgres.message_key_columns`` (Debezium's ``message.key.columns``) whose
   pattern matches ``schema.table``: its columns, in its order;
2. replica identity DEFAULT or FULL and a primary key: the primary key;
3. replica identity USING INDEX: that index's columns (a DELETE carries only those);
4. otherwise none: the table is *keyless*. Its records have a null key and go to a table
   topic with ``cleanup.policy=delete`` (as Debezium does; a compacted topic refuses null
   keys), and the followers leave it out.

A ``message_key_columns`` entry is checked against the table (:func:`check_key_columns`): its
columns must exist, be NOT NULL, and be in every old row PostgreSQL sends (replica identity
FULL, or columns within the identity; a table without identity never sends one, because
PostgreSQL refuses its UPDATEs and DELETEs while they are published).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pgcdc.core.errors import ConfigError
from pgcdc.core.key_columns import KeyColumns

log = logging.getLogger(__name__)

KEY_COLUMNS_SETTING = "CDC_POSTGRES__MESSAGE_KEY_COLUMNS"


@dataclass(frozen=True)
class KeyFacts:
    """What the key rule looks at, from pg_catalog (snapshot) or a Relation message (stream).

    ``identity`` is the columns an old row carries: the primary key (DEFAULT), the index's
    columns (USING INDEX), every column (FULL), none (NOTHING, or DEFAULT without a key).
    """

    schema: str
    table: str
    replica_identity: str  # "d", "f", "i", "n"
    primary_key: tuple[str, ...]
    identity: tuple[str, ...]
    columns: tuple[str, ...]
    not_null: frozenset[str]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


def matching_rule(rules: Sequence[KeyColumns], schema: str, table: str) -> KeyColumns | None:
    """The first ``message_key_columns`` entry whose pattern matches all of ``schema.table``."""
    name = f"{schema}.{table}"
    for rule in rules:
        if re.fullmatch(rule.table_pattern, name):
            return rule
    return None


def check_key_columns(facts: KeyFacts, columns: Sequence[str]) -> None:
    """Raise one ConfigError line unless ``columns`` can key every change of the table."""
    missing = [c for c in columns if c not in facts.columns]
    if missing:
        raise ConfigError(
            f"postgres.message_key_columns names {', '.join(missing)}, not a column of "
            f"{facts.name}; fix {KEY_COLUMNS_SETTING}"
        )
    nullable = [c for c in columns if c not in facts.not_null]
    if nullable:
        raise ConfigError(
            f"postgres.message_key_columns keys {facts.name} by {', '.join(nullable)}, which "
            f"may be NULL; make it NOT NULL or fix {KEY_COLUMNS_SETTING}"
        )
    carried = set(facts.identity)
    if facts.replica_identity != "f" and carried and not set(columns) <= carried:
        raise ConfigError(
            f"postgres.message_key_columns keys {facts.name} by {', '.join(columns)}, but its "
            f"UPDATEs and DELETEs carry only {', '.join(facts.identity)} (the replica "
            f"identity); run ALTER TABLE {facts.name} REPLICA IDENTITY FULL or fix "
            f"{KEY_COLUMNS_SETTING}"
        )


def key_columns(facts: KeyFacts, rules: Sequence[KeyColumns] = ()) -> tuple[str, ...]:
    """The table's key columns by the rule above; () for a keyless table."""
    rule = matching_rule(rules, facts.schema, facts.table)
    if rule is not None:
        check_key_columns(facts, rule.columns)
        return rule.columns
    if facts.replica_identity in ("d", "f") and facts.primary_key:
        return facts.primary_key
    if facts.replica_identity == "i":
        return facts.identity
    return ()


class KeylessWarnings:
    """Logs one warning per keyless table per process, however often it is described."""

    def __init__(self) -> None:
        self._warned: set[tuple[str, str]] = set()

    def note(self, schema: str, table: str) -> None:
        if (schema, table) in self._warned:
            return
        self._warned.add((schema, table))
        log.warning(
            "table %s.%s has no primary key or replica identity index: its events go to a "
            "topic with cleanup.policy=delete with null keys, and the followers skip it; to "
            "key it, set %s (e.g. '%s.%s:<column>,...')",
            schema,
            table,
            KEY_COLUMNS_SETTING,
            schema,
            table,
            extra={"table": f"{schema}.{table}"},
        )
