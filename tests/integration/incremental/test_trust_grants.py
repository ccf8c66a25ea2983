"""The signal table's trust check counts every way a role can insert a row (issue 34,
finding 2): a grant on the table's columns, to a role or to PUBLIC, is a grant to insert."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from cdc.incremental.signal_table import untrusted_writers
from tests.conftest import Endpoints, unique

pytestmark = pytest.mark.integration


@pytest.fixture
def conn(endpoints: Endpoints) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    schema = unique("trust")
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
        c.execute(f'CREATE TABLE "{schema}".sig (id text PRIMARY KEY, type text, data text)')
        c.execute(f'SET search_path TO "{schema}"')
        try:
            yield c
        finally:
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_a_column_grant_to_a_role_or_to_public_makes_the_table_untrusted(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    schema = conn.execute("SELECT current_schema()").fetchone()
    assert schema is not None
    table = (str(schema[0]), "sig")
    role = unique("writer")
    conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        assert untrusted_writers(conn, table, []) is None  # only the superusers and the reader
        conn.execute(f'GRANT INSERT (id, type, data) ON sig TO "{role}"')
        said = untrusted_writers(conn, table, [])
        assert said is not None and f"roles {role} may insert" in said, said
        assert untrusted_writers(conn, table, [role]) is None  # trusted by name
        conn.execute(f'REVOKE INSERT (id, type, data) ON sig FROM "{role}"')
        conn.execute("GRANT INSERT (data) ON sig TO PUBLIC")
        said = untrusted_writers(conn, table, [role])
        assert said is not None and said.startswith("PUBLIC may insert"), said
    finally:
        conn.execute("REVOKE ALL ON sig FROM PUBLIC")
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')
