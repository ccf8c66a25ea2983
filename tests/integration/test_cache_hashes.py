"""pgcdc.core.cache_hashes against the real Redis: every hash under a pattern, read in
pipelined rounds, none missed or doubled at a round's edge, other keys left out."""

from __future__ import annotations

import pytest
import redis

from pgcdc.core.cache_hashes import every_hash
from tests.conftest import Endpoints

pytestmark = pytest.mark.integration


def test_every_hash_reads_each_key_once_across_rounds(
    endpoints: Endpoints, key_prefix: str
) -> None:
    r = redis.Redis.from_url(endpoints.redis_url)
    try:
        pipe = r.pipeline(transaction=False)
        for i in range(2_345):  # two full rounds of 1,000 and a short one
            pipe.hset(f"{key_prefix}:t:{i}", mapping={"id": str(i), "v": f"v{i}"})
        pipe.set(f"{key_prefix}:other", "not a row")
        pipe.execute()
        got = dict(every_hash(r, f"{key_prefix}:t:*"))
        assert len(got) == 2_345
        assert got[f"{key_prefix}:t:2344".encode()] == {b"id": b"2344", b"v": b"v2344"}
        assert dict(every_hash(r, f"{key_prefix}:t:*", round_size=7)) == got
        assert list(every_hash(r, f"{key_prefix}:none:*")) == []
    finally:
        r.close()
