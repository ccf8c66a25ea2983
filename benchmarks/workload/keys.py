"""The live primary keys a worker writes to, with O(1) random pick, add and removal."""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class LiveKeys(Generic[K]):
    """Keys that exist now. A list for random picks plus each key's index in it; a removed
    key's slot takes the last key (order does not matter, speed does)."""

    def __init__(self, keys: Iterable[K] = ()) -> None:
        self._keys: list[K] = []
        self._index: dict[K, int] = {}
        for k in keys:
            self.add(k)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def add(self, key: K) -> None:
        """Add ``key`` (no-op when present)."""
        if key not in self._index:
            self._index[key] = len(self._keys)
            self._keys.append(key)

    def discard(self, key: K) -> None:
        """Remove ``key`` if present."""
        i = self._index.pop(key, None)
        if i is None:
            return
        last = self._keys.pop()
        if i < len(self._keys):
            self._keys[i] = last
            self._index[last] = i

    def replace(self, old: K, new: K) -> None:
        """``old`` became ``new`` (a primary-key change), in place."""
        i = self._index.pop(old)
        self._keys[i] = new
        self._index[new] = i

    def pick(self, rnd: random.Random) -> K:
        """A key chosen uniformly at random; the set must not be empty."""
        return self._keys[rnd.randrange(len(self._keys))]

    def take(self, rnd: random.Random) -> K:
        """Remove and return a random key."""
        key = self.pick(rnd)
        self.discard(key)
        return key

    def sample(self, rnd: random.Random, n: int) -> list[K]:
        """``n`` distinct random keys (left in place)."""
        return rnd.sample(self._keys, n)
