"""cdc.partitioner: Kafka's murmur2 and librdkafka's CRC-32 placement (checked against the
real producer in tests/integration/test_reader_partitions.py)."""

from __future__ import annotations

import zlib

import pytest

from cdc.partitioner import murmur2, partition_of

pytestmark = pytest.mark.unit


def test_one_partition_and_unknown_partitioners() -> None:
    assert partition_of(b"k", 1, "random") == 0
    assert partition_of(b"k", 4, "random") is None
    with pytest.raises(ValueError):
        partition_of(b"k", 0)


def test_consistent_is_crc32() -> None:
    for key in (b"", b"a", b'{"id":1}', bytes(range(256))):
        assert partition_of(key, 7) == zlib.crc32(key) % 7
        assert partition_of(key, 7, "consistent") == zlib.crc32(key) % 7


def test_murmur2_takes_every_tail_length_and_stays_in_range() -> None:
    seen = set()
    for n in range(0, 12):
        key = bytes(range(n))
        h = murmur2(key)
        assert 0 <= h < 2**32
        seen.add(h)
        p = partition_of(key, 5, "murmur2_random")
        assert p is not None and 0 <= p < 5
    assert len(seen) == 12
