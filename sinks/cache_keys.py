"""Where the Redis follower keeps a row's version so that a Redis Cluster can run the
compare-and-set script on it: the version key always hashes to the row key's slot.

Redis Cluster hashes a key by its *hash tag* (the text between the first ``{`` and the first
``}`` after it, when that text is not empty) or, without one, by the whole key. The row key
``<prefix>:<table>:<pk>`` is the design's and stays as it is, so the version key carries the
tag instead::

    <prefix>:__v__:{<X>}:<table>:<pk>

where ``X`` is the part of the row key that Redis hashes (its tag, or the whole key when it
has none) if that part holds no ``}``, and otherwise (a tagless row key whose pk holds a
``}``) a short brace-free string chosen to hash to the same slot. ``X`` never holds a ``}``,
so Redis reads ``X`` as the version key's tag and both keys land in one slot.

The layout is injective: the prefix is fixed, ``X`` ends at the first ``}``, and the table id
holds no ``:``, so ``(<table>, <pk>)`` is read back unambiguously and two rows never share a
version key. A prefix that opens a tag it does not close (``app{x``) would make the row
key's tag depend on the table and pk in a way the version key cannot follow (so would an
empty tag, ``{}``); it is refused.
A prefix holding a whole tag (``{app}``) puts every key of the follower in one slot, which
works as well (both keys then hash by the prefix's tag).
"""

from __future__ import annotations

from binascii import crc_hqx
from functools import cache
from typing import Final

from pgcdc.core.errors import ConfigError

SLOTS: Final = 16384


def hashed_part(key: str) -> str:
    """The part of ``key`` that Redis Cluster hashes: its hash tag, else the whole key."""
    start = key.find("{")
    if start > -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def key_slot(key: str) -> int:
    """Redis Cluster's slot of ``key`` (CRC16/XMODEM of its hashed part, mod 16384)."""
    return crc_hqx(hashed_part(key).encode(), 0) % SLOTS


@cache
def _slot_tags() -> tuple[str, ...]:
    """For each slot, a short string of digits and lower-case letters that hashes to it
    (about 170k CRCs, once per process, and only when a pk holds a ``}``)."""
    tags: list[str | None] = [None] * SLOTS
    missing, n = SLOTS, 0
    while missing:
        tag = _base36(n)
        slot = crc_hqx(tag.encode(), 0) % SLOTS
        if tags[slot] is None:
            tags[slot] = tag
            missing -= 1
        n += 1
    return tuple(t for t in tags if t is not None)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = digits[n % 36]
    while n >= 36:
        n //= 36
        out = digits[n % 36] + out
    return out


def slot_tag(slot: int) -> str:
    """A brace-free string whose CRC16 lands in ``slot``."""
    return _slot_tags()[slot]


def check_prefix(prefix: str) -> None:
    """Refuse a key prefix whose first ``{`` does not open a whole, non-empty hash tag."""
    start = prefix.find("{")
    if start > -1 and prefix.find("}", start + 1) in (-1, start + 1):
        raise ConfigError(
            f"redis.key_prefix {prefix!r} opens a Redis Cluster hash tag ('{{') without a "
            "whole, non-empty one: use a prefix without braces, or one holding a tag such "
            "as '{app}'"
        )


def version_key(prefix: str, row_key: str, table: str, pk: str) -> str:
    """The version key of the row ``row_key`` (= ``<prefix>:<table>:<pk>``): same slot."""
    tag = hashed_part(row_key)
    if "}" in tag:
        tag = slot_tag(key_slot(row_key))
    return f"{prefix}:__v__:{{{tag}}}:{table}:{pk}"
