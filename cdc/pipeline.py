"""The one place that wires the reader together.

replication → pgoutput decode → table schemas (catalog) → event encoding → Kafka → slot ack.

Order of a checkpoint: records are produced as they are decoded (a transaction is never
buffered); delivery reports mark transactions complete; the slot's flush LSN then advances to
the end of the last transaction that is complete together with all before it
(:meth:`cdc.publisher.Publisher.acked_lsn`). When nothing is pending, a keepalive's position is
acknowledged too, so an idle slot (or one whose changes are all filtered out) keeps advancing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg

from cdc import pgoutput
from cdc.catalog import SchemaCatalog
from cdc.connection import connect, current_database, current_wal_lsn
from cdc.metrics import ReaderMetrics
from cdc.publisher import Publisher, TxnTracker
from cdc.replication import Keepalive, ReplicationConnection, XLogData
from cdc.slots import (
    Action,
    check_wal_level,
    drop_slot,
    ensure_publication,
    plan_start,
    slot_info,
    wait_slot_released,
)
from cdc.snapshot import Snapshotter
from cdc.state import Phase, ReaderState, StateStore
from cdc.toast import fetch_current, fill_from_old, unchanged_columns
from pgcdc.core.contract import (
    HEARTBEAT_LSN_FIELD,
    HEARTBEAT_SERVER_FIELD,
    heartbeat_topic,
    version_headers,
)
from pgcdc.core.errors import SlotError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import Settings
from pgcdc.core.values import RawValue
from schemas.envelope import EventEncoder
from schemas.model import SourceInfo, TableSchema, TransactionInfo

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, str | bytes | None]]

ACK_INTERVAL_S = 0.2  # how often at most a new flush position is sent to the server
STATE_INTERVAL_S = 10.0  # how often the acked LSN is written to the state topic
SLOT_RELEASE_TIMEOUT_S = 15.0  # how long to wait for a slot held by a dead predecessor


@dataclass
class RunResult:
    """What a run did; the CLI prints it and tests read it."""

    action: str
    snapshot_rows: int = 0
    events: int = 0
    acked_lsn: Lsn | None = None
    target_lsn: Lsn | None = None


class Pipeline:
    """Snapshot if needed, then stream changes to Kafka until stopped (or caught up)."""

    def __init__(
        self,
        settings: Settings,
        *,
        until_current: bool = False,
        stop: threading.Event | None = None,
        metrics: ReaderMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.until_current = until_current
        self.stop = stop or threading.Event()
        self.metrics = metrics
        self._dsn = settings.postgres.dsn.get_secret_value()
        self._slot = settings.postgres.slot_name

    # --- startup ------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Run the reader; returns when stopped, caught up (``until_current``) or done."""
        pg = self.settings.postgres
        admin = connect(self._dsn)
        with admin:
            check_wal_level(admin)
            database = current_database(admin)
            publisher = Publisher(self.settings.kafka)
            publisher.probe(timeout_s=5.0)
            if self.metrics is not None:
                publisher.latency_observer = self.metrics.delivery_latency.observe
            store = StateStore(
                self.settings.kafka.bootstrap_servers,
                self.settings.kafka.topic_prefix,
                self.settings.kafka.replication_factor,
            )
            store.ensure_topic()
            state = store.load(database, self._slot)
            tables = ensure_publication(admin, pg.publication_name, pg.tables)
            target = current_wal_lsn(admin) if self.until_current else None
            # A predecessor killed a moment ago may still hold the slot: give its walsender
            # time to notice, instead of failing with "in use".
            info = wait_slot_released(admin, self._slot, SLOT_RELEASE_TIMEOUT_S)
            plan = plan_start(pg.snapshot_mode, self._slot, info, state)
            if plan.reason:
                log.warning(plan.reason, extra={"slot": self._slot})
            catalog = SchemaCatalog(admin)
            encoder = EventEncoder(
                self.settings.schema_, self.settings.kafka.topic_prefix, database
            )
            result = RunResult(plan.action.value, target_lsn=target)

            def snapshotter() -> Snapshotter:
                return Snapshotter(
                    self._dsn,
                    encoder=encoder,
                    publisher=publisher,
                    load_schema=catalog.load_table_in,
                    workers=pg.snapshot_workers,
                    chunk_rows=pg.snapshot_chunk_rows,
                    stop=self.stop,
                )

            if plan.action is Action.NOTHING:
                log.info("nothing to do: %s", plan.reason)
                return result
            if plan.action is Action.SNAPSHOT_ONLY:
                snap = snapshotter().run(tables, None, None)
                store.save(
                    ReaderState(
                        self._slot,
                        database,
                        Phase.SNAPSHOT_ONLY_DONE,
                        snap.position,
                        None,
                        time.time(),
                    )
                )
                result.snapshot_rows = snap.rows
                return result

            repl = ReplicationConnection(
                self._dsn, application_name="cdc", status_interval_s=pg.status_interval_s
            )
            try:
                if plan.drop_existing_slot:
                    drop_slot(admin, self._slot)
                if plan.action is Action.SNAPSHOT:
                    created = repl.create_slot(self._slot, export_snapshot=True)
                    start = created.consistent_point
                    store.save(
                        ReaderState(self._slot, database, Phase.SNAPSHOT, start, None, time.time())
                    )
                    snap = snapshotter().run(tables, created.snapshot_name, start)
                    result.snapshot_rows = snap.rows
                    store.save(
                        ReaderState(
                            self._slot, database, Phase.STREAMING, start, start, time.time()
                        )
                    )
                elif plan.action is Action.NEW_SLOT:
                    created = repl.create_slot(self._slot, export_snapshot=False)
                    start = created.consistent_point
                    store.save(
                        ReaderState(
                            self._slot, database, Phase.STREAMING, start, start, time.time()
                        )
                    )
                else:
                    info = slot_info(admin, self._slot)
                    if info is None:
                        raise SlotError(f"replication slot {self._slot} disappeared at startup")
                    start = info.confirmed_flush_lsn or Lsn(0)
                    if state is None:
                        store.save(
                            ReaderState(
                                self._slot, database, Phase.STREAMING, None, start, time.time()
                            )
                        )
                streamer = _Streamer(
                    self, repl, publisher, encoder, catalog, store, database, target
                )
                repl.start(self._slot, pg.publication_name, start, proto_version=pg.proto_version)
                streamer.run(start)
                result.events = streamer.events
                result.acked_lsn = streamer.last_ack
                store.save(
                    ReaderState(
                        self._slot, database, Phase.STREAMING, None, streamer.last_ack, time.time()
                    )
                )
            finally:
                repl.close()
                if pg.drop_slot_on_exit:
                    # The walsender releases the slot only once it has seen our connection
                    # close; drop_slot waits for that rather than failing with "in use".
                    drop_slot(admin, self._slot, SLOT_RELEASE_TIMEOUT_S)
                    store.reset(database, self._slot)
                store.close()
            return result


