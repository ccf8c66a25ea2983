"""ensure_publication on the stack's PostgreSQL: what it creates and aligns, and how it says so."""

from __future__ import annotations

import logging

import psycopg
import pytest

from cdc.publication import ensure_publication

pytestmark = pytest.mark.integration


def test_creating_then_aligning_the_publication_is_logged_in_plain_words(
    pg_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
        with caplog.at_level(logging.INFO, logger="cdc.publication"):
            assert ensure_publication(conn, "pub", ("public.a",)) == [("public", "a")]
            assert ensure_publication(conn, "pub", ("public.a", "public.b")) == [
                ("public", "a"),
                ("public", "b"),
            ]
    assert [r.getMessage() for r in caplog.records] == [
        "created publication",
        "altered publication",
    ]
