"""The engine's ports made real: PostgreSQL, Kafka and the state topic, from the settings."""

from __future__ import annotations

import contextlib
import logging
import sys

import psycopg

from cdc.connection import connect, in_recovery
from cdc.incremental.auth import SET_A_KEY, Verifier, key_of
from cdc.incremental.channels import SignalIntake
from cdc.incremental.cursor import ChunkPublisher
from cdc.incremental.engine import IncrementalSnapshots
from cdc.incremental.filters import check_expression, check_on_server
from cdc.incremental.merge import ReadSnapshot
from cdc.incremental.queue import RecordStore, SnapshotsState, Table, save_snapshots
from cdc.incremental.requests import EngineConfig
from cdc.incremental.signal_table import untrusted_writers
from cdc.incremental.signal_topic import SignalTopic
from cdc.incremental.signals import split_table
from cdc.incremental.worker import ChunkReader, SchemaLoader
from cdc.observer import StreamObserver
from cdc.publication import captured_tables
from cdc.schema_changes import Shape, published_shapes
from cdc.table_topics import TableTopics
from pgcdc.core.settings import Settings
from schemas.envelope import EventEncoder

log = logging.getLogger(__name__)

_SNAPSHOT_SQL = (
    "SELECT pg_catalog.pg_snapshot_xmax(s)::text::bigint, ARRAY(SELECT "
    "pg_catalog.pg_snapshot_xip(s)::text::bigint) FROM pg_catalog.pg_current_snapshot() s"
)


class PgCatalog:
    """The engine's questions to PostgreSQL, on the engine's own connection."""

    def __init__(
        self,
        dsn: str,
        publication: str,
        load_schema: SchemaLoader,
        functions: tuple[str, ...],
        generated: bool = False,
    ) -> None:
        self.conn = connect(dsn, application_name="cdc-snapshot")
        self._publication = publication
        self._load_schema = load_schema
        self._functions = functions
        self._generated = generated

    def captured(self) -> list[Table]:
        return captured_tables(self.conn, self._publication)

    def shapes(self) -> dict[str, Shape]:
        return published_shapes(self.conn, self._publication, self._generated)

    def visibility(self) -> ReadSnapshot:
        row = self.conn.execute(_SNAPSHOT_SQL).fetchone()
        assert row is not None
        return ReadSnapshot(
            frozenset(int(x) & 0xFFFFFFFF for x in row[1]), int(row[0]) & 0xFFFFFFFF
        )

    def committed_invisible(self) -> frozenset[int]:
        """Transactions committed (in the commit log) that snapshots still see as running:
        a commit waiting for a synchronous standby, perhaps streamed by an earlier run."""
        rows = self.conn.execute(
            "SELECT x::text::bigint FROM pg_catalog.pg_snapshot_xip("
            "pg_catalog.pg_current_snapshot()) x "
            "WHERE pg_catalog.pg_xact_status(x) = 'committed'"
        ).fetchall()
        return frozenset(int(r[0]) & 0xFFFFFFFF for r in rows)

    def check_filter(self, table: Table, where: str) -> str:
        """The filter as it will run (checked, deparsed); FilterRefused or SchemaError."""
        schema = self._load_schema(self.conn, *table)
        checked = check_expression(where, [c.name for c in schema.columns], self._functions)
        # A timeout is not the filter's fault: the worker checks it again before each chunk.
        with contextlib.suppress(psycopg.errors.QueryCanceled):
            check_on_server(self.conn, checked, *table)
        return checked.sql

    def close(self) -> None:
        self.conn.close()


def open_incremental(
    dsn: str,
    *,
    settings: Settings,
    publisher: ChunkPublisher,
    encoder: EventEncoder,
    load_schema: SchemaLoader,
    store: RecordStore,
    table_topics: TableTopics,
    database: str,
    state: SnapshotsState,
    observer: StreamObserver | None = None,
    progress: bool | None = None,
    generated: bool = False,
) -> IncrementalSnapshots:
    """The engine with its real ports (connections, worker thread, signal channels);
    ``generated``: the publication publishes stored generated columns."""
    pg, kafka = settings.postgres, settings.kafka
    signal_table = split_table(pg.signal_data_collection) if pg.signal_data_collection else None
    catalog = PgCatalog(
        dsn, pg.publication_name, load_schema, pg.signal_filter_functions, generated
    )

    def table_check() -> str | None:
        assert signal_table is not None
        return untrusted_writers(catalog.conn, signal_table, pg.signal_trusted_roles)

    key = key_of(pg)
    if key.key is None:
        log.warning(
            "signals through the WAL (cdc snapshot) and the signal topic are refused: %s; %s",
            key.source,
            SET_A_KEY,
        )
    topic = (
        SignalTopic(kafka, kafka.signal_topic, database, pg.slot_name)
        if kafka.signal_topic
        else None
    )
    intake = SignalIntake(
        Verifier(key.key, database, pg.slot_name, missing=key.source),
        state,
        topic=topic,
        table_check=table_check if signal_table is not None else None,
    )
    config = EngineConfig(
        topic_prefix=kafka.topic_prefix,
        publication=pg.publication_name,
        chunk_rows=pg.incremental_chunk_rows,
        snapshot_new_tables=pg.snapshot_new_tables,
        snapshot_on_schema_change=pg.snapshot_on_schema_change,
        signal_table=signal_table,
        filter_functions=pg.signal_filter_functions,
        on_standby=in_recovery(catalog.conn),
    )

    def save(s: SnapshotsState) -> None:
        save_snapshots(store, database, pg.slot_name, s)

    def ensure(topic_name: str, table: str) -> None:
        table_topics.ensure(topic_name, keyless=False, table=table)

    return IncrementalSnapshots(
        config,
        state=state,
        save=save,
        chunks=ChunkReader(dsn, load_schema, encoder),
        publisher=publisher,
        catalog=catalog,
        intake=intake,
        ensure_topic=ensure,
        observer=observer,
        tty=sys.stderr.isatty() if progress is None else progress,
    )
