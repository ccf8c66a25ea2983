"""The replication connection: the only module that talks the streaming replication protocol.

One psycopg 3 connection opened with ``replication=database``. Replication commands go
through ``execute`` (psycopg uses the simple query protocol for queries without
parameters, which is all a walsender accepts). After ``START_REPLICATION`` the connection
is in COPY_BOTH mode: frames are read with the NON-blocking ``get_copy_data(1)`` after
waiting on the socket ourselves, because the blocking form holds up the process's other
Python threads. Standby status updates go out with ``put_copy_data`` + ``flush``.

Not thread-safe: one thread owns a ReplicationConnection.
"""

from __future__ import annotations

import logging
import re
import selectors
import struct
import time
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import pq

from cdc.connection import connect, describe_dsn, first_line
from cdc.connection_lost import connection_lost
from cdc.pgoutput import PG_EPOCH_OFFSET_US
from pgcdc.core.errors import CdcError, ConfigError, ConnectionFailed, SlotError
from pgcdc.core.lsn import ZERO, Lsn

log = logging.getLogger(__name__)

_XLOG_HEAD: Final = struct.Struct("!QQq")  # after 'w': wal start, wal end, server clock
_KEEPALIVE: Final = struct.Struct("!QqB")  # after 'k': wal end, server clock, reply requested
_STATUS: Final = struct.Struct("!cQQQqB")  # 'r', write, flush, apply, clock, reply requested
_XLOG_HEADER_SIZE: Final = 1 + _XLOG_HEAD.size

# Slot and publication names we accept: what PostgreSQL allows for slots, and plain
# identifiers for publications, so neither ever needs quoting tricks.
_NAME = re.compile(r"^[a-z0-9_]{1,63}$")

# SQLSTATEs that mean "the slot is the problem".
_UNDEFINED_OBJECT: Final = "42704"
_DUPLICATE_OBJECT: Final = "42710"
_OBJECT_IN_USE: Final = "55006"
_INVALID_PARAMETER_VALUE: Final = "22023"
_FEATURE_NOT_SUPPORTED: Final = "0A000"
_OBJECT_NOT_IN_PREREQUISITE_STATE: Final = "55000"


@dataclass(frozen=True, slots=True)
class SlotCreated:
    """A new logical slot. ``snapshot_name`` stays valid until the next command on the
    connection that created it."""

    slot_name: str
    consistent_point: Lsn
    snapshot_name: str | None


@dataclass(frozen=True, slots=True)
class XLogData:
    """One pgoutput message. ``wal_end`` is the server's WAL end, not the message's."""

    wal_start: Lsn
    wal_end: Lsn
    server_time_us: int  # µs since the UNIX epoch
    payload: memoryview | bytes


@dataclass(frozen=True, slots=True)
class Keepalive:
    """The server's heartbeat. Replies it requests are sent by :meth:`ReplicationConnection.read`."""

    wal_end: Lsn
    server_time_us: int
    reply_requested: bool


_lsn = Lsn.from_wire


def _now_pg_us() -> int:
    return time.time_ns() // 1000 - PG_EPOCH_OFFSET_US


def _check_name(kind: str, name: str) -> None:
    if not _NAME.match(name):
        raise ConfigError(
            f"{kind} name {name!r} must be 1-63 lower-case letters, digits and underscores"
        )


def classify(e: psycopg.Error, action: str, pgconn: pq.abc.PGconn | None = None) -> CdcError:
    """Map a psycopg error raised while ``action`` to our hierarchy, as one clear line.

    ``pgconn`` is the established connection the error came from, if any: a connection libpq
    gave up on is lost, whatever the error's words (:mod:`cdc.connection_lost`).
    """
    msg = first_line(e)
    sqlstate = getattr(e, "sqlstate", None)
    lowered = msg.lower()
    if "wal_level" in lowered:
        return ConfigError(f"{action}: {msg} (set wal_level = logical and restart PostgreSQL)")
    if "max_wal_senders" in lowered or "max_replication_slots" in lowered:
        return ConfigError(f"{action}: {msg}")
    if sqlstate in (_INVALID_PARAMETER_VALUE, _FEATURE_NOT_SUPPORTED):
        # An option START_REPLICATION or the plugin refused (e.g. proto_version too high).
        return ConfigError(f"{action}: {msg}")
    if sqlstate == _OBJECT_IN_USE or "is active for pid" in lowered:
        return SlotError(f"{action}: {msg} (another reader is using this slot; stop it first)")
    if sqlstate in (_UNDEFINED_OBJECT, _DUPLICATE_OBJECT) or "replication slot" in lowered:
        return SlotError(f"{action}: {msg}")
    if "publication" in lowered:
        return SlotError(f"{action}: {msg}")
    if (
        "authentication failed" in lowered
        or "pg_hba.conf" in lowered
        or ("role" in lowered and "does not exist" in lowered)
        or ("database" in lowered and "does not exist" in lowered)
        or "permission denied" in lowered
        or "must be superuser or replication role" in lowered
    ):
        # Retrying cannot fix credentials or a missing database: fail fast.
        return ConfigError(f"{action}: {msg}")
    if connection_lost(e, pgconn):
        # A server restart or failover seen mid-stream: over TLS, or as a COPY result psycopg
        # cannot class (no SQLSTATE, libpq's own words), only the connection's state tells.
        return ConnectionFailed(f"{action}: {msg}")
    if isinstance(e, psycopg.OperationalError):
        # A server that cannot be reached (refused, timed out) or a transient refusal.
        return ConnectionFailed(f"{action}: {msg}")
    return SlotError(f"{action}: {msg}")


