"""The Redis follower's version keys land in their row key's Redis Cluster slot, for any
prefix, table and primary key, and two rows never share one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot as redis_key_slot

from pgcdc.core.errors import ConfigError
from pgcdc.core.follower_clients import redis_cluster_url
from sinks import cache_keys
from sinks.cache import CacheSink

pytestmark = pytest.mark.unit

# Braces are what matter; the rest keeps keys short and varied.
TEXT = st.text(alphabet=st.sampled_from("{}:.a1é"), max_size=8)
PREFIX = TEXT.filter(lambda p: bool(p)).filter(
    lambda p: p.find("{") == -1 or p.find("}", p.find("{") + 1) not in (-1, p.find("{") + 1)
)
TABLE = st.sampled_from(["public.t", "s.orders", "a-7Bb.c"])


def _row_key(prefix: str, table: str, pk: str) -> str:
    return f"{prefix}:{table}:{pk}"


# No deadline: the first key with a '}' builds the slot-tag table once (~170k CRCs).
@settings(deadline=None)
@given(prefix=PREFIX, table=TABLE, pk=TEXT)
def test_version_key_shares_the_row_keys_slot(prefix: str, table: str, pk: str) -> None:
    row = _row_key(prefix, table, pk)
    version = cache_keys.version_key(prefix, row, table, pk)
    assert cache_keys.key_slot(row) == redis_key_slot(row.encode())
    assert redis_key_slot(version.encode()) == redis_key_slot(row.encode()), (row, version)
    assert version.startswith(f"{prefix}:__v__:{{")


@settings(deadline=None)
@given(prefix=PREFIX, a=st.tuples(TABLE, TEXT), b=st.tuples(TABLE, TEXT))
def test_version_keys_are_injective(prefix: str, a: tuple[str, str], b: tuple[str, str]) -> None:
    va = cache_keys.version_key(prefix, _row_key(prefix, *a), *a)
    vb = cache_keys.version_key(prefix, _row_key(prefix, *b), *b)
    assert (va == vb) == (a == b)


def test_a_pk_with_a_closing_brace_gets_a_slot_tag() -> None:
    row = _row_key("cdc", "public.t", "a}b")  # no tag: Redis hashes the whole key
    version = cache_keys.version_key("cdc", row, "public.t", "a}b")
    tag = version.split("{", 1)[1].split("}", 1)[0]
    assert "}" not in tag and "{" not in tag
    assert redis_key_slot(tag.encode()) == redis_key_slot(row.encode())


def test_every_slot_has_a_tag() -> None:
    for slot in (0, 1, 8000, cache_keys.SLOTS - 1):
        assert redis_key_slot(cache_keys.slot_tag(slot).encode()) == slot


def test_plain_keys_read_as_before() -> None:
    sink = CacheSink("redis://127.0.0.1:1/0", "cdc")
    assert sink.row_key("public.t", "42") == "cdc:public.t:42"
    assert sink.version_key("public.t", "42") == "cdc:__v__:{cdc:public.t:42}:public.t:42"


def test_a_prefix_opening_a_tag_is_refused() -> None:
    with pytest.raises(ConfigError, match="hash tag"):
        CacheSink("redis://127.0.0.1:1/0", "app{x")
    with pytest.raises(ConfigError, match="hash tag"):
        CacheSink("redis://127.0.0.1:1/0", "{}app")
    CacheSink("redis://127.0.0.1:1/0", "{app}")  # a whole tag: one slot for everything


def test_cluster_in_the_url() -> None:
    assert redis_cluster_url("redis://h:7000/0?cluster=true") == ("redis://h:7000/0", True)
    assert redis_cluster_url("redis://h:7000/0?cluster=no&x=1") == ("redis://h:7000/0?x=1", False)
    assert redis_cluster_url("rediss://u:p@h/0") == ("rediss://u:p@h/0", False)
