"""ensure_publication on the stack's PostgreSQL: what it creates and aligns, and how it says so."""

from __future__ import annotations

import logging

import psycopg
import pytest

from cdc.publication import Mode, ensure_publication

pytestmark = pytest.mark.integration


def test_creating_then_aligning_the_publication_is_logged_in_plain_words(
    pg_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
        with caplog.at_level(logging.INFO, logger="cdc.publication"):
            assert ensure_publication(conn, "pub", [("public", "a")]) == [("public", "a")]
            assert ensure_publication(conn, "pub", [("public", "a"), ("public", "b")]) == [
                ("public", "a"),
                ("public", "b"),
            ]
    assert [r.getMessage() for r in caplog.records] == [
        "created publication",
        "altered publication",
    ]


def test_a_listed_table_with_dots_in_its_names_is_published_and_then_left_alone(
    pg_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    table = ("my.schema", "my.table")  # postgres.tables = '"my.schema"."my.table"'
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "my.schema"')
        conn.execute('CREATE TABLE "my.schema"."my.table" (id int PRIMARY KEY)')
        with caplog.at_level(logging.INFO, logger="cdc.publication"):
            assert ensure_publication(conn, "pub", [table]) == [table]
            # It covers exactly the listed table: nothing to alter, even where it may not.
            assert ensure_publication(conn, "pub", [table], Mode.DISABLED) == [table]
    assert [r.getMessage() for r in caplog.records] == ["created publication"]