class ReplicationConnection:
    """A logical replication session on one slot, speaking pgoutput."""

    def __init__(
        self,
        dsn: str,
        *,
        application_name: str = "cdc",
        status_interval_s: float = 10.0,
        connect_timeout_s: int = 10,
    ) -> None:
        """Open the replication connection. Raises ConnectionFailed (retryable) if the server
        cannot be reached, ConfigError for credentials or a missing database."""
        self.status_interval_s = status_interval_s
        self._where = describe_dsn(dsn)
        self._flushed = ZERO
        self._received = 0  # highest wal_start seen (an int: compared on every frame)
        self._last_status = 0.0  # monotonic time of the last status update sent
        self._streaming = False
        self._selector: selectors.BaseSelector | None = None
        action = f"cannot open a replication connection to {self._where}"
        self._conn = connect(
            dsn,
            replication="database",
            application_name=application_name,
            connect_timeout_s=connect_timeout_s,
            on_error=lambda e: classify(e, action),
        )
        self._pgconn = self._conn.pgconn
        # PostgreSQL 18's pgoutput skips a publication that does not exist at a change's
        # place in the WAL with a WARNING and goes on: nothing of its tables is sent, and a
        # reader that went on would acknowledge past their changes. read() stops instead.
        self._skipped_publication: str | None = None
        self._conn.add_notice_handler(self._on_notice)

    def _on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """A NoticeResponse from the walsender (libpq hands it over while reading COPY data)."""
        message = diag.message_primary or ""
        if diag.sqlstate == _OBJECT_NOT_IN_PREREQUISITE_STATE and "publication" in message:
            self._skipped_publication = message
        log.warning(
            "the server says: %s",
            message,
            extra={"severity": diag.severity, "detail": diag.message_detail},
        )

    # ----------------------------------------------------------------- commands

    def _execute(self, sql: str, action: str) -> psycopg.Cursor[Any]:
        if self._streaming:
            raise SlotError(f"{action}: the connection is streaming; open another one")
        try:
            return self._conn.execute(sql.encode())
        except psycopg.Error as e:
            raise classify(e, action, self._pgconn) from e

    def _command(self, sql: str, action: str) -> list[tuple[Any, ...]]:
        cur = self._execute(sql, action)
        try:
            return cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            raise classify(e, action, self._pgconn) from e

    def identify_system(self) -> tuple[str, int, Lsn, str | None]:
        """IDENTIFY_SYSTEM: (system id, timeline, current WAL flush position, database)."""
        rows = self._command("IDENTIFY_SYSTEM", f"IDENTIFY_SYSTEM on {self._where}")
        systemid, timeline, xlogpos, dbname = rows[0]
        return str(systemid), int(timeline), Lsn.parse(str(xlogpos)), dbname

    def create_slot(
        self, slot: str, *, export_snapshot: bool, failover: bool = False
    ) -> SlotCreated:
        """Create a permanent pgoutput slot. With ``export_snapshot`` the returned snapshot
        can be imported (SET TRANSACTION SNAPSHOT) until the next command on THIS
        connection, so read the tables before calling anything else here. ``failover``
        (PostgreSQL 17+, on a primary) makes it a failover slot, which standbys with
        ``sync_replication_slots`` keep a copy of."""
        _check_name("slot", slot)
        mode = "export" if export_snapshot else "nothing"
        options = f"SNAPSHOT '{mode}'" + (", FAILOVER true" if failover else "")
        rows = self._command(
            f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput ({options})",
            f"cannot create replication slot {slot!r} on {self._where}",
        )
        name, consistent_point, snapshot_name, _plugin = rows[0]
        created = SlotCreated(str(name), Lsn.parse(str(consistent_point)), snapshot_name)
        log.info(
            "created replication slot",
            extra={
                "slot": slot,
                "lsn": str(created.consistent_point),
                "snapshot": snapshot_name,
                "failover": failover,
            },
        )
        return created

    def set_failover(self, slot: str, failover: bool) -> None:
        """ALTER_REPLICATION_SLOT … (FAILOVER …) (PostgreSQL 17+; the slot must be idle)."""
        _check_name("slot", slot)
        self._command(
            f"ALTER_REPLICATION_SLOT {slot} (FAILOVER {'true' if failover else 'false'})",
            f"cannot change replication slot {slot!r} on {self._where}",
        )
        log.info("replication slot altered", extra={"slot": slot, "failover": failover})

    def drop_slot(self, slot: str) -> None:
        """Drop a slot (waiting if another session is just releasing it)."""
        _check_name("slot", slot)
        self._command(
            f"DROP_REPLICATION_SLOT {slot} WAIT", f"cannot drop replication slot {slot!r}"
        )
        log.info("dropped replication slot", extra={"slot": slot})

    def start(
        self,
        slot: str,
        publication: str,
        start_lsn: Lsn,
        *,
        proto_version: int = 1,
        messages: bool = False,
        streaming: bool | str = False,
    ) -> None:
        """START_REPLICATION on ``slot`` from ``start_lsn`` (the server starts from the slot's
        confirmed position if that is later). Streaming (True: ``on``; or ``parallel``,
        protocol 4) needs ``proto_version >= 2``."""
        _check_name("slot", slot)
        _check_name("publication", publication)
        if streaming and proto_version < 2:
            raise ConfigError("streaming in-progress transactions needs proto_version >= 2")
        options = [f"proto_version '{int(proto_version)}'", f"publication_names '{publication}'"]
        if messages:
            options.append("messages 'true'")
        if streaming:
            mode = "on" if streaming is True else str(streaming)
            if mode not in ("on", "parallel"):
                raise ConfigError(f"streaming {mode!r}: use on or parallel")
            options.append(f"streaming '{mode}'")
        sql = f"START_REPLICATION SLOT {slot} LOGICAL {start_lsn} ({', '.join(options)})"
        action = f"cannot start replication from slot {slot!r} on {self._where}"
        cur = self._execute(sql, action)
        if cur.pgresult is None or cur.pgresult.status != pq.ExecStatus.COPY_BOTH:
            raise SlotError(f"{action}: the server did not enter COPY BOTH mode")
        self._streaming = True
        self._flushed = max(self._flushed, start_lsn)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._pgconn.socket, selectors.EVENT_READ)
        self._last_status = time.monotonic()
        log.info("replication started", extra={"slot": slot, "lsn": str(start_lsn)})

    # ----------------------------------------------------------------- streaming

    @property
    def flushed_lsn(self) -> Lsn:
        """The highest LSN acknowledged as durable downstream."""
        return self._flushed

    def read(self, timeout_s: float) -> XLogData | Keepalive | None:
        """The next frame, or None when ``timeout_s`` passes without one.

        ``timeout_s`` 0 polls: it takes in what the socket holds already, never waits.
        Answers keepalives that ask for a reply at once and sends a status update every
        ``status_interval_s``, so a caller that keeps calling read() keeps the session alive.
        """
        if not self._streaming or self._selector is None:
            raise SlotError("read() before start(): the connection is not streaming")
        # The deadline is only computed once we have to wait: frames already buffered are
        # returned with one clock read each.
        pgconn = self._pgconn
        selector = self._selector
        deadline: float | None = None
        while True:
            now = time.monotonic()
            if now - self._last_status >= self.status_interval_s:
                self._send_status()
            try:
                nbytes, buf = pgconn.get_copy_data(1)
            except psycopg.Error as e:
                raise self._lost(e) from e
            if self._skipped_publication is not None:
                raise self._publication_skipped()
            if nbytes > 0:
                frame = self._parse(buf)
                if frame is not None:
                    return frame
                continue
            if nbytes == -1:
                raise self._stream_ended()
            if deadline is None:
                # Nothing buffered: take in what the socket holds already (libpq reads
                # without blocking; cheaper than asking the selector first, and what a
                # busy stream needs), then look again.
                deadline = now + timeout_s
                try:
                    pgconn.consume_input()
                except psycopg.Error as e:
                    raise self._lost(e) from e
                continue
            # Still nothing: wait for the socket, but not past the deadline or the next
            # status update.
            remaining = deadline - now
            if remaining <= 0:
                return None
            wait = min(remaining, max(0.0, self._last_status + self.status_interval_s - now))
            if selector.select(wait):
                try:
                    pgconn.consume_input()
                except psycopg.Error as e:
                    raise self._lost(e) from e

    def _parse(self, buf: memoryview) -> XLogData | Keepalive | None:
        kind = buf[0]
        if kind == 0x77:  # 'w'
            start, end, clock = _XLOG_HEAD.unpack_from(buf, 1)
            if start > self._received:
                self._received = start
            return XLogData(
                _lsn(start), _lsn(end), clock + PG_EPOCH_OFFSET_US, buf[_XLOG_HEADER_SIZE:]
            )
        if kind == 0x6B:  # 'k'
            end, clock, reply = _KEEPALIVE.unpack_from(buf, 1)
            if reply:
                # The server disconnects us after wal_sender_timeout without an answer.
                self._send_status()
            return Keepalive(_lsn(end), clock + PG_EPOCH_OFFSET_US, bool(reply))
        log.warning("ignoring unknown replication frame", extra={"kind": chr(kind)})
        return None

    def acknowledge(self, flush_lsn: Lsn) -> None:
        """Record that everything up to ``flush_lsn`` (a Commit's end_lsn) is durable
        downstream, and tell the server at once: it may then recycle that WAL."""
        if flush_lsn <= self._flushed:
            return
        self._flushed = flush_lsn
        if self._streaming:
            self._send_status()

    def request_keepalive(self) -> None:
        """Ask the server for a keepalive now (a status update with the reply flag): its
        position says how far decoding has read, so an idle reader learns at once that it
        has caught up instead of waiting for the server's own keepalive (wal_sender_timeout
        / 2, 30 s by default)."""
        if self._streaming:
            self._send_status(reply_requested=True)

    def keep_alive(self) -> None:
        """Send a status update if one is due: a caller busy for long between reads (a
        TRUNCATE of a large table) stays within the server's wal_sender_timeout."""
        if self._streaming and time.monotonic() - self._last_status >= self.status_interval_s:
            self._send_status()

    def _send_status(self, reply_requested: bool = False) -> None:
        flushed = self._flushed.value
        written = max(self._received, flushed)
        message = _STATUS.pack(b"r", written, flushed, flushed, _now_pg_us(), reply_requested)
        try:
            while not self._pgconn.put_copy_data(message):
                self._wait_writable()
            while self._pgconn.flush():
                self._wait_writable()
        except psycopg.Error as e:
            raise self._lost(e) from e
        self._last_status = time.monotonic()
        log.debug("sent standby status", extra={"lsn": str(self._flushed)})

    def _wait_writable(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._pgconn.socket, selectors.EVENT_WRITE)
            if not sel.select(self.status_interval_s):
                raise ConnectionFailed(
                    f"replication connection to {self._where}: socket not writable for "
                    f"{self.status_interval_s}s"
                )

    def _publication_skipped(self) -> SlotError:
        """Stop on PostgreSQL 18's skipped publication (what 17 and before raise as an error),
        before anything after it is acknowledged."""
        self._streaming = False
        return SlotError(
            f"replication stream from {self._where}: {self._skipped_publication} (it does not "
            "exist at this point in the WAL, so the server would skip its tables' changes); "
            "nothing after it is acknowledged. Create the publication again and restart; "
            "changes made while it did not exist cannot be streamed: to recover them, take a "
            "new snapshot (`cdc reset-state --drop-slot`, then `cdc run`)"
        )

    def _lost(self, e: psycopg.Error) -> CdcError:
        self._streaming = False
        return classify(e, f"replication connection to {self._where} failed", self._pgconn)

    def _stream_ended(self) -> CdcError:
        """The server ended COPY: find out why from the results that follow."""
        self._streaming = False
        error: CdcError = ConnectionFailed(
            f"replication stream from {self._where} ended by the server"
        )
        while (res := self._pgconn.get_result()) is not None:
            if res.status == pq.ExecStatus.FATAL_ERROR:
                exc = psycopg.errors.error_from_result(res, encoding=self._conn.info.encoding)
                error = classify(exc, f"replication stream from {self._where} failed", self._pgconn)
        return error

    def close(self) -> None:
        """Send a final status update with the flushed LSN, end the stream, disconnect."""
        if self._conn.closed:
            return
        try:
            if self._streaming:
                self._send_status()
                self._pgconn.put_copy_end()
                self._pgconn.flush()
        except (psycopg.Error, CdcError) as e:
            log.warning(
                "could not send the final status update",
                extra={"lsn": str(self._flushed), "error": first_line(e)},
            )
        finally:
            self._streaming = False
            if self._selector is not None:
                self._selector.close()
                self._selector = None
            self._conn.close()

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
