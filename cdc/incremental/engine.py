"""The incremental snapshots beside the streaming loop: the queue, one chunk at a time, the
merge at each high watermark, progress, retries.

The streamer calls :meth:`IncrementalSnapshots.on_message` for logical messages,
:meth:`~IncrementalSnapshots.observe` for every change of :attr:`window_topic` while a chunk is
asked for, :meth:`~IncrementalSnapshots.committed` after each transaction,
:meth:`~IncrementalSnapshots.on_truncate`, :meth:`~IncrementalSnapshots.table_joined` and
:meth:`~IncrementalSnapshots.tick` (between transactions). A chunk is read on the worker
(:mod:`cdc.incremental.worker`); everything else, the merge (:mod:`cdc.incremental.merge`)
and the publishing of a chunk at its high watermark H included, runs on the streaming
thread. A chunk is one tracked transaction ending at H (the slot never moves past H before
Kafka holds it); its progress is saved (:mod:`cdc.incremental.queue`) once Kafka acknowledged
it, in chunk order. Memory is two chunks at most: one read while one waits for Kafka.

Nothing is dropped that should be retried: a chunk that fails for a reason the next attempt
may not meet (a timeout, a lock, a lost connection, a transaction not yet visible) is read
again after a backoff (0.1 s doubling to 30 s; a statement timeout also halves the chunk),
and a snapshot is dropped only when its table is gone or no longer captured, cannot be
keyed, or its filter is refused, each with one line.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from cdc import pgoutput
from cdc.incremental.channels import Accepted, SignalIntake
from cdc.incremental.cursor import Chunk, ChunkPublisher, ChunkSource, Cursor
from cdc.incremental.merge import KeyId, Unconfirmed, Window, merge_chunk
from cdc.incremental.progress import Progress
from cdc.incremental.queue import SnapshotsState, Table, TableSnapshot
from cdc.incremental.requests import Catalog, EngineConfig, Requests
from cdc.incremental.signals import SIGNAL_PREFIX
from cdc.incremental.worker import WATERMARK_PREFIX, ChunkFailure, ChunkRequest
from cdc.observer import NullObserver, StreamObserver
from cdc.schema_changes import Shape, describe
from pgcdc.core.contract import table_topic, version_headers
from pgcdc.core.lsn import Lsn
from pgcdc.core.qualified_names import quote_table, split_qualified

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 2.0  # the publication, the signal topic and the signal table's grants
RETRY_BASE_S = 0.1
RETRY_MAX_S = 30.0
REGROW_AFTER = 4  # chunks that fit before a chunk halved by a timeout doubles again


class IncrementalSnapshots:
    """Runs the queued incremental snapshots beside the streaming loop (module docstring)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        state: SnapshotsState,
        save: Callable[[SnapshotsState], None],
        chunks: ChunkSource,
        publisher: ChunkPublisher,
        catalog: Catalog,
        intake: SignalIntake,
        ensure_topic: Callable[[str, str], None] = lambda topic, table: None,
        observer: StreamObserver | None = None,
        tty: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.state = state
        self._save = save
        self._chunks = chunks
        self._publisher = publisher
        self._catalog = catalog
        self.intake = intake
        self._ensure_topic = ensure_topic
        self._observer: StreamObserver = observer or NullObserver()
        self._progress = Progress(self._observer, tty)
        self._clock = clock
        self.signal_table = config.signal_table
        self._run = uuid.uuid4().hex[:12]
        self._seq = 0
        self._open: Chunk | None = None
        self._acking: collections.deque[tuple[Chunk, Any]] = collections.deque()
        self._cursors: dict[int, Cursor] = {}  # by id() of the TableSnapshot
        self._next_poll = 0.0
        self._pending = False  # relation_seen changed the state since it was saved
        self._looked: dict[str, Shape] | None = None  # the catalog's shapes at the last poll
        self.requests = Requests(config, state, catalog, intake, self._stopped)
        self.window_topic: str | None = None
        # Transactions committed and not visible yet may have been streamed by an earlier
        # run (whose slot position is past them): they count as streamed before any chunk.
        self._unconfirmed = Unconfirmed()
        for xid in catalog.committed_invisible():
            self._unconfirmed.add(xid)
        self.retries = 0  # chunks read again (a failure, or a transaction not yet visible)
        self.dropped = 0  # chunk rows dropped for a change inside their window (this run)
        self.chunks = 0  # chunks published and acknowledged (this run)
        self.published = 0  # chunks published at their high watermark (this run)
        self.invisible = 0  # chunks read again: a transaction streamed before was invisible

    # --- state --------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A snapshot is queued, or a chunk is in flight."""
        return bool(self.state.queue) or self._open is not None or bool(self._acking)

    def save(self) -> None:
        """Write the state and wait for Kafka: a signal or a chunk counts once it is saved."""
        self._save(self.state)
        self._pending = False

    def close(self) -> None:
        self._progress.close()
        self.intake.close()
        self._chunks.close()
        self._catalog.close()

    # --- requests -----------------------------------------------------------------------

    def carry_out(self, accepted: Accepted) -> None:
        """Carry out a signal that passed its channel's proof, then save the state (before
        the signal itself is acknowledged)."""
        self.requests.carry_out(accepted)
        self.save()

    def relation_seen(self, table: Table, columns: Shape) -> None:
        """A Relation message showed ``table``'s columns (:func:`cdc.schema_changes.shape`):
        the first shape of a table is recorded; another one than recorded snapshots the
        table again (:meth:`Requests.schema_changed`). Saved before the change that follows
        the message can be acknowledged (:meth:`save_pending`, before each acknowledgment:
        a storm of DDL costs one write an acknowledgment, not one a message)."""
        name = quote_table(table)
        before = self.state.relations.get(name)
        if before == columns:
            return
        self.state.relations[name] = columns
        if before is not None:
            self.requests.schema_changed(table, describe(before, columns))
        self._pending = True

    def _poll_shapes(self) -> None:
        """Shapes from the catalog: a table altered and not written since sends no Relation
        message. The first look of a run compares with the recorded shapes (a DDL while the
        reader was stopped); later ones act only on a shape that changed since the last look,
        so a shape the catalog and pgoutput were to describe apart costs one snapshot a run,
        not one every look."""
        seen = self._catalog.shapes()
        for name, columns in seen.items():
            if name not in self.state.relations:
                continue  # recorded at start or by its first Relation message
            before = self._looked.get(name) if self._looked is not None else None
            if self._looked is not None and before == columns:
                continue
            if self.state.relations[name] != columns:
                self.relation_seen(split_qualified(name), columns)
        self._looked = seen

    def save_pending(self) -> None:
        """Save what :meth:`relation_seen` changed, if anything: called before the slot's
        position is acknowledged past the message (a crash before it sees the message
        again)."""
        if self._pending:
            self.save()

    def topic_lost(self, table: Table, why: str) -> None:
        """``table``'s topic lost what it held: snapshot it again (the caller saves)."""
        self.requests.topic_lost(table, why)

    def table_joined(self, table: Table, when: str, *, save: bool = True) -> None:
        """``table`` is captured now and was not before: snapshot it (unless turned off).

        A transaction running when it joined may have changed it before (changes PostgreSQL
        does not publish) and commit later: its chunks wait until those are visible."""
        self.requests.table_joined(table, when)
        for xid in self._catalog.visibility().invisible:
            self._unconfirmed.add(xid)
        if save:
            self.save()

    def _stopped(self, snap: TableSnapshot) -> None:
        self._cursors.pop(id(snap), None)
        self._progress.done(snap)
        if self._open is not None and self._open.snap is snap:
            self._open = None  # the worker's result, if any, is left unused
            self.window_topic = None

    # --- stream hooks -------------------------------------------------------------------

    def on_message(self, msg: pgoutput.LogicalMessage) -> None:
        if msg.prefix == WATERMARK_PREFIX:
            content = bytes(msg.content)
            chunk = self._open
            if chunk is None:
                return  # an earlier run's, or a stopped chunk's
            if content == chunk.low:
                chunk.window.in_window = True
            elif content == chunk.high:
                self._merge(chunk, msg.lsn)
        elif msg.prefix == SIGNAL_PREFIX:
            accepted = self.intake.wal(bytes(msg.content), str(msg.lsn))
            if accepted is not None:
                self.carry_out(accepted)

    def on_signal_row(self, values: dict[str, Any], position: str) -> None:
        """A row inserted into the signal table (Debezium's id, type, data)."""
        accepted = self.intake.table_row(values, position)
        if accepted is not None:
            self.carry_out(accepted)

    def observe(self, key: KeyId, xid: int | None) -> None:
        """A streamed change of the asked-for chunk's table touched ``key`` (its identity)."""
        chunk = self._open
        if chunk is not None:
            chunk.window.note(key, xid)

    def committed(self, xid: int | None) -> None:
        """The stream has passed this transaction's commit."""
        self._unconfirmed.add(xid)

    def on_truncate(self, table: Table) -> None:
        chunk = self._open
        if chunk is not None and chunk.snap.key == table:
            chunk.window.truncated = True

    # --- driving ------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Finish acknowledged chunks, look for signals and new tables, ask for a chunk."""
        if self._acking:
            self._publisher.poll(0)
            while self._acking:
                chunk, txn = self._acking[0]
                if not self._publisher.holds(txn):
                    break
                self._acking.popleft()
                self._finish(chunk)
        if now >= self._next_poll:
            self._next_poll = now + POLL_INTERVAL_S
            self._poll()
        asked = self._open
        if asked is not None and asked.future is not None and asked.future.done():
            error = asked.future.exception()
            if error is not None:
                self._open = None
                self.window_topic = None
                self._failed(asked.snap, asked.cursor, error)
        # One chunk read while at most one waits for Kafka: memory stays two chunks.
        if self._open is None and len(self._acking) <= 1 and self.state.queue:
            self._ask_chunk(now)

    def _poll(self) -> None:
        for accepted in self.intake.poll_topic():
            self.carry_out(accepted)
        self.intake.commit_topic()
        self.intake.recheck_table()
        for table in self.requests.captured(refresh=True):
            if self.state.captured is not None and table not in self.state.captured:
                self.table_joined(table, "while streaming")
        self._poll_shapes()
        if len(self._unconfirmed):
            self._unconfirmed.prune(self._catalog.visibility())

    def _failed(self, snap: TableSnapshot, cursor: Cursor, error: BaseException) -> None:
        """A chunk could not be read: retry it after a backoff, or drop the snapshot."""
        if not isinstance(error, ChunkFailure):
            raise error
        if error.retry:
            self._retry_later(cursor, error.reason, shrink=error.timeout)
            return
        log.warning(
            "incremental snapshot of %s dropped: %s",
            snap.name,
            error.reason,
            extra={"table": snap.name},
        )
        self._cursors.pop(id(snap), None)
        self._progress.done(snap)
        if snap in self.state.queue:
            self.state.queue.remove(snap)
            self.save()

    def _retry_later(self, cursor: Cursor, reason: str, *, shrink: bool = False) -> None:
        self.retries += 1
        cursor.attempts += 1
        delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (cursor.attempts - 1))
        cursor.retry_at = self._clock() + delay
        if shrink and cursor.rows > 1:
            cursor.rows = max(1, cursor.rows // 2)
            cursor.fits = 0
        log.warning(
            "incremental snapshot of %s: chunk %d read again in %.1f s (%d rows): %s",
            cursor.snap.name,
            cursor.chunks + 1,
            delay,
            cursor.rows,
            reason,
            extra={"table": cursor.snap.name},
        )

    def _cursor(self, snap: TableSnapshot) -> Cursor | None:
        cursor = self._cursors.get(id(snap))
        return cursor if cursor is not None and cursor.snap is snap else None

    def _ask_chunk(self, now: float) -> None:
        """Ask the worker for the next chunk of the first snapshot with rows left to read."""
        for snap in self.state.queue:
            found = self._cursor(snap)
            if found is None or not found.exhausted:
                break
        else:
            return  # every queued table is read to its end; its last chunk waits for Kafka
        cursor = found if found is not None else self._begin_table(snap)
        if self._clock() < cursor.retry_at:
            return
        self._seq += 1
        low, high = f"{self._run}:{self._seq}:low", f"{self._run}:{self._seq}:high"
        chunk = Chunk(
            snap,
            cursor,
            cursor.chunks + 1,
            low.encode(),
            high.encode(),
            Window(self._unconfirmed.frozen()),
        )
        ranges = snap.ranges
        request = ChunkRequest(
            snap.schema,
            snap.table,
            snap.where,
            cursor.next_key,
            None if ranges is None else ranges[cursor.range_index],
            cursor.rows,
            cursor.count,
            chunk.low,
            chunk.high,
            self.config.publication,
            self.config.filter_functions,
        )
        self._open = chunk
        self.window_topic = cursor.topic
        chunk.future = self._chunks.submit(request)

    def _begin_table(self, snap: TableSnapshot) -> Cursor:
        """This run's first chunk of ``snap``: its topic, its cursor, a log line."""
        topic = table_topic(self.config.topic_prefix, snap.schema, snap.table)
        self._ensure_topic(topic, snap.name)
        cursor = Cursor(
            snap,
            topic,
            snap.last_key,
            snap.range_index,
            snap.chunks,
            count=not snap.estimated_rows,
            rows=self.config.chunk_rows,
        )
        self._cursors[id(snap)] = cursor
        if snap.chunks:
            log.info(
                "incremental snapshot of %s resumed after chunk %d (%d rows done, key > %s)",
                snap.name,
                snap.chunks,
                snap.rows,
                ",".join(snap.last_key or []),
                extra={"table": snap.name},
            )
        else:
            log.info(
                "incremental snapshot of %s started (%s, %d per chunk)",
                snap.name,
                f"~{snap.estimated_rows} rows" if snap.estimated_rows else "rows counted",
                self.config.chunk_rows,
                extra={"table": snap.name},
            )
        return cursor

    # --- the high watermark, on the streaming thread --------------------------------------

    def _merge(self, chunk: Chunk, high: Lsn) -> None:
        """The high watermark: publish what is left of the chunk, versioned at H."""
        self._open = None
        self.window_topic = None
        assert chunk.future is not None
        cursor = chunk.cursor
        try:
            # The worker wrote H after its read: at most the encoding is left to wait for.
            read = chunk.future.result()
        except ChunkFailure as e:
            self._failed(chunk.snap, cursor, e)
            return
        if self._cursor(chunk.snap) is not cursor or chunk.snap not in self.state.queue:
            return  # stopped meanwhile
        if read.estimated is not None:
            chunk.snap.estimated_rows = read.estimated
            cursor.count = False
        kept = merge_chunk(read.ids, read.seen, chunk.window)
        self._unconfirmed.prune(read.seen)
        if kept is None:
            # A transaction the stream passed before the request was not visible to the
            # SELECT yet (its commit record was written, its visibility not): its change is
            # not in these rows and will not come again. Read the chunk again, later.
            self.invisible += 1
            self._retry_later(cursor, "a transaction it depends on was not yet visible to it")
            return
        txn = self._publisher.begin(high)
        # pgoutput gives the end of the watermark's record; a commit record may start right
        # there. One byte less still follows every commit before the watermark.
        lsn_header = str(high.value - 1).encode()
        keys, values = read.keys, read.values
        # The stream waits for this loop: the per-record work is done once.
        self._publisher.send_many(
            txn,
            cursor.topic,
            [(keys[i], values[i], version_headers(lsn_header, n)) for n, i in enumerate(kept)],
        )
        on_event = self._observer.on_event
        for _ in range(len(kept)):
            on_event("r")
        self._publisher.close_txn(txn, high)
        self.published += 1
        chunk.read = read
        chunk.emitted, chunk.dropped = len(kept), len(read.ids) - len(kept)
        cursor.attempts = 0
        cursor.fits += 1
        if cursor.rows < self.config.chunk_rows and cursor.fits >= REGROW_AFTER:
            cursor.rows, cursor.fits = min(self.config.chunk_rows, cursor.rows * 2), 0
        cursor.chunks = chunk.number
        if (
            read.complete
            and chunk.snap.ranges is not None
            and (cursor.range_index + 1 < len(chunk.snap.ranges))
        ):
            cursor.range_index += 1  # the next range, from its start
            cursor.next_key = None
        else:
            cursor.next_key = read.last_key if read.last_key is not None else cursor.next_key
            cursor.exhausted = read.complete
        chunk.next_key, chunk.range_index = cursor.next_key, cursor.range_index
        chunk.complete = cursor.exhausted
        self._acking.append((chunk, txn))

    def _finish(self, chunk: Chunk) -> None:
        """The chunk is in Kafka: record the progress (the next run starts after it)."""
        snap = chunk.snap
        self.dropped += chunk.dropped
        if snap not in self.state.queue:
            return  # stopped meanwhile
        snap.chunks = chunk.number
        snap.rows += chunk.emitted
        snap.last_key = chunk.next_key
        snap.range_index = chunk.range_index
        if chunk.complete:
            self.state.queue.remove(snap)
            self._cursors.pop(id(snap), None)
        self.save()
        self.chunks += 1
        read = chunk.read
        assert read is not None
        log.info(
            "incremental snapshot chunk %d of %s done: %d rows, %d dropped for changes in "
            "its window, key up to %s",
            chunk.number,
            snap.name,
            chunk.emitted,
            chunk.dropped,
            ",".join(read.last_key or chunk.next_key or []),
            extra={"table": snap.name},
        )
        self._progress.chunk(snap, read.table, complete=chunk.complete)
        if chunk.complete:
            log.info(
                "incremental snapshot of %s complete: %d rows in %d chunks",
                snap.name,
                snap.rows,
                snap.chunks,
                extra={"table": snap.name},
            )
