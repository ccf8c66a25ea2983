"""PostgreSQL says what a filter calls (issue 34, finding 1): the filter is compiled into a
throwaway view and its analysed tree judged, so field notation (``(x).f`` is ``f(x)``),
casts into catalog lookups and stable functions are refused whatever their spelling. Run as
a role with LOGIN and SELECT on the table only, as a least-privilege reader is."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from cdc.connection import connect
from cdc.incremental.filters import FilterRefused, check_expression, check_on_server
from tests.conftest import Endpoints, unique

pytestmark = pytest.mark.integration

COLUMNS = ["id", "v", "d"]


@pytest.fixture(scope="module")
def reader_conn(endpoints: Endpoints) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection of a role that may only log in and read the table."""
    schema, role, password = unique("filters"), unique("filter_reader"), "a-long-password-1"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        admin.execute(f'CREATE TABLE "{schema}".t (id int PRIMARY KEY, v text, d date)')
        admin.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'")
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT SELECT ON "{schema}".t TO "{role}"')
        parts = urlsplit(endpoints.postgres_dsn)
        netloc = f"{role}:{password}@{parts.hostname}:{parts.port}"
        conn = connect(urlunsplit(parts._replace(netloc=netloc)))
        conn.info_schema = schema  # type: ignore[attr-defined]
        try:
            yield conn
        finally:
            conn.close()
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
            admin.execute(f'DROP ROLE "{role}"')


def _check(conn: psycopg.Connection[tuple[object, ...]], text: str) -> None:
    checked = check_expression(text, COLUMNS)
    check_on_server(conn, checked, conn.info_schema, "t")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        # Field notation: PostgreSQL reads (x).f as f(x).
        ("(CAST(0.001 AS float8)).pg_sleep IS NULL", "function pg_sleep is not allowed"),
        ("(CAST('server_version' AS text)).current_setting LIKE '1%'", "current_setting"),
        ("(CAST(v AS text)).pg_read_file IS NULL", "pg_read_file"),
        # Casts and calls that reach the catalog.
        ("'pg_authid'::regclass::oid > 0", "type regclass"),
        ("v::regclass IS NULL", "regclass is stable"),  # text to regclass: a function
        ("to_regclass('public.secrets') IS NOT NULL", "to_regclass"),
        ("obj_description(1259::oid, 'pg_class') IS NULL", "obj_description is stable"),
        ("version() LIKE 'P%'", "version is stable"),
        ("current_user = 'x'", "CURRENT_USER"),
        ("d > now()::date", "is stable"),
        ("v::date > '2024-01-01'", "date_in is stable"),  # an I/O cast runs date's input
    ],
)
def test_what_the_analysed_filter_calls_is_judged(
    reader_conn: psycopg.Connection[tuple[object, ...]], text: str, reason: str
) -> None:
    with pytest.raises(FilterRefused, match=reason):
        _check(reader_conn, text)


@pytest.mark.parametrize(
    "text",
    [
        "id % 2 = 0",
        "v LIKE 'a%' AND id IN (1, 2, 3)",
        "(id, v) > (1, 'a')",
        "coalesce(v, 'x') <> 'y' AND greatest(id, 3) > 2",
        "lower(v) = 'a' OR v IS NULL",
        "d > '2024-01-01' AND d BETWEEN '2024-01-01' AND '2025-01-01'",
        "CASE WHEN id > 10 THEN v ELSE 'x' END = 'x'",
        "length(v::varchar(10)) > 2",
    ],
)
def test_an_immutable_filter_over_the_columns_passes(
    reader_conn: psycopg.Connection[tuple[object, ...]], text: str
) -> None:
    _check(reader_conn, text)
    # The check left nothing behind: its transaction was rolled back.
    row = reader_conn.execute(
        "SELECT count(*) FROM pg_catalog.pg_class WHERE relname = 'cdc_filter_check'"
    ).fetchone()
    assert row == (0,)