class _Streamer:
    """The streaming loop: one decoded message at a time, acknowledging as Kafka confirms."""

    def __init__(
        self,
        pipeline: Pipeline,
        repl: ReplicationConnection,
        publisher: Publisher,
        encoder: EventEncoder,
        catalog: SchemaCatalog,
        store: StateStore,
        database: str,
        target: Lsn | None,
    ) -> None:
        self.p = pipeline
        self.repl = repl
        self.publisher = publisher
        self.encoder = encoder
        self.catalog = catalog
        self.store = store
        self.database = database
        self.target = target
        self.proto = pipeline.settings.postgres.proto_version
        self.tx_metadata = pipeline.settings.schema_.provide_transaction_metadata
        self.relations: dict[int, TableSchema] = {}
        self.topics: dict[int, str] = {}
        self.txn: TxnTracker | None = None
        self.order = 0
        self.xid: int | None = None
        self.commit_ts_us = 0
        self.commit_lsn_header = b"0"
        self.last_commit_lsn: int | None = None
        self.per_table: dict[int, int] = {}
        self.idle_lsn: Lsn | None = None
        self.last_ack: Lsn | None = None
        self.events = 0
        self._counters: dict[str, Any] = {}
        self.complete_toast = pipeline.settings.postgres.complete_unchanged_toast
        self.heartbeat_topic = heartbeat_topic(pipeline.settings.kafka)
        if self.heartbeat_topic:
            # One partition: a follower reads every heartbeat in order from one place.
            publisher.ensure_topics([self.heartbeat_topic], partitions=1)

    def run(self, start: Lsn) -> None:
        self.last_ack = start
        last_ack_sent = 0.0
        last_state = time.monotonic()
        last_heartbeat = 0.0
        last_lag = 0.0
        heartbeat_interval = self.p.settings.kafka.heartbeat_interval_s
        while True:
            if self.p.stop.is_set():
                log.info("stop requested: flushing and acknowledging")
                # An open transaction stays unacknowledged: the next run replays all of it.
                self.publisher.flush(timeout_s=60)
                self._acknowledge(force=True)
                self._final_heartbeat()
                break
            msg = self.repl.read(0.1)
            if isinstance(msg, XLogData):
                self._handle(msg)
            else:
                # Between frames: serve delivery reports (send() also polls every 1,024
                # records, so a busy stream does not pay for a poll per message).
                self.publisher.poll(0)
                if isinstance(msg, Keepalive) and self.txn is None and self.publisher.idle():
                    # Everything before wal_end has reached us and is in Kafka: safe to confirm.
                    self.idle_lsn = msg.wal_end
            now = time.monotonic()
            if now - last_ack_sent >= ACK_INTERVAL_S:
                last_ack_sent = now
                self._acknowledge()
            if now - last_state >= STATE_INTERVAL_S:
                last_state = now
                self.store.save(
                    ReaderState(
                        self.p._slot,
                        self.database,
                        Phase.STREAMING,
                        None,
                        self.last_ack,
                        time.time(),
                    ),
                    wait=False,
                )
            if self.heartbeat_topic and now - last_heartbeat >= heartbeat_interval:
                last_heartbeat = now
                self._heartbeat()
            if self.p.metrics is not None and now - last_lag >= 5.0:
                last_lag = now
                self._update_lag()
            if (
                self.target is not None
                and self.last_ack is not None
                and self.last_ack >= self.target
            ):
                self.publisher.flush(timeout_s=60)
                self._acknowledge(force=True)
                self._final_heartbeat()
                log.info(
                    "caught up with %s; stopping", self.target, extra={"lsn": str(self.last_ack)}
                )
                break

    # --- acknowledgment -----------------------------------------------------------------

    def _acknowledge(self, *, force: bool = False) -> None:
        acked = self.publisher.acked_lsn()
        candidate = self.last_ack
        for lsn in (acked, self.idle_lsn if self.publisher.idle() and self.txn is None else None):
            if lsn is not None and (candidate is None or lsn > candidate):
                candidate = lsn
        if candidate is not None and (force or candidate != self.last_ack):
            self.repl.acknowledge(candidate)
            self.last_ack = candidate
            if self.p.metrics is not None:
                self.p.metrics.acked_lsn.set(candidate.value)

    def _update_lag(self) -> None:
        assert self.p.metrics is not None
        try:
            row = self.catalog.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        except psycopg.Error as e:
            log.warning("cannot read the server's WAL position: %s", e)
            return
        if row and self.last_ack is not None:
            self.p.metrics.lag_bytes.set(max(0, Lsn.parse(row[0]) - self.last_ack))

    def _final_heartbeat(self) -> None:
        """On the way out, tell the followers how far everything is in Kafka: without it, a
        short run (``--until current``) could leave their watermark behind its changes."""
        if self.heartbeat_topic:
            self._heartbeat()
            self.publisher.flush(timeout_s=30)

    def _heartbeat(self) -> None:
        """Publish the last acknowledged LSN (followers' read-your-writes watermark).

        ``last_ack`` only ever moves to a position whose transactions are all acknowledged by
        Kafka (or to an idle keepalive's position, with nothing in flight), so every event
        committed before the reported LSN is already in its topic when this is produced.
        """
        assert self.heartbeat_topic is not None
        name = self.p.settings.kafka.topic_prefix
        self.publisher.produce_plain(
            self.heartbeat_topic,
            orjson.dumps({HEARTBEAT_SERVER_FIELD: name}),
            orjson.dumps(
                {
                    "ts_ms": int(time.time() * 1000),
                    HEARTBEAT_LSN_FIELD: self.last_ack.value if self.last_ack else None,
                }
            ),
        )

    # --- messages -----------------------------------------------------------------------

    def _handle(self, frame: XLogData) -> None:
        msg = pgoutput.decode(frame.payload, self.proto)
        if isinstance(msg, pgoutput.Insert):
            self._change(frame, msg.relation_id, "c", None, msg.new)
        elif isinstance(msg, pgoutput.Update):
            self._update(frame, msg)
        elif isinstance(msg, pgoutput.Delete):
            self._change(frame, msg.relation_id, "d", msg.old, None)
        elif isinstance(msg, pgoutput.Begin):
            self.txn = self.publisher.begin(msg.final_lsn)
            self.order = 0
            self.xid = msg.xid
            self.commit_ts_us = msg.commit_ts_us
            self.commit_lsn_header = str(msg.final_lsn.value).encode()
            self.per_table.clear()
        elif isinstance(msg, pgoutput.Commit):
            if self.txn is not None:
                self.publisher.close_txn(self.txn, msg.end_lsn)
            self.txn = None
            self.last_commit_lsn = msg.commit_lsn.value
        elif isinstance(msg, pgoutput.Relation):
            schema = self.catalog.from_relation(msg)
            self.relations[msg.relation_id] = schema
            topic = self.encoder.topic(schema)
            self.publisher.ensure_topics([topic])
            self.topics[msg.relation_id] = topic
        elif isinstance(msg, pgoutput.Truncate):
            for rid in msg.relation_ids:
                table = self._table(rid)
                self._send(rid, None, self.encoder.encode_truncate(table, self._source(frame)))
                self._count("t")
        # Origin, Type and logical messages carry nothing we publish.

    def _table(self, relation_id: int) -> TableSchema:
        try:
            return self.relations[relation_id]
        except KeyError as e:
            raise SlotError(
                f"change for relation {relation_id} arrived before its Relation message"
            ) from e

    def _source(self, frame: XLogData) -> SourceInfo:
        return SourceInfo(
            self.commit_ts_us, "false", self.xid, frame.wal_start.value, self.last_commit_lsn
        )

    def _transaction(self, relation_id: int) -> TransactionInfo | None:
        if not self.tx_metadata:
            return None
        n = self.per_table.get(relation_id, 0) + 1
        self.per_table[relation_id] = n
        return TransactionInfo(f"{self.xid}:{self.commit_lsn_header.decode()}", self.order + 1, n)

    def _send(
        self,
        relation_id: int,
        key: bytes | None,
        value: bytes | None,
        extra_headers: Headers = (),
    ) -> None:
        if self.txn is None:
            raise SlotError("a change arrived outside a transaction")
        headers: list[tuple[str, str | bytes | None]] = [
            *version_headers(self.commit_lsn_header, self.order),
            *extra_headers,
        ]
        self.publisher.send(self.txn, self.topics[relation_id], key, value, headers)
        self.order += 1

    def _count(self, op: str) -> None:
        self.events += 1
        if self.p.metrics is not None:
            counter = self._counters.get(op)
            if counter is None:
                counter = self._counters[op] = self.p.metrics.events.labels(op)
            counter.inc()

    def _change(
        self,
        frame: XLogData,
        relation_id: int,
        op: str,
        before: tuple[RawValue, ...] | None,
        after: tuple[RawValue, ...] | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
    ) -> None:
        table = self._table(relation_id)
        source = self._source(frame)
        if key is None:
            # One call converts the key columns once, for both the key and the value.
            key, value = self.encoder.encode_change(
                table, op, before, after, source, self._transaction(relation_id)
            )
        else:
            value = self.encoder.encode_value(
                table, op, before, after, source, self._transaction(relation_id)
            )
        self._send(relation_id, key, value, headers)
        self._count(op)
        if op == "d" and key is not None:
            self._send(relation_id, key, None)  # tombstone, so compaction drops the key

    def _update(self, frame: XLogData, msg: pgoutput.Update) -> None:
        table = self._table(msg.relation_id)
        new = msg.new
        if msg.old is not None and msg.old_kind == "O" and unchanged_columns(new):
            # REPLICA IDENTITY FULL: the old row is complete, so this is exact.
            new = fill_from_old(new, msg.old)
        if msg.old is not None and table.key_columns:
            old_key = self.encoder.encode_key(table, msg.old)
            new_key = self.encoder.encode_key(table, new)
            if old_key != new_key:
                # A primary-key change: Debezium emits a delete (+ tombstone) for the old key
                # and a create for the new one, each naming the other key in a header.
                missing = unchanged_columns(new)
                if missing:
                    # No follower holds the new key yet, so the marker would lose the value;
                    # see cdc.toast for why the current value is safe to use.
                    new = fetch_current(self.catalog.conn, table, new, missing, self.xid)
                self._change(
                    frame,
                    msg.relation_id,
                    "d",
                    msg.old,
                    None,
                    key=old_key,
                    headers=[("__debezium.newkey", new_key)],
                )
                self._change(
                    frame,
                    msg.relation_id,
                    "c",
                    None,
                    new,
                    key=new_key,
                    headers=[("__debezium.oldkey", old_key)],
                )
                return
        if self.complete_toast:
            missing = unchanged_columns(new)
            if missing:
                # Log compaction keeps only a key's newest event: with the placeholder in it,
                # a follower rebuilt from the compacted topic would never see the value.
                new = fetch_current(self.catalog.conn, table, new, missing, self.xid)
        self._change(frame, msg.relation_id, "u", msg.old, new)
