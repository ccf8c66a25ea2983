"""Topic, index and follower names are injective for every name PostgreSQL allows."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.core.contract import (
    MAX_INDEX_NAME_BYTES,
    MAX_TOPIC_LENGTH,
    decode_part,
    encode_index_part,
    encode_topic_part,
    table_id,
    table_index,
    table_of_topic,
    table_topic,
    table_topic_pattern,
)

pytestmark = pytest.mark.unit

# PostgreSQL identifiers: any character but NUL, at most 63 bytes.
identifiers = st.text(
    alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=63,
).filter(lambda s: len(s.encode()) <= 63)
plain = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=63)

_KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_INDEX_FORBIDDEN = set('\\/*?"<>| ,#:') | {chr(c) for c in range(ord("A"), ord("Z") + 1)}


@given(identifiers)
def test_parts_decode_to_the_name(name: str) -> None:
    assert decode_part(encode_topic_part(name)) == name
    assert decode_part(encode_index_part(name)) == name


@given(identifiers, identifiers, identifiers, identifiers)
@settings(max_examples=500)
def test_topics_indices_and_ids_are_injective(s1: str, t1: str, s2: str, t2: str) -> None:
    if (s1, t1) == (s2, t2):
        return
    assert table_topic("cdc", s1, t1) != table_topic("cdc", s2, t2)
    assert table_id(s1, t1) != table_id(s2, t2)
    assert table_index("cdc", table_id(s1, t1)) != table_index("cdc", table_id(s2, t2))


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("public", "order.items"), ("public.order", "items")),
        (("public", "Café"), ("public", "Caf_")),
        (("public", "Orders"), ("public", "orders")),
        (("a b", "c"), ("a_b", "c")),
        (("public", 'x"y'), ("public", "x_y")),
    ],
)
def test_pairs_that_collided_before_do_not(one: tuple[str, str], other: tuple[str, str]) -> None:
    assert table_topic("cdc", *one) != table_topic("cdc", *other)
    assert table_index("cdc", table_id(*one)) != table_index("cdc", table_id(*other))


@given(identifiers, identifiers)
def test_names_are_legal_and_matched_by_the_jobs_pattern(schema: str, table: str) -> None:
    topic = table_topic("cdc", schema, table)
    assert _KAFKA_TOPIC.fullmatch(topic) and len(topic) <= MAX_TOPIC_LENGTH
    assert re.fullmatch(table_topic_pattern("cdc"), topic)
    index = table_index("cdc", table_of_topic("cdc", topic))
    assert not set(index) & _INDEX_FORBIDDEN
    assert len(index.encode()) <= MAX_INDEX_NAME_BYTES


@given(plain, plain)
def test_plain_names_are_unchanged(schema: str, table: str) -> None:
    assert table_topic("cdc", schema, table) == f"cdc.{schema}.{table}"
    assert table_id(schema, table) == f"{schema}.{table}"
    assert table_index("cdc", f"{schema}.{table}") == f"cdc-{schema}.{table}"


def test_examples() -> None:
    assert table_topic("cdc", "public", "order.items") == "cdc.public.order-2Eitems"
    assert table_topic("cdc", "public", "Café") == "cdc.public.Caf-C3-A9"
    assert table_index("cdc", "public.Orders") == "cdc-public.-4frders"
    assert table_of_topic("cdc", "cdc.public.order-2Eitems") == "public.order-2Eitems"
