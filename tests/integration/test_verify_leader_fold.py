"""PostgreSQL's side of a folded ``cdc verify`` (:meth:`cdc.verify_leader.PostgresLeader.fold`):
split into ranges of the table's pages, a process each, in one exported snapshot, it folds
exactly as one read of the table does, and as the Python fold of the documents that read
renders; with the native module (``pgcdc_native``) and without.
"""

from __future__ import annotations

import psycopg
import pytest

import cdc.verify_leader as leader_module
from cdc import copy_render
from cdc.verify_leader import PostgresLeader
from pgcdc.core import native
from pgcdc.core.row_digest import bucket, fold_docs, key_hash
from pgcdc.core.settings import load_settings
from pgcdc.verify.followers import document_converter
from sinks.base import key_id

pytestmark = pytest.mark.integration

T = "public.items"


@pytest.mark.parametrize("native_module", ["on", "off"])
def test_a_table_folded_in_ranges_of_pages_folds_as_one_read(
    pg_database: str, monkeypatch: pytest.MonkeyPatch, native_module: str
) -> None:
    monkeypatch.setenv("PGCDC_NATIVE", native_module)  # the fold's processes inherit it
    if native_module == "on" and native.module() is None:
        pytest.skip("pgcdc_native is not installed (make install builds it where cargo is)")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        # Few rows a page (fillfactor 10), so that a few thousand rows fill many pages. Even
        # rows hold an array and JSON (rendered through JSON text), odd ones only values JSON
        # gives back as they are (the fold's shortcut).
        conn.execute(
            "CREATE TABLE public.items (id bigint PRIMARY KEY, name text, price numeric(10,2),"
            " at timestamptz, tags text[], note jsonb) WITH (fillfactor = 10)"
        )
        conn.execute(
            "INSERT INTO public.items SELECT g, 'item ' || g || E' {x}\\t\u00e9', g / 4.0,"
            " '2026-01-01'::timestamptz + g * interval '1.5 s',"
            " CASE WHEN g % 2 = 0 THEN ARRAY['a', g::text] END,"
            " CASE WHEN g % 2 = 0 THEN jsonb_build_object('z', g, 'a', null) END"
            " FROM generate_series(1, 3000) g"
        )
        pages = leader_module._page_ranges(conn, "public", "items", 2)
    assert pages == [None]  # under the size worth a second process
    monkeypatch.setattr(leader_module, "_SPLIT_PAGES", 1)
    with psycopg.connect(pg_database) as conn:
        pages = leader_module._page_ranges(conn, "public", "items", 2)
    assert len(pages) == 2 and pages[0] is not None and pages[1] is not None, pages
    assert pages[0][1] == pages[1][0] and pages[1][1] is None  # adjoining, the last open

    settings = load_settings(None, {"postgres": {"dsn": pg_database}})
    leader = PostgresLeader(settings, [("public", "items")], document_converter, key_id)
    split = leader.fold(T)
    monkeypatch.setattr(leader_module, "FOLD_PROCESSES", 1)
    whole = leader.fold(T)
    docs = leader.read(T).rows
    assert split.rows == whole.rows == len(docs) == 3000
    assert split.folds == whole.folds == fold_docs(docs)


def test_native_rendering_of_copy_lines_folds_as_python(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table of the types the native module renders from COPY text
    (:mod:`cdc.copy_render`): its rows folded there, and those it hands back (an
    escape, infinity, a placeholder's text, a null where a fill goes) by Python, give the
    fold of the documents Python renders from a read of the table."""
    if native.module() is None:
        pytest.skip("pgcdc_native is not installed (make install builds it where cargo is)")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.plain (id bigint PRIMARY KEY, n int, ok boolean, name text,"
            " price numeric(10,2), tiny numeric(20,9), whole numeric(30), at timestamptz,"
            " at3 timestamptz(3), u uuid, doc jsonb)"
        )
        conn.execute(
            "INSERT INTO public.plain SELECT g, g * 7, g % 3 = 0,"
            " CASE g % 50 WHEN 0 THEN E'tab\\there' WHEN 1 THEN '__debezium_unavailable_value'"
            " ELSE 'name ' || g || ' \u00e9 \"q\"' END,"
            " g / 4.0, g / 1e9, g * 1e20, CASE WHEN g % 97 = 0 THEN 'infinity'"
            " ELSE '2026-01-01'::timestamptz + g * interval '1.25 s' END,"
            " '2026-01-01'::timestamptz + g * interval '1.0005 s',"
            " md5(g::text)::uuid, CASE WHEN g % 2 = 0 THEN jsonb_build_object('z', g) END"
            " FROM generate_series(1, 3000) g"
        )
    settings = load_settings(None, {"postgres": {"dsn": pg_database}})
    leader = PostgresLeader(settings, [("public", "plain")], document_converter, key_id)
    made = []
    copy_rows, page_ranges = copy_render.copy_rows, leader_module._page_ranges

    def spy(*args: object) -> object:
        rows = copy_rows(*args)  # type: ignore[arg-type]
        made.append(rows)
        return rows

    monkeypatch.setattr(copy_render, "copy_rows", spy)
    with psycopg.connect(pg_database) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        folds, count = leader._fold_rows(conn, "public", "plain")
        conn.execute("ROLLBACK")
    docs = leader.read("public.plain").rows
    assert count == len(docs) == 3000
    assert folds == fold_docs(docs)
    (rows,) = made
    assert rows is not None and 2800 < rows.rows < 3000  # most native, the odd ones Python's

    # Buckets read row by row: the rows of those buckets, rendered natively or by Python,
    # are the documents Python renders.
    chosen = frozenset(bucket(key_hash(k)) for k in list(docs)[::7])
    picked = leader.read_buckets("public.plain", chosen)
    assert len(made) == 2 and made[1] is not None  # the native path, again
    want = {k: d for k, d in docs.items() if bucket(key_hash(k)) in chosen}
    odd = {k for k in docs if int(k) % 50 in (0, 1) or int(k) % 97 == 0}  # Python renders
    assert picked.rows == want and odd & set(want) and set(want) - odd

    # A pass over it takes one process, however many pages: the native rendering outpaces
    # the stores' folds, and a second process would take CPU from them.
    parts = []
    monkeypatch.setattr(leader_module, "_SPLIT_PAGES", 1)
    monkeypatch.setattr(
        leader_module, "_page_ranges", lambda *a: parts.append(a[-1]) or page_ranges(*a)
    )
    assert leader.fold("public.plain").folds == folds
    assert parts == [1]
