"""The Redis follower's script calls on the wire: packed to RESP here, sent in one write.

redis-py packs a pipeline argument by argument (``Encoder.encode`` then a join per
argument) and keeps a command stack beside it; profiled in the cache job's task, that was
about half of the time spent applying a batch. The follower's calls are all EVALSHA with
byte arguments it already holds, so each is packed here with one bytes format
(``*N\\r\\n`` then ``$len\\r\\narg\\r\\n`` per argument, as redis-py writes them), a
pipeline's calls go out in one ``send_packed_command`` on a connection of the client's
pool, and the replies are read back in order on it.

Only for a single Redis server: the cluster client routes each call itself
(:mod:`sinks.cache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import ResponseError

__all__ = ["Packer", "pack", "send"]


def pack(args: Sequence[bytes]) -> bytes:
    """One command in RESP, byte for byte what redis-py sends for the same arguments."""
    return b"".join([b"*%d\r\n" % len(args), *[b"$%d\r\n%b\r\n" % (len(a), a) for a in args]])


class Packer:
    """Packs commands that start with the same arguments (``EVALSHA <sha> <numkeys>``) as
    :func:`pack` does: those once, the rest with one bytes format per command (a format per
    number of arguments, kept)."""

    def __init__(self, head: Sequence[bytes]) -> None:
        self._count = len(head)
        self._head = b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in head).replace(b"%", b"%%")
        self._formats: dict[int, bytes] = {}

    def pack(self, args: Sequence[bytes]) -> bytes:
        """The command ``head + args``."""
        n = len(args)
        fmt = self._formats.get(n)
        if fmt is None:
            fmt = b"*%d\r\n" % (self._count + n) + self._head + b"$%d\r\n%b\r\n" * n
            self._formats[n] = fmt
        flat: list[int | bytes] = []
        for a in args:
            flat.append(len(a))
            flat.append(a)
        return fmt % tuple(flat)


def send(client: redis.Redis, commands: Sequence[bytes]) -> list[Any]:
    """Send packed ``commands`` in one write and read one reply per command, in order.

    A reply that is an error comes back as its exception (``ResponseError`` and its
    subclasses, e.g. ``NoScriptError``), as redis-py's pipeline returns it with
    ``raise_on_error=False``. Connection errors are retried by the client's retry policy,
    which sends every command again (the follower's script is idempotent), and raised once
    it gives up.
    """
    if not commands:
        return []
    payload = b"".join(commands)
    pool = client.connection_pool
    conn: Any = pool.get_connection()
    try:
        replies: list[Any] = conn.retry.call_with_retry(
            lambda: _exchange(conn, payload, len(commands)),
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
