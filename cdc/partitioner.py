"""Which partition the producer puts a keyed record in, computed here.

The reader needs it in one place: a re-snapshot that finds a key under old bytes writes a
tombstone for the old bytes before the row's new record (see :mod:`cdc.snapshot`). Both
name the same row, so with several partitions the tombstone must land in the new record's
partition, or a follower could apply the two out of order. librdkafka places keyed records
by its ``partitioner`` setting; this mirrors the two deterministic families (checked
against librdkafka on a real topic): ``consistent`` (CRC-32 of the key, librdkafka's
default ``consistent_random``) and ``murmur2`` (Java's default, ``murmur2_random``).
"""

from __future__ import annotations

import zlib

# librdkafka's default partitioner.
DEFAULT_PARTITIONER = "consistent_random"


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (as the Java client and librdkafka compute it), unsigned."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = length - end
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_of(key: bytes, partitions: int, partitioner: str = DEFAULT_PARTITIONER) -> int | None:
    """The partition librdkafka's ``partitioner`` gives ``key`` among ``partitions``, or
    None for a partitioner that is not a pure function of the key (``random``) or not
    mirrored here."""
    if partitions < 1:
        raise ValueError("a topic has at least one partition")
    if partitions == 1:
        return 0
    if partitioner in ("consistent", "consistent_random"):
        return zlib.crc32(key) % partitions
    if partitioner in ("murmur2", "murmur2_random"):
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    return None
