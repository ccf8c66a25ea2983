"""Every hash of the Redis follower under a key pattern, for the tools that compare a follower
with the database (the demo, the tests): ``SCAN`` for the keys, then their ``HGETALL``s in
pipelined rounds, a round trip per thousand keys instead of one per key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

ROUND = 1000  # keys whose hashes one round trip reads


def every_hash(client: Any, match: str, *, round_size: int = ROUND) -> Iterator[tuple[Any, Any]]:
    """``(key, fields)`` of every key ``client`` (a ``redis.Redis`` or ``RedisCluster``)
    finds for ``match``; keys and fields as the client returns them (bytes by default)."""
    keys: list[Any] = []
    for key in client.scan_iter(match=match, count=5000):
        keys.append(key)
        if len(keys) == round_size:
            yield from _read(client, keys)
            keys = []
    if keys:
        yield from _read(client, keys)


def _read(client: Any, keys: list[Any]) -> Iterator[tuple[Any, Any]]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    yield from zip(keys, pipe.execute(), strict=True)
