"""What gets queued: signals carried out, tables that join the captured set, stops.

A request is refused, with one line, when its table is not in the publication (a snapshot
of a table the stream does not carry would publish rows no change ever follows) or its
filter fails the checks of :mod:`cdc.incremental.filters`. What is queued is saved
(:mod:`cdc.incremental.queue`) by the caller before the signal that asked is acknowledged.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cdc.incremental.channels import Accepted, SignalIntake
from cdc.incremental.filters import FilterRefused
from cdc.incremental.merge import ReadSnapshot
from cdc.incremental.queue import KeyRange, SnapshotsState, Table, TableSnapshot
from cdc.incremental.signals import SnapshotRequest, StopRequest
from cdc.schema_changes import Shape
from cdc.table_checks import warn_not_snapshotted
from pgcdc.core.errors import SchemaError
from pgcdc.core.qualified_names import quote_table

log = logging.getLogger(__name__)


class Catalog(Protocol):
    """What the engine asks PostgreSQL on its own connection."""

    def captured(self) -> list[Table]: ...
    def shapes(self) -> dict[str, Shape]: ...
    def visibility(self) -> ReadSnapshot: ...
    def committed_invisible(self) -> frozenset[int]: ...
    def check_filter(self, table: Table, where: str) -> str: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineConfig:
    topic_prefix: str
    publication: str
    chunk_rows: int = 10_000
    snapshot_new_tables: bool = True
    snapshot_on_schema_change: bool = True
    signal_table: Table | None = None
    filter_functions: tuple[str, ...] = ()
    # The reader reads from a standby (PostgreSQL 16+): it cannot write watermarks.
    on_standby: bool = False


class Requests:
    """Queues and stops snapshots in ``state`` (the caller saves it)."""

    def __init__(
        self,
        config: EngineConfig,
        state: SnapshotsState,
        catalog: Catalog,
        intake: SignalIntake,
        on_stopped: Callable[[TableSnapshot], None],
    ) -> None:
        self.config = config
        self.state = state
        self._catalog = catalog
        self._intake = intake
        self._on_stopped = on_stopped
        self._captured: list[Table] | None = None

    def captured(self, *, refresh: bool = False) -> list[Table]:
        """The tables the publication covers (as last read, or read now)."""
        if self._captured is None or refresh:
            self._captured = self._catalog.captured()
        return self._captured

    def carry_out(self, accepted: Accepted) -> None:
        """Carry out a signal that passed its channel's proof (the caller saves)."""
        signal = accepted.signal
        if isinstance(signal, SnapshotRequest):
            for table in signal.tables:
                self.request(
                    table,
                    where=signal.where(table),
                    ranges=signal.key_ranges(table),
                    via=accepted.via,
                    signal_id=signal.id,
                    source=accepted.source,
                )
        elif isinstance(signal, StopRequest):
            self.stop(signal.tables, signal.id)
        self._intake.remember(accepted)

    def request(
        self,
        table: Table,
        *,
        where: str | None = None,
        ranges: list[KeyRange] | None = None,
        via: str = "api",
        signal_id: str | None = None,
        source: str = "the reader",
    ) -> bool:
        """Queue a snapshot of a captured ``table`` (restricted to ``ranges`` if given);
        False, with one line, when it is refused."""
        name = f"{table[0]}.{table[1]}"
        sid = signal_id or uuid.uuid4().hex

        def refuse(reason: str) -> bool:
            log.warning(
                "incremental snapshot of %s refused: %s (signal %s from %s)",
                name,
                reason,
                sid,
                source,
                extra={"table": name},
            )
            return False

        if self.config.on_standby:
            return refuse(
                "the reader reads from a standby, which cannot write the snapshot's watermarks "
                "into the WAL: take it with a reader on the primary"
            )
        if table not in self.captured(refresh=table not in (self._captured or ())):
            return refuse(f"it is not in publication {self.config.publication}")
        if ranges is not None and not ranges:
            return refuse("it names no key range")
        if where:
            try:
                where = self._catalog.check_filter(table, where)
            except (FilterRefused, SchemaError) as e:
                return refuse(f"its filter is refused: {e}")
        snap = TableSnapshot(sid, *table, where=where, via=via, ranges=ranges)
        if any(
            (s.schema, s.table, s.where, s.ranges) == (snap.schema, snap.table, where, ranges)
            and s.chunks == 0
            and s.last_key is None
            for s in self.state.queue
        ):
            log.info("incremental snapshot of %s already queued", name, extra={"table": name})
            return True
        self.state.queue.append(snap)
        log.info(
            "incremental snapshot of %s queued (%s%s)",
            name,
            via,
            f", where {where}" if where else "",
            extra={"table": name},
        )
        return True

    def stop(self, tables: Sequence[Table], signal_id: str) -> None:
        """Stop the snapshots of ``tables`` (every one when empty)."""
        wanted = set(tables)
        keep = [s for s in self.state.queue if wanted and s.key not in wanted]
        for s in self.state.queue:
            if s not in keep:
                log.info("incremental snapshot of %s stopped (signal %s)", s.name, signal_id)
                self._on_stopped(s)
        self.state.queue = keep

    def schema_changed(self, table: Table, what: str) -> None:
        """``table``'s columns changed (``what``, :func:`cdc.schema_changes.describe`):
        snapshot it again from its first key (unless turned off), whatever was queued for
        it, so that every row reaches the followers in its new shape."""
        name = quote_table(table)
        if table == self.config.signal_table:
            return
        way = f"`cdc snapshot {name}` (on the primary) publishes every row in its new shape"
        if not self.config.snapshot_on_schema_change:
            log.warning(
                "table %s changed (%s): rows not changed since keep their old shape in the "
                "followers (postgres.snapshot_on_schema_change is off); %s",
                name,
                what,
                way,
                extra={"table": name},
            )
            return
        if self.config.on_standby:
            log.error(
                "table %s changed (%s): rows not changed since keep their old shape in the "
                "followers, and a reader on a standby cannot snapshot it again; %s",
                name,
                what,
                way,
                extra={"table": name},
            )
            return
        for s in self.state.queue:
            if s.key == table:
                self._on_stopped(s)  # rows it published are in the old shape: from the start
        self.state.queue = [s for s in self.state.queue if s.key != table]
        log.warning(
            "table %s changed (%s): snapshotting it again, incrementally, while streaming, so "
            "that rows not changed since reach the followers in the new shape",
            name,
            what,
            extra={"table": name},
        )
        self.state.queue.append(TableSnapshot(uuid.uuid4().hex, *table, via="schema_change"))

    def topic_lost(self, table: Table, why: str) -> None:
        """``table``'s topic lost what it held (cdc.topic_ids): snapshot the table again
        from its first key, whatever was queued for it, so the topic holds it again."""
        name = f"{table[0]}.{table[1]}"
        if self.config.on_standby:
            raise SchemaError(
                f"{why}; a reader on a standby cannot snapshot {name} again (its watermarks "
                f"go into the WAL): run `cdc snapshot {name}` against the primary, or read "
                "from the primary"
            )
        self.state.queue = [s for s in self.state.queue if s.key != table]
        log.warning(
            "%s: snapshotting %s again, incrementally, while streaming",
            why,
            name,
            extra={"table": name},
        )
        self.state.queue.append(TableSnapshot(uuid.uuid4().hex, *table, via="topic_lost"))

    def table_joined(self, table: Table, when: str) -> None:
        """``table`` is captured now and was not before: snapshot it (unless turned off)."""
        if self.state.captured is None:
            self.state.captured = []
        if table in self.state.captured:
            return
        self.state.captured.append(table)
        self._captured = None
        name = f"{table[0]}.{table[1]}"
        if table == self.config.signal_table:
            return
        if not self.config.snapshot_new_tables:
            warn_not_snapshotted(name, when)
            return
        if self.config.on_standby:
            log.error(
                "table %s joined the captured tables %s, but its rows are not snapshotted: the "
                "reader reads from a standby, which cannot write the snapshot's watermarks into "
                "the WAL (cdc snapshot %s from a reader on the primary copies them)",
                name,
                when,
                name,
                extra={"table": name},
            )
            return
        log.warning(
            "table %s joined the captured tables %s: its changes from now on are captured and "
            "its rows are snapshotted incrementally",
            name,
            when,
            extra={"table": name},
        )
        self.state.queue.append(TableSnapshot(uuid.uuid4().hex, *table, via="joined"))
