"""The Redis follower's script calls on the wire: packed to RESP here, sent in one write.

redis-py packs a pipeline argument by argument (``Encoder.encode`` then a join per
argument) and keeps a command stack beside it; profiled in the cache job's task, that was
about half of the time spent applying a batch. The follower's calls are all EVALSHA with
byte arguments it already holds, so they are packed here with bytes formats (``*N\\r\\n``
then ``$len\\r\\narg\\r\\n`` per argument, as redis-py writes them; :mod:`sinks.cache` fills
one format with each row's arguments), a pipeline's calls go out in one
``send_packed_command`` on a connection of the client's pool, and the replies are read back
in order on it.

Only for a single Redis server: the cluster client routes each call itself
(:mod:`sinks.cache`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import redis
from redis.exceptions import ResponseError

__all__ = ["BULK", "command", "pack", "send", "unframed"]

# One argument as a RESP bulk string: ``BULK % (len(arg), arg)``.
BULK: Final = b"$%d\r\n%b\r\n"


def pack(args: Sequence[bytes]) -> bytes:
    """One command in RESP, byte for byte what redis-py sends for the same arguments."""
    return b"".join([b"*%d\r\n" % len(args), *[BULK % (len(a), a) for a in args]])


def unframed(framed: bytes) -> list[bytes]:
    """The arguments of ``framed``, a run of RESP bulk strings (:data:`BULK` each)."""
    out: list[bytes] = []
    at = 0
    while at < len(framed):
        if framed[at : at + 1] != b"$":
            raise ValueError(f"no bulk string at byte {at} of {framed[:80]!r}")
        eol = framed.index(b"\r\n", at)
        start = eol + 2
        end = start + int(framed[at + 1 : eol])
        if framed[end : end + 2] != b"\r\n":
            raise ValueError(f"a bulk string of {framed[:80]!r} does not end where it says")
        out.append(framed[start:end])
        at = end + 2
    return out


def command(count: int, parts: Iterable[bytes]) -> bytes:
    """A command of ``count`` arguments given as ``parts``, each a run of arguments already
    framed as bulk strings (:data:`BULK`): what :func:`pack` makes of the same arguments."""
    return b"".join([b"*%d\r\n" % count, *parts])


def send(client: redis.Redis, commands: Sequence[bytes]) -> list[Any]:
    """Send packed ``commands`` in one write and read one reply per command, in order.

    A reply that is an error comes back as its exception (``ResponseError`` and its
    subclasses, e.g. ``NoScriptError``), as redis-py's pipeline returns it with
    ``raise_on_error=False``. Connection errors are retried by the client's retry policy,
    which sends every command again (the follower's script is idempotent), and raised once
    it gives up.
    """
    return send_payload(client, b"".join(commands), len(commands))


def send_payload(client: redis.Redis, payload: bytes, count: int) -> list[Any]:
    """:func:`send` of ``count`` commands packed one after the other in ``payload``."""
    if not count:
        return []
    pool = client.connection_pool
    conn: Any = pool.get_connection()
    try:
        replies: list[Any] = conn.retry.call_with_retry(
            lambda: _exchange(conn, payload, count),
            lambda _error: conn.disconnect(),
        )
        return replies
    finally:
        pool.release(conn)


def _exchange(conn: Any, payload: bytes, count: int) -> list[Any]:
    try:
        conn.send_packed_command([payload])
        replies: list[Any] = []
        for _ in range(count):
            try:
                replies.append(conn.read_response())
            except ResponseError as e:
                replies.append(e)
        return replies
    except BaseException:
        # Replies may be left unread: the connection must not go back to the pool as is.
        conn.disconnect()
        raise
