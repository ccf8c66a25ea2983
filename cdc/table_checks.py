"""What the reader checks about the captured tables when it starts.

- Every table is described once (:meth:`cdc.catalog.SchemaCatalog.load_table_in`): a
  ``message_key_columns`` entry that cannot key its table stops the run here with one line,
  and each keyless table is named in one warning. A keyless table's topic is created now,
  not compacted, or refused with one line if it exists compacted (:mod:`cdc.table_topics`).
- When a run resumes streaming, a captured table that holds rows but has no topic joined the
  publication while the reader was stopped: its rows were never snapshotted, and one loud
  warning says so (a table added while streaming is the streamer's to report).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from cdc.catalog import SchemaCatalog
from cdc.kafka_clients import admin_client, cluster_metadata
from cdc.keys import KEY_COLUMNS_SETTING, matching_rule
from cdc.table_topics import TableTopics
from pgcdc.core.contract import table_topic
from pgcdc.core.qualified_names import quote_table
from pgcdc.core.settings import KafkaSettings
from schemas.envelope import EventEncoder

log = logging.getLogger(__name__)


def check_tables(
    conn: psycopg.Connection[Any],
    catalog: SchemaCatalog,
    encoder: EventEncoder,
    table_topics: TableTopics,
    tables: Sequence[tuple[str, str]],
) -> None:
    """Describe every captured table (see the module docstring); raise ConfigError at the
    first one that cannot be carried."""
    for schema, name in tables:
        table = catalog.load_table_in(conn, schema, name)
        if not table.key_columns:
            table_topics.ensure(encoder.topic(table), keyless=True, table=f"{schema}.{name}")
    for rule in catalog.rules:
        if not any(matching_rule([rule], s, t) for s, t in tables):
            log.warning(
                "%s entry %r matches no captured table",
                KEY_COLUMNS_SETTING,
                rule.table_pattern,
            )


def warn_unsnapshotted(
    conn: psycopg.Connection[Any],
    kafka: KafkaSettings,
    topic_prefix: str,
    tables: Sequence[tuple[str, str]],
) -> None:
    """Warn about each captured table with rows but no topic (see the module docstring)."""
    existing = cluster_metadata(admin_client(kafka), kafka.bootstrap_servers, timeout_s=10).topics
    for schema, name in tables:
        if table_topic(topic_prefix, schema, name) in existing:
            continue
        row = conn.execute(
            sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(schema, name))
        ).fetchone()
        if row and row[0]:
            warn_not_snapshotted(f"{schema}.{name}", "while the reader was stopped")


def warn_not_snapshotted(table: str, when: str) -> None:
    """The one loud warning about a table that joined the captured tables ``when``."""
    log.warning(
        "table %s joined the captured tables %s: its changes from now on are captured, but "
        "the rows it held before were NOT snapshotted; to copy them, take a new snapshot "
        "(`cdc reset-state`, then `cdc run`)",
        table,
        when,
        extra={"table": table},
    )


def warn_left(table: tuple[str, str], prefix: str) -> None:
    """A table left the captured set: say what stays behind and the command that removes it."""
    name = quote_table(table)
    log.warning(
        "table %s left the captured set (postgres.tables or the publication): its changes are "
        "no longer captured, and its topic %s and the followers' copies keep its last rows; "
        "`cdc forget %s` removes them (docs/troubleshooting.md#a-table-left-the-captured-set)",
        name,
        table_topic(prefix, *table),
        name,
        extra={"table": name},
    )
