"""The one place that wires the reader together.

replication → pgoutput decode → table schemas (catalog) → event encoding → Kafka → slot ack.

A run, step by step: open (check the server, reach Kafka, load the reader's durable state,
align the publication, describe the captured tables: a bad ``message_key_columns`` entry or a
keyless table whose topic is compacted stops here, and each keyless table is named once);
plan (:func:`cdc.slots.plan_start` decides from the slot and the state); then either nothing,
a snapshot without a slot, or replication: prepare the slot (snapshot inside its exported
snapshot, create it, or resume it) and stream (:class:`cdc.streamer.Streamer`) until stopped
or caught up. The state is saved at each step through :meth:`_Run.save_state`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc.catalog import SchemaCatalog
from cdc.committed import Committed, check_slot, transactional_id
from cdc.connection import connect, current_database, current_wal_lsn, in_recovery
from cdc.incremental import SnapshotsState, join_tables, load_snapshots, save_snapshots
from cdc.incremental.engine import IncrementalSnapshots
from cdc.incremental.queue import start_slot
from cdc.incremental.signal_table import check_signal_table
from cdc.incremental.wiring import open_incremental
from cdc.interrupt import Interrupt, StopRequested
from cdc.kafka_clients import admin_client
from cdc.metrics import ReaderMetrics
from cdc.ownership import (
    SOURCE_KEY,
    PrefixOwnedError,
    Source,
    claim_prefix,
    slot_claimed_in,
    state_topic_prefixes,
    system_identifier,
    unowned_slot_message,
)
from cdc.publication import ensure_publication, publishes_generated, warn_generated_left_out
from cdc.publisher import Publisher
from cdc.replication import ReplicationConnection, SlotCreated
from cdc.schema_changes import published_shapes, shape
from cdc.slots import (
    Action,
    SlotInfo,
    StartPlan,
    check_wal_level,
    drop_slot,
    failover_wanted,
    other_readers,
    plan_start,
    reader_name,
    slot_info,
    wait_slot_released,
)
from cdc.slow import open_transactions, said_if_slow
from cdc.snapshot import SnapshotInterrupted, Snapshotter
from cdc.state import Phase, ReaderState, StateStore
from cdc.streamer import Streamer
from cdc.table_checks import check_tables, warn_left, warn_unsnapshotted
from cdc.table_topics import TableTopics
from cdc.topic_ids import describe_loss, lost_topics, topic_ids
from pgcdc.core.contract import table_topic
from pgcdc.core.errors import ConfigError, Fenced, SlotError, TransactionAborted
from pgcdc.core.lsn import Lsn
from pgcdc.core.qualified_names import quote_table
from pgcdc.core.settings import InitialSnapshot, Settings, SnapshotMode
from schemas.envelope import EventEncoder

log = logging.getLogger(__name__)

SLOT_RELEASE_TIMEOUT_S = 15.0  # how long to wait for a slot held by a dead predecessor


@dataclass
class RunResult:
    """What a run did; the CLI prints it and tests read it."""

    action: str
    snapshot_rows: int = 0
    events: int = 0
    acked_lsn: Lsn | None = None
    target_lsn: Lsn | None = None


@dataclass
class _Run:
    """What one run opened at startup; every later step uses it."""

    admin: psycopg.Connection[Any]
    slot: str
    database: str
    source: Source
    publisher: Publisher
    store: StateStore
    catalog: SchemaCatalog
    encoder: EventEncoder
    table_topics: TableTopics
    tables: list[tuple[str, str]]
    state: ReaderState | None  # as loaded at startup
    snapshots: SnapshotsState  # incremental snapshots, as loaded at startup

    def save_state(
        self,
        phase: Phase,
        *,
        consistent_point: Lsn | None = None,
        acked_lsn: Lsn | None = None,
        last_commit_lsn: Lsn | None = None,
        wait: bool = True,
    ) -> None:
        """Record where the slot stands; ``wait`` blocks until Kafka acknowledged it."""
        state = ReaderState(
            slot=self.slot,
            database=self.database,
            phase=phase,
            consistent_point=consistent_point,
            acked_lsn=acked_lsn,
            updated_at=time.time(),
            last_commit_lsn=last_commit_lsn,
        )
        self.store.save(state, wait=wait)


def last_commit_at_start(action: Action, state: ReaderState | None, start: Lsn) -> Lsn | None:
    """Where the last commit before ``start`` ends: Debezium's ``source.sequence[0]`` of the
    first transaction streamed. None after a snapshot or on a new slot (Debezium's too); the
    state record's when it was written at this very position; otherwise ``start`` itself
    (exact when the slot was last confirmed at a commit, and never below the previous
    transaction's, so the order ``sequence`` gives still holds)."""
    if action is not Action.STREAM:
        return None
    if state is not None and state.acked_lsn == start:
        return state.last_commit_lsn
    return start


def _fenced_by(admin: psycopg.Connection[Any], slot: str, fenced: Fenced) -> Exception:
    """What a fence means. Kafka fences a producer for a newer one with its transactional
    id (another reader of the slot), but also when its transaction coordinator aborts a
    transaction that stayed open past ``transaction.timeout.ms`` (through a broker restart,
    or a pause of this process): it bumps the id's epoch either way. Another reader of the
    slot connected to PostgreSQL is the first: this one stops for good. None is the second:
    a new run takes the id back and resumes from the committed position."""
    try:
        others = other_readers(admin, slot)
    except psycopg.Error:
        return fenced  # not known: the safe reading
    if others:
        return Fenced(f"{fenced}; connected: {', '.join(others)}", kafka=fenced.kafka)
    return TransactionAborted(
        f"Kafka fenced this reader's producer ({fenced.kafka}), and no other "
        f"reader of slot {slot} is connected to PostgreSQL: the transaction coordinator "
        "aborted a transaction that stayed open past transaction.timeout.ms (a broker "
        "restart or a pause of this process); a new run takes the transactional id back "
        "and resumes from the committed position"
    )


class Pipeline:
    """Snapshot if needed, then stream changes to Kafka until stopped (or caught up)."""

    def __init__(
        self,
        settings: Settings,
        *,
        until_current: bool = False,
        stop: threading.Event | None = None,
        metrics: ReaderMetrics | None = None,
        interrupt: Interrupt | None = None,
    ) -> None:
        self.settings = settings
        self.until_current = until_current
        self.stop = interrupt.stop if interrupt is not None else stop or threading.Event()
        # The stretches that check self.stop themselves (the snapshot's copy, the stream);
        # elsewhere Ctrl-C interrupts the main thread (cdc.interrupt).
        self._graceful = interrupt.graceful if interrupt is not None else contextlib.nullcontext
        self.metrics = metrics
        self._dsn = settings.postgres.dsn.get_secret_value()
        # Set once the stream started: a later lost connection is worth a reconnect
        # (cdc.supervise), while a run that never got this far has a problem to report.
        self.reached_streaming = False
        # Set once the run got past its checks to the initial snapshot: one that loses the
        # connection is started over (postgres.snapshot_retries).
        self.began_snapshot = False

    def run(self) -> RunResult:
        """Run the reader; returns when stopped, caught up (``until_current``) or done."""
        try:
            return self._run()
        except (SnapshotInterrupted, StopRequested) as e:
            if not self.stop.is_set():
                raise
            log.info("stopped: %s", e)
            return RunResult("stopped")

    def _run(self) -> RunResult:
        slot = self.settings.postgres.slot_name
        # Named for the slot: a reader that Kafka fences looks for this connection of the
        # reader that fenced it (_fenced_by).
        with connect(self._dsn, application_name=reader_name(slot)) as admin:
            try:
                return self._run_on(admin)
            except Fenced as e:
                raise _fenced_by(admin, slot, e) from e

    def _run_on(self, admin: psycopg.Connection[Any]) -> RunResult:
        run = self._open(admin)
        try:
            target = current_wal_lsn(admin) if self.until_current else None
            plan = self._plan(run)
            result = RunResult(plan.action.value, target_lsn=target)
            if plan.action is Action.NOTHING:
                log.info("nothing to do: %s", plan.reason, extra={"slot": run.slot})
            elif plan.action is Action.SNAPSHOT_ONLY:
                result.snapshot_rows = self._snapshot_only(run)
            else:
                self._replicate(run, plan, result)
            return result
        finally:
            run.store.close()

    # --- steps --------------------------------------------------------------------------

    def _open(self, admin: psycopg.Connection[Any]) -> _Run:
        """Check the server, reach Kafka, load the state, align the publication."""
        check_wal_level(admin)
        database = current_database(admin)
        kafka = self.settings.kafka
        slot = self.settings.postgres.slot_name
        source = Source(system_identifier(admin), database, slot)
        tid = transactional_id(source.system_identifier, database, slot)
        publisher = Publisher(
            kafka, stop=self.stop, transactional_id=tid if kafka.exactly_once else None
        )
        publisher.probe(timeout_s=5.0)
        if self.metrics is not None:
            publisher.latency_observer = self.metrics.on_delivery
        store = StateStore(kafka, kafka.topic_prefix, kafka.replication_factor)
        store.ensure_topic()
        if kafka.exactly_once:
            # Before the state is read: an older producer of the slot is fenced and its open
            # transaction aborted, so the committed position read next is final.
            publisher.start_transactions(database, slot)
        records = store.latest()
        self._claim_prefix(store, records, source)
        found = records.get(store.key(database, slot))
        state = ReaderState.from_json(found) if found else None
        pg = self.settings.postgres
        listed, signal = pg.listed_tables, pg.signal_table
        if signal and listed and signal not in listed:
            # The signal table's inserts reach the reader through the publication.
            listed = (*listed, signal)
        tables = ensure_publication(
            admin,
            pg.publication_name,
            listed,
            pg.publication_autocreate_mode,
            generated=pg.publish_generated_columns,
        )
        warn_generated_left_out(admin, pg.publication_name, tables)
        run = _Run(
            admin=admin,
            slot=slot,
            database=database,
            source=source,
            publisher=publisher,
            store=store,
            catalog=SchemaCatalog(
                admin,
                pg.message_key_columns,
                store.load_known_keys(database, slot),
                on_learned=lambda keys: store.save_known_keys(database, slot, keys),
                generated=publishes_generated(admin, pg.publication_name),
            ),
            encoder=EventEncoder(self.settings.schema_, kafka.topic_prefix, database),
            table_topics=TableTopics(publisher, kafka),
            tables=tables,
            state=state,
            snapshots=load_snapshots(store, database, slot),
        )
        check_tables(run.admin, run.catalog, run.encoder, run.table_topics, tables)
        if signal:
            # Unsigned rows: only trusted roles may be able to insert them.
            check_signal_table(admin, signal, pg.signal_trusted_roles)
        return run

    def _claim_prefix(
        self, store: StateStore, records: dict[bytes, bytes | None], source: Source
    ) -> None:
        """Refuse a topic prefix another source writes; record this one's if none is."""
        prefix = self.settings.kafka.topic_prefix
        try:
            write = claim_prefix(records, source, prefix, store.topic)
        except PrefixOwnedError as e:
            if not self.settings.kafka.claim_prefix:
                raise ConfigError(str(e)) from None
            log.warning(
                "topic prefix %s moves from %s to %s (kafka.claim_prefix)",
                prefix,
                e.owner.describe(),
                source.describe(),
                extra={"topic": store.topic},
            )
            write = True
        if write:
            store.save_record(SOURCE_KEY, source.to_json(), wait=True)
            log.info(
                "topic prefix %s records its source: %s",
                prefix,
                source.describe(),
                extra={"topic": store.topic},
            )

    def _slot_owners(self, run: _Run) -> list[str]:
        """The other topic prefixes on this Kafka whose state records claim the slot."""
        kafka = self.settings.kafka
        topics = admin_client(kafka).list_topics(timeout=10).topics
        return [
            prefix
            for prefix in state_topic_prefixes(topics, kafka.topic_prefix)
            if slot_claimed_in(StateStore(kafka, prefix).latest(), run.source)
        ]

    def _plan(self, run: _Run) -> StartPlan:
        """Decide from the slot and the loaded state what this run does."""
        # A predecessor killed a moment ago may still hold the slot: give its walsender
        # time to notice, instead of failing with "in use".
        info = wait_slot_released(run.admin, run.slot, SLOT_RELEASE_TIMEOUT_S, log_after_s=2.0)
        pg = self.settings.postgres

        def unowned(slot: SlotInfo) -> str:
            owners = self._slot_owners(run)
            prefix = self.settings.kafka.topic_prefix
            return unowned_slot_message(slot.slot_name, prefix, owners, None, slot.lost)

        plan = plan_start(
            pg.snapshot_mode, run.slot, info, run.state, adopt=pg.adopt_slot, unowned=unowned
        )
        if plan.reason:
            log.warning(plan.reason, extra={"slot": run.slot})
        if plan.action is Action.ADOPT:
            # The prefixes that claimed it give it up: run again, they refuse it by name.
            for prefix in self._slot_owners(run):
                StateStore(self.settings.kafka, prefix).reset(run.database, run.slot)
                log.warning(
                    "replication slot %s moved from topic prefix %s to %s",
                    run.slot,
                    prefix,
                    self.settings.kafka.topic_prefix,
                    extra={"slot": run.slot},
                )
        return plan

    def _snapshotter(self, run: _Run) -> Snapshotter:
        pg = self.settings.postgres
        return Snapshotter(
            self._dsn,
            encoder=run.encoder,
            publisher=run.publisher,
            table_topics=run.table_topics,
            kafka=self.settings.kafka,
            load_schema=run.catalog.load_table_in,
            workers=pg.snapshot_workers,
            chunk_rows=pg.snapshot_chunk_rows,
            stop=self.stop,
        )

    def _snapshot_only(self, run: _Run) -> int:
        """``initial_only``: copy the tables without a slot; return the rows copied."""
        self.began_snapshot = True
        with self._graceful():
            snap = self._snapshotter(run).run(run.tables, None, None)
        run.save_state(Phase.SNAPSHOT_ONLY_DONE, consistent_point=snap.position)
        return snap.rows

    def _replicate(self, run: _Run, plan: StartPlan, result: RunResult) -> None:
        """Prepare the slot, then stream from it until stopped or caught up."""
        pg = self.settings.postgres
        repl = ReplicationConnection(
            self._dsn, application_name="cdc", status_interval_s=pg.status_interval_s
        )
        snapshots: IncrementalSnapshots | None = None
        try:
            start = self._prepare_slot(run, plan, repl, result)
            if plan.action is Action.STREAM and run.snapshots.captured is None:
                kafka = self.settings.kafka
                warn_unsnapshotted(run.admin, kafka, kafka.topic_prefix, run.tables)
            snapshots = self._incremental(run, plan)

            committed = self._committed(run, plan, start)

            def checkpoint(lsn: Lsn | None) -> None:
                run.save_state(
                    Phase.STREAMING,
                    acked_lsn=lsn,
                    last_commit_lsn=streamer.acked_commit,
                    wait=False,
                )

            streamer = Streamer(
                repl,
                settings=self.settings,
                publisher=run.publisher,
                encoder=run.encoder,
                catalog=run.catalog,
                stop=self.stop,
                checkpoint=checkpoint,
                observer=self.metrics,
                target=result.target_lsn,
                captured=set(run.tables),
                last_commit=last_commit_at_start(plan.action, run.state, start),
                snapshots=snapshots,
                committed=committed,
            )
            # Logical messages carry the incremental snapshots' watermarks and signals.
            repl.start(
                run.slot, pg.publication_name, start, proto_version=pg.proto_version, messages=True
            )
            self.reached_streaming = True
            if self.metrics is not None:
                self.metrics.on_streaming(start)  # /readyz: streaming from now on
            with self._graceful():
                streamer.run(start)
            result.events = streamer.events
            result.acked_lsn = streamer.last_ack
            run.save_state(
                Phase.STREAMING,
                acked_lsn=streamer.last_ack,
                last_commit_lsn=streamer.acked_commit,
            )
        finally:
            repl.close()
            if snapshots is not None:
                snapshots.close()
            if pg.drop_slot_on_exit:
                # The walsender releases the slot only once it has seen our connection
                # close; drop_slot waits for that rather than failing with "in use".
                drop_slot(run.admin, run.slot, SLOT_RELEASE_TIMEOUT_S)
                run.store.reset(run.database, run.slot)

    def _committed(self, run: _Run, plan: StartPlan, start: Lsn) -> Committed | None:
        """What a transactional reader of the slot committed to Kafka (cdc.committed): a
        resumed slot's, checked against the slot. A new slot's, or one left by a run that
        was not transactional, is stale and forgotten."""
        found = run.store.load_committed(run.database, run.slot)
        eos = run.publisher.transactional_id
        if eos is None or plan.action is not Action.STREAM:
            if found is not None:
                run.store.forget_committed(run.database, run.slot)
            if eos is not None:
                log.info(
                    "exactly-once: a new slot; Kafka transactions from %s on",
                    start,
                    extra={"slot": run.slot, "transactional_id": eos},
                )
            return None
        if found is None:
            log.info(
                "exactly-once: no committed position yet; from the slot's %s on, each change "
                "is committed once (what came before may have been written twice)",
                start,
                extra={"slot": run.slot, "transactional_id": eos},
            )
            return None
        check_slot(run.slot, start, found, eos)
        log.info(
            "exactly-once: Kafka holds the changes %s; the slot resumes at %s, and what Kafka "
            "holds is not written again",
            found.describe(),
            start,
            extra={"slot": run.slot, "transactional_id": eos},
        )
        run.publisher.committed = found
        return found

    def _incremental(self, run: _Run, plan: StartPlan) -> IncrementalSnapshots:
        """The incremental snapshots of this run: what was queued before (a new slot's queue
        was set when it was created, see :meth:`_started`), and the tables that joined the
        captured set since the last run."""
        state = run.snapshots
        engine = open_incremental(
            self._dsn,
            settings=self.settings,
            publisher=run.publisher,
            encoder=run.encoder,
            load_schema=run.catalog.load_table_in,
            store=run.store,
            table_topics=run.table_topics,
            database=run.database,
            state=state,
            observer=self.metrics,
            generated=run.catalog.generated,
        )
        prefix = self.settings.kafka.topic_prefix
        topics = {table_topic(prefix, *table): table for table in run.tables}
        current = topic_ids(self.settings.kafka, topics)
        if plan.action is Action.STREAM:
            if state.captured is None:
                state.captured = list(run.tables)  # from now on, tables that join are seen
            else:
                for table in join_tables(state, run.tables):
                    engine.table_joined(table, "while the reader was stopped", save=False)
                # A table that left the captured set is snapshotted again if it comes back.
                left = [t for t in state.captured if t not in run.tables]
                for table in left:
                    warn_left(table, prefix)
                known = run.store.load_left(run.database, run.slot)
                if left or any(t in run.tables for t in known):
                    still = sorted({*known, *left} - set(run.tables))
                    run.store.save_left(run.database, run.slot, still)
                state.captured = [t for t in state.captured if t in run.tables]
            for topic in lost_topics(state.topics, current):
                why = describe_loss(topic, state.topics[topic], current[topic])
                engine.topic_lost(topics[topic], why)
        missing = [t for t, tid in current.items() if tid is None]
        for topic in missing:  # created now, so that its id is the one recorded
            run.table_topics.ensure(topic, keyless=False, table=".".join(topics[topic]))
        if missing:
            current.update(topic_ids(self.settings.kafka, missing))
        # The topics as this run writes them (a slot made by this run: as it snapshotted).
        state.topics = {t: tid for t, tid in current.items() if tid is not None}
        # The captured tables' shapes: a Relation message with another one snapshots the table
        # again (cdc.schema_changes). A table with none recorded (a slot made by this run, a
        # reader from before) starts from its shape now: for a new slot, as it snapshotted.
        names = {quote_table(t): t for t in run.tables}
        state.relations = {n: c for n, c in state.relations.items() if n in names}
        if any(n not in state.relations for n in names):
            now = published_shapes(
                run.catalog.conn, self.settings.postgres.publication_name, run.catalog.generated
            )
            for name, table in names.items():
                if name not in state.relations:
                    found = now.get(name)
                    if found is None:  # not in the publication (yet): as the catalog has it
                        found = shape(run.catalog.load_table_in(run.catalog.conn, *table))
                    state.relations[name] = found
        engine.save()
        return engine

    def _started(self, run: _Run, start: Lsn, *, incremental: bool = False) -> None:
        """A slot this run created is ready to stream from ``start``: its snapshot queue is
        saved first, then the STREAMING phase (:func:`cdc.incremental.queue.start_slot`)."""
        start_slot(
            run.snapshots,
            run.tables,
            incremental_initial=incremental,
            signal_table=self.settings.postgres.signal_table,
            save_queue=lambda s: save_snapshots(run.store, run.database, run.slot, s),
            save_streaming=lambda: run.save_state(
                Phase.STREAMING, consistent_point=start, acked_lsn=start
            ),
        )
        if incremental:
            log.info(
                "initial snapshot of %d tables runs incrementally while streaming",
                len(run.snapshots.queue),
                extra={"slot": run.slot},
            )

    def _create_slot(
        self, run: _Run, repl: ReplicationConnection, *, export_snapshot: bool, failover: bool
    ) -> SlotCreated:
        """Create the slot; a creation that waits on open transactions says which."""

        def waiting() -> str:
            return (
                f"creating replication slot {run.slot}: PostgreSQL waits for the transactions "
                f"open now (in any database) to end first: {open_transactions(run.admin)}"
            )

        with said_if_slow(waiting, slot=run.slot):
            return repl.create_slot(run.slot, export_snapshot=export_snapshot, failover=failover)

    def _prepare_slot(
        self, run: _Run, plan: StartPlan, repl: ReplicationConnection, result: RunResult
    ) -> Lsn:
        """Create (snapshotting if planned) or find the slot; return where streaming starts."""
        if plan.drop_existing_slot:
            drop_slot(run.admin, run.slot)
        failover = failover_wanted(run.admin, self.settings.postgres.slot_failover)
        if plan.action is Action.STREAM:
            return self._resume_slot(run, repl, failover)
        if plan.action is Action.ADOPT:
            start = self._resume_slot(run, repl, failover, save=False)
            taken = self.settings.postgres.snapshot_mode is not SnapshotMode.NO_DATA
            self._started(run, start, incremental=taken)
            return start
        incremental = self.settings.postgres.initial_snapshot is InitialSnapshot.INCREMENTAL
        create = bool(failover)
        if plan.action is Action.SNAPSHOT and incremental and in_recovery(run.admin):
            raise ConfigError(
                "postgres.initial_snapshot = incremental writes watermarks into the WAL, "
                "which a standby cannot: use initial_snapshot = exported (the default) on "
                "a standby, or read from the primary"
            )
        # Before the slot exists: the record that claims it as this reader's (a slot without
        # one is another's), and a stop from here on finds a snapshot to start over, not an
        # older state's STREAMING (a slot dropped and recreated by when_needed).
        run.save_state(Phase.SNAPSHOT)
        if plan.action is Action.SNAPSHOT:
            self.began_snapshot = True
        if plan.action is Action.SNAPSHOT and incremental:
            # No exported snapshot: the tables are read in chunks while streaming
            # (see _incremental), and a stop resumes at the next chunk.
            created = self._create_slot(run, repl, export_snapshot=False, failover=create)
            start = created.consistent_point
            self._started(run, start, incremental=True)
            return start
        if plan.action is Action.SNAPSHOT:
            created = self._create_slot(run, repl, export_snapshot=True, failover=create)
            start = created.consistent_point
            run.save_state(Phase.SNAPSHOT, consistent_point=start)
            # The exported snapshot lives until the next command on repl: copy the tables now.
            with self._graceful():
                snap = self._snapshotter(run).run(run.tables, created.snapshot_name, start)
            result.snapshot_rows = snap.rows
            self._started(run, start)
            return start
        created = self._create_slot(run, repl, export_snapshot=False, failover=create)
        start = created.consistent_point
        self._started(run, start)
        return start

    def _resume_slot(
        self,
        run: _Run,
        repl: ReplicationConnection,
        failover: bool | None,
        *,
        save: bool = True,
    ) -> Lsn:
        """The existing slot's confirmed position (with ``save``, state is written if it was
        lost); its ``failover`` property is set to ``postgres.slot_failover`` where it
        exists."""
        info = slot_info(run.admin, run.slot)
        if info is None:
            raise SlotError(f"replication slot {run.slot} disappeared at startup")
        if failover is not None and info.failover is not None and info.failover != failover:
            repl.set_failover(run.slot, failover)
        start = info.confirmed_flush_lsn or Lsn(0)
        if save and run.state is None:
            run.save_state(Phase.STREAMING, acked_lsn=start)
        return start
