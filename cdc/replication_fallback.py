"""A minimal stand-in for ``cdc.replication`` with the same interface.

Written by the reader's author so the pipeline could run while ``cdc/replication.py`` was being
written in parallel; :mod:`cdc.pipeline` prefers the real module whenever it is importable.
It follows the recipe checked on these machines: psycopg 3 ``replication="database"``, a
COPY_BOTH cursor after ``START_REPLICATION``, non-blocking ``get_copy_data``, and standby
status updates (``'r'``) sent with ``put_copy_data``.
"""

from __future__ import annotations

import select
import struct
import time
from dataclasses import dataclass

import psycopg

from cdc.errors import ConnectionFailed, SlotError
from cdc.lsn import Lsn

_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in µs since the UNIX epoch


@dataclass(frozen=True)
class SlotCreated:
    slot_name: str
    consistent_point: Lsn
    snapshot_name: str | None


@dataclass(frozen=True)
class XLogData:
    wal_start: Lsn
    wal_end: Lsn
    server_time_us: int
    payload: bytes


@dataclass(frozen=True)
class Keepalive:
    wal_end: Lsn
    server_time_us: int
    reply_requested: bool


class ReplicationConnection:
    """One logical replication connection."""

    def __init__(
        self, dsn: str, *, application_name: str = "cdc", status_interval_s: float = 10.0
    ) -> None:
        try:
            self._conn = psycopg.connect(
                dsn,
                autocommit=True,
                replication="database",
                application_name=application_name,
                connect_timeout=5,
            )
        except psycopg.OperationalError as e:
            raise ConnectionFailed(f"replication connection failed: {e}") from e
        self._interval = status_interval_s
        self._flushed = Lsn(0)
        self._received = Lsn(0)
        self._last_status = 0.0
        self._streaming = False

    @property
    def flushed_lsn(self) -> Lsn:
        return self._flushed

    def identify_system(self) -> tuple[str, int, Lsn, str]:
        row = self._conn.execute("IDENTIFY_SYSTEM").fetchone()
        assert row is not None
        return str(row[0]), int(row[1]), Lsn.parse(row[2]), str(row[3])

    def create_slot(self, slot: str, *, export_snapshot: bool) -> SlotCreated:
        mode = "export" if export_snapshot else "nothing"
        try:
            row = self._conn.execute(
                f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput (SNAPSHOT '{mode}')"
            ).fetchone()
        except psycopg.Error as e:
            raise SlotError(f"cannot create replication slot {slot}: {e}") from e
        assert row is not None
        return SlotCreated(row[0], Lsn.parse(row[1]), row[2])

    def drop_slot(self, slot: str) -> None:
        self._conn.execute(f"DROP_REPLICATION_SLOT {slot}")

    def start(
        self,
        slot: str,
        publication: str,
        start_lsn: Lsn,
        *,
        proto_version: int = 1,
        messages: bool = False,
        streaming: bool = False,
    ) -> None:
        # Names are validated as lower-case identifiers by the settings.
        opts = f"proto_version '{proto_version}', publication_names '{publication}'"
        if messages:
            opts += ", messages 'true'"
        if streaming:
            opts += ", streaming 'on'"
        try:
            self._conn.execute(f"START_REPLICATION SLOT {slot} LOGICAL {start_lsn} ({opts})")
        except psycopg.Error as e:
            raise SlotError(f"cannot start replication from slot {slot}: {e}") from e
        self._flushed = max(self._flushed, start_lsn)
        self._received = start_lsn
        self._streaming = True

    def read(self, timeout_s: float) -> XLogData | Keepalive | None:
        pgconn = self._conn.pgconn
        deadline = time.monotonic() + timeout_s
        while True:
            self._maybe_status()
            nbytes, data = pgconn.get_copy_data(1)
            if nbytes == 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                select.select([pgconn.socket], [], [], min(remaining, self._interval))
                pgconn.consume_input()
                continue
            if nbytes < 0:
                raise ConnectionFailed(f"replication stream ended: {pgconn.get_error_message()!r}")
            buf = bytes(data)
            kind = buf[:1]
            if kind == b"w":
                start, end, clock = struct.unpack_from("!QQq", buf, 1)
                self._received = max(self._received, Lsn(end))
                return XLogData(Lsn(start), Lsn(end), clock + _PG_EPOCH_US, buf[25:])
            if kind == b"k":
                end, clock, reply = struct.unpack_from("!Qq?", buf, 1)
                self._received = max(self._received, Lsn(end))
                if reply:
                    self._send_status()
                return Keepalive(Lsn(end), clock + _PG_EPOCH_US, bool(reply))

    def acknowledge(self, flush_lsn: Lsn) -> None:
        if flush_lsn > self._flushed:
            self._flushed = flush_lsn
        self._send_status()

    def _maybe_status(self) -> None:
        if self._streaming and time.monotonic() - self._last_status >= self._interval:
            self._send_status()

    def _send_status(self) -> None:
        if not self._streaming:
            return
        now = int(time.time() * 1_000_000) - _PG_EPOCH_US
        f = self._flushed.value
        msg = b"r" + struct.pack("!QQQqB", f, f, f, now, 0)
        pgconn = self._conn.pgconn
        if pgconn.put_copy_data(msg) != 1 or pgconn.flush() != 0:
            raise ConnectionFailed("cannot send a status update on the replication stream")
        self._last_status = time.monotonic()

    def close(self) -> None:
        self._conn.close()
