"""A pure decoder for PostgreSQL's ``pgoutput`` logical replication messages.

Bytes in, frozen dataclasses out; no sockets. This is the reader's hot path, so fixed
fields are read with precompiled :class:`struct.Struct` objects and tuple data with one
loop per column (never per byte).

Protocol versions: 1 (PostgreSQL 10+); 2 adds streamed in-progress transactions (Stream
Start/Stop/Commit/Abort, and an xid in every message sent inside a stream); 3 adds two-phase
commit messages; 4 adds the abort LSN and timestamp to Stream Abort under parallel streaming.
Reference: PostgreSQL docs, "Logical Replication Message Formats".
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from pgcdc.core.errors import DecodeError
from pgcdc.core.lsn import Lsn
from pgcdc.core.values import UNCHANGED_TOAST, RawValue

# pgoutput timestamps count microseconds from 2000-01-01 00:00:00 UTC.
PG_EPOCH_OFFSET_US: Final = 946_684_800_000_000

_U8 = struct.Struct("!B")
_I16 = struct.Struct("!H")
_I32 = struct.Struct("!I")
_BEGIN = struct.Struct("!QqI")  # final lsn, commit ts, xid
_COMMIT = struct.Struct("!BQQq")  # flags, commit lsn, end lsn, commit ts
_MESSAGE_HEAD = struct.Struct("!BQ")  # flags, lsn
_TRUNCATE_HEAD = struct.Struct("!IB")  # relation count, options
_TYPEMOD = struct.Struct("!Ii")  # column type oid, type modifier
_STREAM_START = struct.Struct("!IB")  # xid, first segment
_STREAM_COMMIT = struct.Struct("!IBQQq")  # xid, flags, commit lsn, end lsn, commit ts
_STREAM_ABORT = struct.Struct("!II")  # xid, sub-xid
_STREAM_ABORT_V4 = struct.Struct("!IIQq")  # xid, sub-xid, abort lsn, abort ts
_BEGIN_PREPARE = struct.Struct("!QQqI")  # prepare lsn, end lsn, prepare ts, xid
_PREPARE = struct.Struct("!BQQqI")  # flags, prepare/commit lsn, end lsn, ts, xid
_ROLLBACK_PREPARED = struct.Struct("!BQQqqI")  # flags, prepare end, rollback end, 2 ts, xid


_REPLICA_IDENTITIES: Final = frozenset("dnfi")


def _ts(pg_us: int) -> int:
    return pg_us + PG_EPOCH_OFFSET_US


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction starts. ``final_lsn`` is its commit record's LSN."""

    final_lsn: Lsn
    commit_ts_us: int  # µs since the UNIX epoch
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """A transaction committed. Acknowledge ``end_lsn`` once all of it is durable downstream."""

    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    """The transaction was replayed from another node (replication origin)."""

    commit_lsn: Lsn
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a Relation message. ``flags & 1`` marks a replica-identity key column."""

    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's shape, sent before its first change in a session and after DDL.

    ``namespace`` is empty for pg_catalog. ``replica_identity`` is one of
    ``d`` (default: primary key), ``n`` (nothing), ``f`` (full row), ``i`` (index).
    """

    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class TypeMessage:
    """A non-built-in column type (enum, domain, composite...) used by a following Relation."""

    type_oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Insert:
    relation_id: int
    new: tuple[RawValue, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """``old`` is present when the key changed (``old_kind`` "K": key columns only, others None)
    or under REPLICA IDENTITY FULL (``old_kind`` "O": the whole old row)."""

    relation_id: int
    old: tuple[RawValue, ...] | None
    old_kind: str | None
    new: tuple[RawValue, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """``old_kind`` "K": key columns only (others None); "O": the whole old row."""

    relation_id: int
    old: tuple[RawValue, ...]
    old_kind: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None


# The messages that carry rows: a long transaction may be split between them.
DATA_MESSAGES = (Insert, Update, Delete, Truncate)


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A ``pg_logical_emit_message`` call (sent only with the ``messages`` option)."""

    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    """A chunk of an in-progress transaction follows (protocol 2+)."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """The current chunk of a streamed transaction ended (protocol 2+)."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """A streamed transaction committed: apply its chunks (protocol 2+)."""

    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """A streamed (sub)transaction aborted: discard its chunks. ``xid == subxid`` means the
    whole transaction. ``abort_lsn``/``abort_ts_us`` come only with parallel streaming (v4)."""

    xid: int
    subxid: int
    abort_lsn: Lsn | None = None
    abort_ts_us: int | None = None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    """A two-phase transaction's changes follow (protocol 3+, ``two_phase`` on)."""

    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    """PREPARE TRANSACTION was logged (protocol 3+). ``streamed`` for Stream Prepare."""

    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts_us: int
    xid: int
    gid: str
    streamed: bool = False


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_ts_us: int
    rollback_ts_us: int
    xid: int
    gid: str


PgOutputMessage: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeMessage
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
)


# --------------------------------------------------------------------------- readers


class _Malformed(Exception):
    """Internal: a reader found bad bytes at ``offset``; ``decode`` adds the message type."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


def _string(data: bytes, pos: int) -> tuple[str, int]:
    """A NUL-terminated UTF-8 string at ``pos``; returns it and the position after the NUL."""
    end = data.find(b"\x00", pos)
    if end < 0:
        raise _Malformed("string has no terminating NUL", pos)
    try:
        return data[pos:end].decode(), end + 1
    except UnicodeDecodeError as e:
        raise _Malformed(f"string is not valid UTF-8 ({e.reason})", pos + e.start) from e


def _tuple(data: bytes, pos: int) -> tuple[tuple[RawValue, ...], int]:
    """TupleData at ``pos``: Int16 column count, then per column a kind byte and maybe a value.

    The hot loop checks nothing it does not have to: a truncated value only shows as a
    position past the end, checked once at the end. Anything odd (truncation, bad UTF-8, an
    unknown kind) redoes the tuple with :func:`_tuple_checked`, which says what is wrong.
    """
    start = pos
    try:
        ncols = (data[pos] << 8) | data[pos + 1]
        pos += 2
        values: list[RawValue] = [None] * ncols
        unpack_len = _I32.unpack_from
        for col in range(ncols):
            kind = data[pos]
            if kind == 0x74:  # 't' text
                end = pos + 5 + unpack_len(data, pos + 1)[0]
                values[col] = data[pos + 5 : end].decode()
                pos = end
            elif kind == 0x6E:  # 'n' null
                pos += 1
            elif kind == 0x75:  # 'u' unchanged TOAST
                values[col] = UNCHANGED_TOAST
                pos += 1
            elif kind == 0x62:  # 'b' binary
                end = pos + 5 + unpack_len(data, pos + 1)[0]
                values[col] = data[pos + 5 : end]
                pos = end
            else:
                break
        else:
            if pos <= len(data):
                return tuple(values), pos
    except (IndexError, struct.error, UnicodeDecodeError):
        pass
    return _tuple_checked(data, start)


def _tuple_checked(data: bytes, pos: int) -> tuple[tuple[RawValue, ...], int]:
    """:func:`_tuple` with every check, for malformed input: raises what is wrong, where."""
    size = len(data)
    if pos + 2 > size:
        raise _Malformed("tuple data truncated before its column count", pos)
    ncols = (data[pos] << 8) | data[pos + 1]
    pos += 2
    # Hot loop: preallocated list, literal kind bytes, one bound unpack.
    values: list[RawValue] = [None] * ncols
    unpack_len = _I32.unpack_from
    col = 0
    try:
        for col in range(ncols):  # col is also read by the error path
            kind = data[pos]
            if kind == 0x74:  # 't' text
                (n,) = unpack_len(data, pos + 1)
                pos += 5
                end = pos + n
                if end > size:
                    raise _Malformed(f"column {col} text value of {n} bytes is truncated", pos)
                values[col] = data[pos:end].decode()
                pos = end
            elif kind == 0x6E:  # 'n' null
                pos += 1
            elif kind == 0x75:  # 'u' unchanged TOAST
                values[col] = UNCHANGED_TOAST
                pos += 1
            elif kind == 0x62:  # 'b' binary
                (n,) = unpack_len(data, pos + 1)
                pos += 5
                end = pos + n
                if end > size:
                    raise _Malformed(f"column {col} binary value of {n} bytes is truncated", pos)
                values[col] = data[pos:end]
                pos = end
            else:
                raise _Malformed(f"column {col} has unknown kind {kind:#04x}", pos)
    except (IndexError, struct.error) as e:
        raise _Malformed(f"tuple data truncated in column {col} of {ncols}", pos) from e
    except UnicodeDecodeError as e:
        raise _Malformed(f"column {col} text is not valid UTF-8 ({e.reason})", pos) from e
    return tuple(values), pos


def _need(data: bytes, pos: int, n: int, what: str) -> None:
    if pos + n > len(data):
        raise _Malformed(f"{what} needs {n} bytes, {len(data) - pos} left", pos)


def _xid(data: bytes, pos: int, in_stream: bool) -> tuple[int | None, int]:
    if not in_stream:
        return None, pos
    _need(data, pos, 4, "streamed transaction xid")
    return _I32.unpack_from(data, pos)[0], pos + 4


_Reader: TypeAlias = Callable[[bytes, bool], tuple[PgOutputMessage, int]]


def _begin(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    _need(data, 1, _BEGIN.size, "Begin")
    lsn, ts, xid = _BEGIN.unpack_from(data, 1)
    return Begin(Lsn.from_wire(lsn), _ts(ts), xid), 1 + _BEGIN.size


def _commit(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    _need(data, 1, _COMMIT.size, "Commit")
    flags, lsn, end, ts = _COMMIT.unpack_from(data, 1)
    return Commit(flags, Lsn.from_wire(lsn), Lsn.from_wire(end), _ts(ts)), 1 + _COMMIT.size


def _origin(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    _need(data, 1, 8, "Origin")
    (lsn,) = struct.unpack_from("!Q", data, 1)
    name, pos = _string(data, 9)
    return Origin(Lsn(lsn), name), pos


def _relation(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    xid, pos = _xid(data, 1, in_stream)
    _need(data, pos, 4, "Relation id")
    (rel_id,) = _I32.unpack_from(data, pos)
    namespace, pos = _string(data, pos + 4)
    name, pos = _string(data, pos)
    _need(data, pos, 3, "Relation replica identity and column count")
    identity = chr(data[pos])
    if identity not in _REPLICA_IDENTITIES:
        raise _Malformed(f"unknown replica identity {identity!r}", pos)
    (ncols,) = _I16.unpack_from(data, pos + 1)
    pos += 3
    columns = []
    for _ in range(ncols):
        _need(data, pos, 1, "column flags")
        flags = data[pos]
        col_name, pos = _string(data, pos + 1)
        _need(data, pos, _TYPEMOD.size, f"column {col_name!r} type")
        oid, typmod = _TYPEMOD.unpack_from(data, pos)
        pos += _TYPEMOD.size
        columns.append(RelationColumn(flags, col_name, oid, typmod))
    return Relation(rel_id, namespace, name, identity, tuple(columns), xid), pos


def _type(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    xid, pos = _xid(data, 1, in_stream)
    _need(data, pos, 4, "Type oid")
    (oid,) = _I32.unpack_from(data, pos)
    namespace, pos = _string(data, pos + 4)
    name, pos = _string(data, pos)
    return TypeMessage(oid, namespace, name, xid), pos


def _insert(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    xid, pos = _xid(data, 1, in_stream)
    _need(data, pos, 5, "Insert relation id and tuple marker")
    (rel_id,) = _I32.unpack_from(data, pos)
    if data[pos + 4] != 0x4E:  # 'N'
        raise _Malformed(f"expected new tuple marker 'N', got {data[pos + 4]:#04x}", pos + 4)
    new, pos = _tuple(data, pos + 5)
    return Insert(rel_id, new, xid), pos


def _update(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    xid, pos = _xid(data, 1, in_stream)
    _need(data, pos, 5, "Update relation id and tuple marker")
    (rel_id,) = _I32.unpack_from(data, pos)
    pos += 4
    marker = data[pos]
    old: tuple[RawValue, ...] | None = None
    old_kind: str | None = None
    if marker in (0x4B, 0x4F):  # 'K' key, 'O' old row
        old_kind = chr(marker)
        old, pos = _tuple(data, pos + 1)
        _need(data, pos, 1, "Update new tuple marker")
        marker = data[pos]
    if marker != 0x4E:  # 'N'
        raise _Malformed(f"expected tuple marker 'K', 'O' or 'N', got {marker:#04x}", pos)
    new, pos = _tuple(data, pos + 1)
    return Update(rel_id, old, old_kind, new, xid), pos


def _delete(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    xid, pos = _xid(data, 1, in_stream)
    _need(data, pos, 5, "Delete relation id and tuple marker")
    (rel_id,) = _I32.unpack_from(data, pos)
    marker = data[pos + 4]
    if marker not in (0x4B, 0x4F):
        raise _Malformed(f"expected old tuple marker 'K' or 'O', got {marker:#04x}", pos + 4)
    old, pos = _tuple(data, pos + 5)
    return Delete(rel_id, old, chr(marker), xid), pos


def _truncate(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    xid, pos = _xid(data, 1, in_stream)
    _need(data, pos, _TRUNCATE_HEAD.size, "Truncate header")
    count, options = _TRUNCATE_HEAD.unpack_from(data, pos)
    pos += _TRUNCATE_HEAD.size
    _need(data, pos, 4 * count, f"Truncate list of {count} relation ids")
    ids = struct.unpack_from(f"!{count}I", data, pos)
    return Truncate(ids, bool(options & 1), bool(options & 2), xid), pos + 4 * count


def _message(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    xid, pos = _xid(data, 1, in_stream)
    _need(data, pos, _MESSAGE_HEAD.size, "Message header")
    flags, lsn = _MESSAGE_HEAD.unpack_from(data, pos)
    prefix, pos = _string(data, pos + _MESSAGE_HEAD.size)
    _need(data, pos, 4, "Message content length")
    (n,) = _I32.unpack_from(data, pos)
    pos += 4
    _need(data, pos, n, "Message content")
    return LogicalMessage(bool(flags & 1), Lsn(lsn), prefix, data[pos : pos + n], xid), pos + n


def _stream_start(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    _need(data, 1, _STREAM_START.size, "Stream Start")
    xid, first = _STREAM_START.unpack_from(data, 1)
    return StreamStart(xid, first == 1), 1 + _STREAM_START.size


def _stream_stop(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    return StreamStop(), 1


def _stream_commit(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    _need(data, 1, _STREAM_COMMIT.size, "Stream Commit")
    xid, flags, lsn, end, ts = _STREAM_COMMIT.unpack_from(data, 1)
    return StreamCommit(xid, flags, Lsn(lsn), Lsn(end), _ts(ts)), 1 + _STREAM_COMMIT.size


def _stream_abort(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    # The abort LSN and timestamp follow only under parallel streaming (protocol 4).
    if len(data) >= 1 + _STREAM_ABORT_V4.size:
        xid, subxid, lsn, ts = _STREAM_ABORT_V4.unpack_from(data, 1)
        return StreamAbort(xid, subxid, Lsn(lsn), _ts(ts)), 1 + _STREAM_ABORT_V4.size
    _need(data, 1, _STREAM_ABORT.size, "Stream Abort")
    xid, subxid = _STREAM_ABORT.unpack_from(data, 1)
    return StreamAbort(xid, subxid), 1 + _STREAM_ABORT.size


def _begin_prepare(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    _need(data, 1, _BEGIN_PREPARE.size, "Begin Prepare")
    lsn, end, ts, xid = _BEGIN_PREPARE.unpack_from(data, 1)
    gid, pos = _string(data, 1 + _BEGIN_PREPARE.size)
    return BeginPrepare(Lsn(lsn), Lsn(end), _ts(ts), xid, gid), pos


def _prepare(data: bytes, in_stream: bool, streamed: bool = False) -> tuple[PgOutputMessage, int]:
    _need(data, 1, _PREPARE.size, "Prepare")
    flags, lsn, end, ts, xid = _PREPARE.unpack_from(data, 1)
    gid, pos = _string(data, 1 + _PREPARE.size)
    return Prepare(flags, Lsn(lsn), Lsn(end), _ts(ts), xid, gid, streamed), pos


def _stream_prepare(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    return _prepare(data, in_stream, streamed=True)


def _commit_prepared(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    _need(data, 1, _PREPARE.size, "Commit Prepared")
    flags, lsn, end, ts, xid = _PREPARE.unpack_from(data, 1)
    gid, pos = _string(data, 1 + _PREPARE.size)
    return CommitPrepared(flags, Lsn(lsn), Lsn(end), _ts(ts), xid, gid), pos


def _rollback_prepared(data: bytes, in_stream: bool) -> tuple[PgOutputMessage, int]:
    _need(data, 1, _ROLLBACK_PREPARED.size, "Rollback Prepared")
    flags, prep_end, end, prep_ts, ts, xid = _ROLLBACK_PREPARED.unpack_from(data, 1)
    gid, pos = _string(data, 1 + _ROLLBACK_PREPARED.size)
    msg = RollbackPrepared(flags, Lsn(prep_end), Lsn(end), _ts(prep_ts), _ts(ts), xid, gid)
    return msg, pos


# Message type byte -> (minimum protocol version, reader).
_READERS: Final[dict[int, tuple[int, _Reader]]] = {
    ord("B"): (1, _begin),
    ord("C"): (1, _commit),
    ord("O"): (1, _origin),
    ord("R"): (1, _relation),
    ord("Y"): (1, _type),
    ord("I"): (1, _insert),
    ord("U"): (1, _update),
    ord("D"): (1, _delete),
    ord("T"): (1, _truncate),
    ord("M"): (1, _message),
    ord("S"): (2, _stream_start),
    ord("E"): (2, _stream_stop),
    ord("c"): (2, _stream_commit),
    ord("A"): (2, _stream_abort),
    ord("b"): (3, _begin_prepare),
    ord("P"): (3, _prepare),
    ord("K"): (3, _commit_prepared),
    ord("r"): (3, _rollback_prepared),
    ord("p"): (3, _stream_prepare),
}


def decode(
    data: bytes | bytearray | memoryview, proto_version: int = 1, in_stream: bool = False
) -> PgOutputMessage:
    """Decode one pgoutput message (the payload of one XLogData frame).

    ``in_stream`` says the message sits between Stream Start and Stream Stop, where every
    transactional message carries the streamed transaction's xid (protocol 2+).
    :class:`Decoder` tracks that state for you. Raises :class:`DecodeError` naming the
    message type and byte offset on malformed input.
    """
    if not isinstance(data, bytes):
        data = bytes(data)  # one copy: bytes slicing and decoding are the fastest path
    if not data:
        raise DecodeError("empty pgoutput message")
    type_byte = data[0]
    entry = _READERS.get(type_byte)
    if entry is None:
        raise DecodeError(f"unknown pgoutput message type {_type_name(type_byte)} at offset 0")
    min_version, reader = entry
    if proto_version < min_version:
        raise DecodeError(
            f"pgoutput message type {_type_name(type_byte)} needs protocol version "
            f"{min_version}, decoding version {proto_version}"
        )
    try:
        message, end = reader(data, in_stream)
    except _Malformed as e:
        raise DecodeError(
            f"malformed pgoutput message type {_type_name(type_byte)} "
            f"({len(data)} bytes): {e.reason} at offset {e.offset}"
        ) from e
    except (struct.error, IndexError, ValueError) as e:
        # A field we did not length-check; still one clear error, never a leak.
        raise DecodeError(
            f"malformed pgoutput message type {_type_name(type_byte)} ({len(data)} bytes): {e}"
        ) from e
    if end != len(data):
        raise DecodeError(
            f"pgoutput message type {_type_name(type_byte)} has {len(data) - end} trailing "
            f"bytes after offset {end} (wrong protocol version or stream state?)"
        )
    return message


def _type_name(type_byte: int) -> str:
    ch = chr(type_byte)
    return repr(ch) if ch.isprintable() and type_byte < 0x80 else f"{type_byte:#04x}"


class Decoder:
    """Decodes a stream of pgoutput messages, tracking Stream Start/Stop for protocol 2+."""

    __slots__ = ("in_stream", "proto_version")

    def __init__(self, proto_version: int = 1) -> None:
        self.proto_version = proto_version
        self.in_stream = False

    def decode(self, data: bytes | bytearray | memoryview) -> PgOutputMessage:
        """Decode one message; Stream Start/Stop switch the xid-carrying stream state."""
        message = decode(data, self.proto_version, self.in_stream)
        kind = type(message)
        if kind is StreamStart:
            self.in_stream = True
        elif kind is StreamStop:
            self.in_stream = False
        return message
