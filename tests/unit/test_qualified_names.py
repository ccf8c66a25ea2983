"""The one rule for ``schema.name``: quoting as PostgreSQL reads it, refusals, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdc.cli import app
from cdc.incremental.filters import FilterRefused, check_expression
from cdc.publication import Mode, _alter, _create
from pgcdc.core.qualified_names import quote_table, split_list, split_name, split_qualified
from pgcdc.core.settings import load_settings

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


# --- the consumers read the settings' names by the same rule --------------------------------

SETTINGS = {
    "CDC_POSTGRES__TABLES": '"my.schema"."my.table", public."a""b"',
    "CDC_POSTGRES__SIGNAL_FILTER_FUNCTIONS": '"my.schema"."tenant.of"',
}


def test_the_publication_lists_the_tables_as_identifiers() -> None:
    tables = load_settings(environ=SETTINGS).postgres.listed_tables
    assert _create("pub", tables, Mode.FILTERED).as_string(None) == (
        'CREATE PUBLICATION "pub" FOR TABLE "my.schema"."my.table", "public"."a""b"'
    )
    assert _alter("pub", tables).as_string(None) == (
        'ALTER PUBLICATION "pub" SET TABLE "my.schema"."my.table", "public"."a""b"'
    )


def test_a_filter_may_call_a_listed_function_with_dots_in_its_names() -> None:
    allowed = load_settings(environ=SETTINGS).postgres.signal_filter_functions
    checked = check_expression('"my.schema"."tenant.of"(id) = 1', ["id"], allowed)
    assert checked.functions == {("my.schema", "tenant.of")}
    with pytest.raises(FilterRefused, match="is not allowed in a filter"):
        check_expression('"my.schema".tenant(id) = 1', ["id"], allowed)


@pytest.mark.parametrize("name", ["a.b.c", "orders", '"a.b', 'a"b".c'])
def test_cdc_forget_refuses_a_name_the_rule_refuses_before_connecting(name: str) -> None:
    result = CliRunner().invoke(app, ["forget", name], env={"CDC_CONFIG": None})
    assert result.exit_code != 0
    assert f"table {name!r}" in result.output, result.output
