"""The one rule for ``schema.name``: quoting as PostgreSQL reads it, refusals, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.core.qualified_names import quote_table, split_list, split_name, split_qualified

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("public.orders", ("public", "orders")),
        ('"my.schema"."my.table"', ("my.schema", "my.table")),
        ('public."a.b"', ("public", "a.b")),
        ('"a""b".c', ('a"b', "c")),
        ('"""x".y', ('"x', "y")),
        ('" padded ".t', (" padded ", "t")),  # quoted: as it stands
        (" s . T ", ("s", "T")),  # unquoted: as written, no case folding
        ('"a,b".c', ("a,b", "c")),
    ],
)
def test_qualified_names_split_as_postgresql_quotes_them(name: str, parts: tuple[str, str]) -> None:
    assert split_qualified(name) == parts


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("a", "must be written as schema.table"),
        ("a.b.c", "must be written as schema.table"),
        (".b", "must be written as schema.table"),
        ("a.", "must be written as schema.table"),
        ('"".t', "must be written as schema.table"),  # PostgreSQL: zero-length identifier
        ('"a.b', "unterminated quote"),
        ('a."b', "unterminated quote"),
        ('a"b".c', "a quote must enclose a whole part"),
        ('"a"x.t', "a quote must enclose a whole part"),
    ],
)
def test_other_names_are_refused(name: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        split_qualified(name)


def test_a_refusal_names_what_was_expected() -> None:
    with pytest.raises(ValueError, match=r"function 'f' must be written as schema\.function"):
        split_qualified("f", "function")
    assert split_name("orders") == ["orders"]  # the parts, however many


def test_a_list_is_cut_at_commas_outside_quotes() -> None:
    assert split_list(' public.a, "x,y".b ,, c.d ') == ("public.a", '"x,y".b', "c.d")
    with pytest.raises(ValueError, match="unterminated quote"):
        split_list('public.a, "b.c')


parts = st.text(min_size=1)


@given(parts, parts)
def test_quote_table_reads_back_as_itself(schema: str, table: str) -> None:
    written = quote_table((schema, table))
    assert split_qualified(written) == (schema, table)
    assert split_list(f"{written},{written}") == (written, written)
