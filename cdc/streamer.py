"""The streaming loop: decoded pgoutput messages in, Kafka records out, the slot acknowledged.

Order of a checkpoint: records are produced as they are decoded (a transaction is never
buffered); delivery reports mark transactions complete; the slot's flush LSN then advances to
the end of the last transaction that is complete together with all before it
(:meth:`cdc.publisher.Publisher.acked_lsn`). When nothing is pending, a keepalive's position is
acknowledged too, so an idle slot (or one whose changes are all filtered out) keeps advancing.

Keys come from the table description the stream itself carries (:mod:`cdc.keys`, through
the catalog); a key column always carries its value (an unchanged TOASTed key is taken from
the old key the server sends). A TRUNCATE becomes deletes of every live key
(:mod:`cdc.truncate`). Unchanged TOAST values left in an event are named by the
``cdc.unchanged`` header. Operations in ``postgres.skipped_operations`` are left out.

The loop gets everything it uses from its caller: the replication connection, the settings,
the publisher, the encoder, the catalog, a stop signal, a checkpoint function that saves the
acknowledged LSN, and an observer for metrics.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import psycopg

from cdc import pgoutput
from cdc.catalog import SchemaCatalog
from cdc.committed import Committed, Position
from cdc.connection import current_wal_lsn
from cdc.heartbeat import Heartbeats
from cdc.incremental.engine import IncrementalSnapshots
from cdc.incremental.merge import key_identity
from cdc.observer import NullObserver, StreamObserver
from cdc.publisher import Publisher, TxnTracker
from cdc.replication import Keepalive, ReplicationConnection, XLogData
from cdc.schema_changes import shape
from cdc.table_checks import warn_not_snapshotted
from cdc.table_topics import TableTopics
from cdc.toast import fetch_current, fill_from_old, require_key, unchanged_columns
from cdc.truncate import TruncateWriter
from pgcdc.core.contract import (
    HEADER_UNCHANGED,
    encode_unchanged_header,
    heartbeat_topic,
    truncate_topic,
    version_headers,
)
from pgcdc.core.errors import ConnectionFailed, SchemaError, SlotError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import Settings
from pgcdc.core.values import UNCHANGED_TOAST, RawValue
from schemas.envelope import EventEncoder
from schemas.model import SourceInfo, TableSchema, TransactionInfo

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, str | bytes | None]]
Row = tuple[RawValue, ...]
# Saves the acknowledged LSN in the reader's durable state (without waiting for Kafka).
Checkpoint = Callable[[Lsn | None], None]

ACK_INTERVAL_S = 0.2  # how often at most a new flush position is sent to the server
STATE_INTERVAL_S = 10.0  # how often the acked LSN is written to the state topic
LAG_INTERVAL_S = 5.0  # how often the server's WAL position is read for the lag metric
READ_TIMEOUT_S = 0.1  # how long one read waits for a frame before the loop looks around
ASK_POSITION_INTERVAL_S = 0.5  # idle before --until current's target: ask for a keepalive


class Streamer:
    """Streams one slot's changes to Kafka, acknowledging as Kafka confirms them."""

    def __init__(
        self,
        repl: ReplicationConnection,
        *,
        settings: Settings,
        publisher: Publisher,
        encoder: EventEncoder,
        catalog: SchemaCatalog,
        stop: threading.Event,
        checkpoint: Checkpoint,
        observer: StreamObserver | None = None,
        target: Lsn | None = None,
        captured: set[tuple[str, str]] | None = None,
        last_commit: Lsn | None = None,
        snapshots: IncrementalSnapshots | None = None,
        committed: Committed | None = None,
    ) -> None:
        """``target``: stop once everything up to it is acknowledged (``--until current``)
        and no incremental snapshot is left. ``captured``: the tables captured at start;
        another one showing up while streaming was added to the publication since: it is
        handed to ``snapshots`` (:mod:`cdc.incremental.engine`), which reads its earlier rows.
        ``last_commit``: where the last commit before the start position ends (the first
        transaction's ``source.sequence[0]``), when known. ``committed``: what a
        transactional publisher (``kafka.exactly_once``) committed last; records at or below
        its version are not produced again (:mod:`cdc.committed`)."""
        self._repl = repl
        self._publisher = publisher
        self._encoder = encoder
        self._catalog = catalog
        self._stop = stop
        self._checkpoint = checkpoint
        self._observer: StreamObserver = observer or NullObserver()
        self._target = target
        self._slot = settings.postgres.slot_name
        self._proto = settings.postgres.proto_version
        self._complete_toast = settings.postgres.complete_unchanged_toast
        self._tx_metadata = settings.schema_.provide_transaction_metadata
        topic = heartbeat_topic(settings.kafka)
        server = settings.kafka.topic_prefix
        self._heartbeats = Heartbeats(publisher, topic, server) if topic else None
        self._heartbeat_interval_s = settings.kafka.heartbeat_interval_s
        self._skipped = frozenset(settings.postgres.skipped_operations)
        self._captured = captured
        self._snapshots = snapshots
        self._signal_table = snapshots.signal_table if snapshots is not None else None
        self._snapshot_due = 0.0
        self._relations: dict[int, TableSchema] = {}
        self._positions: dict[int, tuple[TableSchema, list[int]]] = {}  # key columns' places
        self._topics: dict[int, str] = {}
        self._table_topics = TableTopics(publisher, settings.kafka)
        self._truncates = TruncateWriter(
            publisher=publisher,
            encoder=encoder,
            topics=self._table_topics,
            kafka=settings.kafka,
            truncate_topic=truncate_topic(settings.kafka.topic_prefix),
            write_t_events="t" not in self._skipped,
            tick=self._keep_alive,
        )
        # The open transaction (between Begin and Commit).
        self._txn: TxnTracker | None = None
        self._unsent = False  # records of a closed transaction may be lingering
        self._order = 0
        self._xid: int | None = None
        self._commit_ts_us = 0
        self._commit_lsn_header = b"0"
        self._per_table: dict[int, int] = {}
        self._last_commit_lsn: int | None = None if last_commit is None else last_commit.value
        # End of the last streamed commit Kafka holds (at or before last_ack), for the state
        # record; commits seen and not yet acknowledged wait in _commits.
        self.acked_commit: Lsn | None = last_commit
        self._commits: collections.deque[Lsn] = collections.deque()
        # A keepalive's position, safe to acknowledge while nothing is in flight.
        self._idle_lsn: Lsn | None = None
        # When the periodic duties (see _duties) are next due, as monotonic times.
        self._next_duty = self._ack_due = self._heartbeat_due = self._lag_due = 0.0
        self._state_due = self._ask_due = 0.0
        self.last_ack: Lsn | None = None
        self.events = 0
        # A transactional publisher: Kafka transactions commit between PostgreSQL ones
        # (or split a long one), each with the position it holds (cdc.committed).
        self._eos = publisher.transactional_id is not None
        self._committed = committed
        self._position: Position | None = None  # set by run(), from its start
        self._splits = 0
        # While the publisher waits on Kafka (an outage), the session stays alive and an
        # outage line says how much WAL the slot holds back.
        publisher.while_waiting = self._keep_session
        publisher.describe_slot = self._slot_wal

    def run(self, start: Lsn) -> None:
        """Stream from ``start`` until stopped or caught up; acknowledge on the way out.

        An open transaction stays unacknowledged when stopped: the next run replays all of it.
        """
        self.last_ack = start
        self._state_due = time.monotonic() + STATE_INTERVAL_S
        if self._heartbeats:
            self._heartbeats.ensure_topic()
        # Kafka transactions commit only where this loop says (between transactions).
        self._publisher.auto_commit = False
        if self._eos:
            self._position = Position(self._committed, start)
        while not self._stop.is_set():
            # After a transaction's records are queued, look whether more has arrived;
            # when nothing has, hurry them to Kafka rather than let them wait linger.ms.
            msg = self._repl.read(0.0 if self._unsent else READ_TIMEOUT_S)
            if isinstance(msg, XLogData):
                self._handle(msg)
                if self._eos and self._txn is None and self._publisher.commit_due():
                    self._commit()
            else:
                if msg is None and self._eos and self._txn is None:
                    # Nothing more now: what is open becomes visible at once.
                    self._unsent = False
                    self._commit()
                elif msg is None and self._unsent:
                    self._unsent = self._publisher.hurry()
                elif msg is None and self._target is not None and self._txn is None:
                    # Idle before the target: ask where decoding stands (--until current).
                    self._ask_position(time.monotonic())
                # Between frames: serve delivery reports (send() also polls every 1,024
                # records, so a busy stream does not pay for a poll per message).
                self._publisher.poll(0)
                if isinstance(msg, Keepalive) and self._txn is None and self._publisher.idle():
                    # Everything before wal_end has reached us and is in Kafka: safe to confirm.
                    self._idle_lsn = msg.wal_end
            now = time.monotonic()
            if now >= self._next_duty:
                self._duties(now)
                # last_ack moves only in the duties, so this is the only place to look.
                if self._caught_up():
                    self._finish()
                    log.info(
                        "caught up with %s; stopping",
                        self._target,
                        extra={"slot": self._slot, "lsn": str(self.last_ack)},
                    )
                    return
        log.info(
            "stop requested: flushing and acknowledging",
            extra={"slot": self._slot, "lsn": str(self.last_ack)},
        )
        self._finish()

    def _ask_position(self, now: float) -> None:
        if now >= self._ask_due:
            self._ask_due = now + ASK_POSITION_INTERVAL_S
            self._repl.request_keepalive()

    def _caught_up(self) -> bool:
        return (
            self._target is not None
            and self.last_ack is not None
            and (self.last_ack >= self._target)
            and (self._snapshots is None or not self._snapshots.busy)
        )

    # --- periodic duties ----------------------------------------------------------------

    def _duties(self, now: float) -> None:
        """Acknowledge, save state, send a heartbeat, measure lag: each when it is due."""
        if now >= self._ack_due:
            self._ack_due = now + ACK_INTERVAL_S
            self._acknowledge()
        if now >= self._state_due:
            self._state_due = now + STATE_INTERVAL_S
            self._checkpoint(self.last_ack)
        due = [self._ack_due, self._state_due]
        snapshots = self._snapshots
        if snapshots is not None:
            # Between transactions only: a chunk read while one is half streamed could miss
            # the changes of it sent already (cdc.incremental, the running transactions).
            if now >= self._snapshot_due and self._txn is None:
                snapshots.tick(now)
                # While a snapshot runs, its next step is looked for often.
                self._snapshot_due = now + (0.005 if snapshots.busy else 0.5)
            due.append(self._snapshot_due)
        if self._heartbeats:
            if now >= self._heartbeat_due:
                self._heartbeat_due = now + self._heartbeat_interval_s
                self._heartbeats.publish(self.last_ack)
            due.append(self._heartbeat_due)
        if self._observer.measures_lag:
            if now >= self._lag_due:
                self._lag_due = now + LAG_INTERVAL_S
                self._report_lag()
            due.append(self._lag_due)
        self._next_duty = min(due)

    def _commit(self, idle: Lsn | None = None) -> None:
        """Commit the open Kafka transaction with the position it completes; ``idle``: a
        keepalive's position with nothing in flight, held from now on too."""
        position = self._position
        assert position is not None
        moved = idle is not None and position.idle(idle)
        if moved or self._publisher.txn_open:
            self._publisher.commit(replace(position.held, updated_at=time.time()))

    def _split(self) -> None:
        """A PostgreSQL transaction streams longer than a Kafka transaction may stay open:
        commit what it sent so far, with its version, so a restart sends only the rest."""
        assert self._position is not None
        commit_lsn = Lsn(int(self._commit_lsn_header))
        self._position.split(commit_lsn, self._order - 1)
        self._splits += 1
        log.info(
            "a PostgreSQL transaction is split across Kafka transactions: read_committed "
            "consumers see its first %d records before the rest (transaction.timeout.ms "
            "bounds how long one Kafka transaction stays open)",
            self._order,
            extra={"slot": self._slot, "lsn": str(commit_lsn)},
        )
        self._commit()

    def _finish(self) -> None:
        """Wait for Kafka, acknowledge what it holds, tell the followers how far that is."""
        self._publisher.flush(timeout_s=60)
        if self._eos and self._txn is None:
            self._commit()
        self._acknowledge(force=True)
        if self._heartbeats:
            self._heartbeats.final(self.last_ack)

    def _acknowledge(self, *, force: bool = False) -> None:
        acked = self._publisher.acked_lsn()
        # The publisher's acknowledged LSN may be a snapshot's position: only commits count.
        while self._commits and acked is not None and self._commits[0] <= acked:
            self.acked_commit = self._commits.popleft()
        idle = self._idle_lsn if self._publisher.idle() and self._txn is None else None
        if self._eos and idle is not None:
            # Confirmed to PostgreSQL only once Kafka holds it as the position.
            self._commit(idle)
            idle = None
        candidate = self.last_ack
        for lsn in (acked, idle):
            if lsn is not None and (candidate is None or lsn > candidate):
                candidate = lsn
        if candidate is not None and (force or candidate != self.last_ack):
            if self._snapshots is not None:
                self._snapshots.save_pending()  # shapes seen before the position they follow
            self._repl.acknowledge(candidate)
            self.last_ack = candidate
            self._observer.on_acknowledged(candidate)

    def _keep_session(self) -> None:
        """While waiting on Kafka: answer the server in time (wal_sender_timeout)."""
        self._repl.keep_alive()

    def _slot_wal(self) -> str:
        """How much WAL the slot retains for the reader (an outage line's last part)."""
        try:
            current = current_wal_lsn(self._catalog.conn)
        except (psycopg.Error, ConnectionFailed) as e:
            return f"the server's WAL position is unknown ({e})"
        held = max(0, current - self.last_ack) if self.last_ack is not None else 0
        return f"slot {self._slot} retains {held / 2**20:.1f} MiB of WAL (from {self.last_ack})"

    def _report_lag(self) -> None:
        try:
            current = current_wal_lsn(self._catalog.conn)
        except psycopg.Error as e:
            log.warning("cannot read the server's WAL position: %s", e, extra={"slot": self._slot})
            return
        if self.last_ack is not None:
            self._observer.on_lag(max(0, current - self.last_ack))

    # --- messages -----------------------------------------------------------------------

    def _handle(self, frame: XLogData) -> None:
        msg = pgoutput.decode(frame.payload, self._proto)
        if (
            self._eos
            and self._txn is not None
            and self._order > 0
            and isinstance(msg, pgoutput.DATA_MESSAGES)
            and self._publisher.split_due()
        ):
            self._split()
        if isinstance(msg, pgoutput.Insert):
            self._change(frame, msg.relation_id, "c", None, msg.new)
        elif isinstance(msg, pgoutput.Update):
            self._update(frame, msg)
        elif isinstance(msg, pgoutput.Delete):
            self._change(frame, msg.relation_id, "d", msg.old, None)
        elif isinstance(msg, pgoutput.Begin):
            self._txn = self._publisher.begin(msg.final_lsn)
            self._order = 0
            self._xid = msg.xid
            self._commit_ts_us = msg.commit_ts_us
            self._commit_lsn_header = str(msg.final_lsn.value).encode()
            self._per_table.clear()
        elif isinstance(msg, pgoutput.Commit):
            if self._txn is not None:
                self._publisher.close_txn(self._txn, msg.end_lsn)
                self._unsent = self._unsent or self._order > 0
            self._txn = None
            if self._position is not None:
                self._position.transaction_ended(Lsn(int(self._commit_lsn_header)), msg.end_lsn)
            if self._snapshots is not None:
                self._snapshots.committed(self._xid)
            # Debezium's source.sequence[0]: where the last commit record ends.
            self._last_commit_lsn = msg.end_lsn.value
            self._commits.append(msg.end_lsn)
        elif isinstance(msg, pgoutput.Relation):
            self._relation(msg)
        elif isinstance(msg, pgoutput.Truncate):
            for rid in msg.relation_ids:
                self._truncate(frame, rid)
        elif isinstance(msg, pgoutput.LogicalMessage) and self._snapshots is not None:
            # Watermarks and signals (cdc.incremental); other prefixes are not ours.
            self._snapshots.on_message(msg)
        # Origin and Type messages carry nothing we publish.

    def _relation(self, msg: pgoutput.Relation) -> None:
        schema = self._catalog.from_relation(msg)
        self._relations[msg.relation_id] = schema
        topic = self._encoder.topic(schema)
        name = f"{schema.schema}.{schema.table}"
        self._table_topics.ensure(topic, keyless=not schema.key_columns, table=name)
        self._topics[msg.relation_id] = topic
        if self._captured is not None and (schema.schema, schema.table) not in self._captured:
            self._captured.add((schema.schema, schema.table))
            if self._snapshots is not None:
                self._snapshots.table_joined((schema.schema, schema.table), "while streaming")
            else:
                warn_not_snapshotted(name, "while streaming")
        if self._snapshots is not None:
            self._snapshots.relation_seen((schema.schema, schema.table), shape(schema))

    def _truncate(self, frame: XLogData, relation_id: int) -> None:
        table = self._table(relation_id)
        topic = self._topics[relation_id]
        if self._snapshots is not None:
            self._snapshots.on_truncate((table.schema, table.table))
        # One order for all of the truncate's records (they name distinct keys), so the
        # transaction's later records get the same orders however many keys it deletes: a
        # replay deletes fewer (those the first run's later records made newer), and shifted
        # orders could lose to the first run's records in a follower rebuilt from compaction.
        at = self._order
        version = (int(self._commit_lsn_header), at)

        def send(topic: str, key: bytes | None, value: bytes | None) -> None:
            self._send_to(topic, key, value, order=at)

        deleted = self._truncates.write(table, topic, self._source(frame), send, version)
        self._order = at + 1
        for _ in range(deleted):
            self._count("d")
        if "t" not in self._skipped:
            self._count("t")

    def _keep_alive(self) -> None:
        """During a long truncate: keep the replication session and delivery reports going."""
        self._repl.keep_alive()
        self._publisher.poll(0)

    def _table(self, relation_id: int) -> TableSchema:
        try:
            return self._relations[relation_id]
        except KeyError as e:
            raise SlotError(
                f"change for relation {relation_id} arrived before its Relation message"
            ) from e

    def _source(self, frame: XLogData) -> SourceInfo:
        return SourceInfo(
            self._commit_ts_us, "false", self._xid, frame.wal_start.value, self._last_commit_lsn
        )

    def _transaction(self, relation_id: int) -> TransactionInfo | None:
        if not self._tx_metadata:
            return None
        n = self._per_table.get(relation_id, 0) + 1
        self._per_table[relation_id] = n
        txid = f"{self._xid}:{self._commit_lsn_header.decode()}"
        return TransactionInfo(txid, self._order + 1, n)

    def _send_to(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        extra_headers: Headers = (),
        *,
        order: int | None = None,
    ) -> None:
        """Queue a record of the open transaction with its version: the next order, or
        ``order`` (a truncate's records share one, see :meth:`_truncate`)."""
        if self._txn is None:
            raise SlotError("a change arrived outside a transaction")
        at = self._order if order is None else order
        if order is None:
            self._order += 1
        position = self._position
        if (
            position is not None
            and position.replaying
            and position.skips(int(self._commit_lsn_header), at)
        ):
            return  # Kafka holds it, committed by an earlier run (cdc.committed)
        headers = version_headers(self._commit_lsn_header, at)
        if extra_headers:
            headers = [*headers, *extra_headers]
        self._publisher.send(self._txn, topic, key, value, headers)

    def _count(self, op: str) -> None:
        self.events += 1
        self._observer.on_event(op)

    def _change(
        self,
        frame: XLogData,
        relation_id: int,
        op: str,
        before: Row | None,
        after: Row | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
    ) -> None:
        table = self._table(relation_id)
        signal = self._signal_table
        if (
            signal is not None
            and op == "c"
            and after is not None
            and (table.schema, table.table) == signal
        ):
            self._signal_row(table, after)
        if op in self._skipped:
            return
        source = self._source(frame)
        if after is not None and UNCHANGED_TOAST in after:
            # Followers keep what they hold for these columns, whatever their placeholder.
            names = [table.columns[i].name for i in unchanged_columns(after)]
            headers = [*headers, (HEADER_UNCHANGED, encode_unchanged_header(names))]
        tx = self._transaction(relation_id) if self._tx_metadata else None
        try:
            if key is None:
                # One call converts the key columns once, for both the key and the value.
                key, value = self._encoder.encode_change(table, op, before, after, source, tx)
            else:
                value = self._encoder.encode_value(table, op, before, after, source, tx)
        except SchemaError as e:
            # Nothing after this change is acknowledged: the run stops here, and a restart
            # with the setting the message names carries it.
            raise SchemaError(
                f"cannot encode a change of {table.schema}.{table.table} "
                f"(key {_key_text(table, after if after is not None else before)}, "
                f"commit LSN {Lsn(int(self._commit_lsn_header))}): {e}"
            ) from e
        topic = self._topics[relation_id]
        self._send_to(topic, key, value, headers)
        self._count(op)
        snapshots = self._snapshots
        if snapshots is not None and topic == snapshots.window_topic and table.key_columns:
            # An incremental snapshot chunk of this table is asked for: the streamed change
            # wins over its row (cdc.incremental.merge), compared by the key's identity.
            row = after if after is not None else before
            assert row is not None
            snapshots.observe(key_identity(row, self._key_positions(table)), self._xid)
        if op == "d":
            # A tombstone, so compaction drops the key (a keyless table's has a null key,
            # like Debezium's; its topic is not compacted), with the delete's headers (a key
            # change's __debezium.newkey) as Debezium writes it.
            self._send_to(topic, key, None, headers)

    def _signal_row(self, table: TableSchema, row: Row) -> None:
        assert self._snapshots is not None
        values = {c.name: row[i] for i, c in enumerate(table.columns)}
        self._snapshots.on_signal_row(
            {
                k: v.decode() if isinstance(v, bytes) else v if isinstance(v, str) else None
                for k, v in values.items()
            },
            f"{Lsn(int(self._commit_lsn_header))}#{self._order}",
        )

    def _key_positions(self, table: TableSchema) -> list[int]:
        positions = self._positions.get(id(table))
        if positions is None or positions[0] is not table:
            names = [c.name for c in table.columns]
            positions = self._positions[id(table)] = (
                table,
                [names.index(k) for k in table.key_columns],
            )
        return positions[1]

    def _update(self, frame: XLogData, msg: pgoutput.Update) -> None:
        table = self._table(msg.relation_id)
        new = msg.new
        if msg.old is not None and UNCHANGED_TOAST in new:
            # The old row (whole under REPLICA IDENTITY FULL, else the key, which the server
            # sends when the key has a TOASTed value) holds what the new one left out.
            new = fill_from_old(new, msg.old)
        if table.key_columns and UNCHANGED_TOAST in new:
            require_key(table, new)
        if msg.old is not None and table.key_columns:
            old_key = self._encoder.encode_key(table, msg.old)
            new_key = self._encoder.encode_key(table, new)
            if old_key != new_key:
                self._key_change(frame, msg, table, new, old_key, new_key)
                return
        if self._complete_toast:
            # Log compaction keeps only a key's newest event: with the placeholder in it,
            # a follower rebuilt from the compacted topic would never see the value.
            new = self._fill_unchanged_toast(table, new)
        self._change(frame, msg.relation_id, "u", msg.old, new)

    def _key_change(
        self,
        frame: XLogData,
        msg: pgoutput.Update,
        table: TableSchema,
        new: Row,
        old_key: bytes | None,
        new_key: bytes | None,
    ) -> None:
        """A primary-key change: Debezium emits a delete (+ tombstone) for the old key and a
        create for the new one, each naming the other key in a header."""
        # No follower holds the new key yet, so the marker would lose the value; see
        # cdc.toast for why the current value is safe to use. Without complete_unchanged_toast
        # the placeholder stays, as Debezium writes it.
        if self._complete_toast:
            new = self._fill_unchanged_toast(table, new)
        rid = msg.relation_id
        assert msg.old is not None  # a key change is seen through the old row
        encoder = self._encoder
        new_header = encoder.key_header(table, new, new_key)
        old_header = encoder.key_header(table, msg.old, old_key)
        self._change(
            frame, rid, "d", msg.old, None, key=old_key, headers=[("__debezium.newkey", new_header)]
        )
        self._change(
            frame, rid, "c", None, new, key=new_key, headers=[("__debezium.oldkey", old_header)]
        )

    def _fill_unchanged_toast(self, table: TableSchema, row: Row) -> Row:
        """``row`` with its unchanged TOAST values read by key (see :mod:`cdc.toast`)."""
        if UNCHANGED_TOAST not in row:  # the usual case, checked in C
            return row
        missing = unchanged_columns(row)
        if not missing:
            return row
        return fetch_current(self._catalog.conn, table, row, missing, self._xid)


def _key_text(table: TableSchema, row: Row | None) -> str:
    """The key columns' values of a row, as PostgreSQL sent them, for an error line."""
    if row is None or not table.key_columns:
        return "none"
    names = [c.name for c in table.columns]
    return ", ".join(f"{c}={row[names.index(c)]!r}" for c in table.key_columns if c in names)
