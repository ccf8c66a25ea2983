"""The demo's final check: every table's rows in PostgreSQL, Redis and OpenSearch, compared.

Counts and contents: each row is brought to one comparable form by :mod:`demo.compare`,
which the end-to-end tests use too, so the demo and the tests agree on what "equal" means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from rich.table import Table

from demo import documents
from demo.compare import cache_state, canonical, column_types, diff, search_state
from demo.resources import DemoNames
from demo.sample import KEYS, TABLES
from sinks.base import key_id


@dataclass(frozen=True)
class TableCheck:
    table: str
    leader: int
    redis: int | None  # None: not a Redis follower's (the joined documents)
    search: int
    redis_diff: str  # '' when Redis holds exactly the database's rows
    search_diff: str

    @property
    def ok(self) -> bool:
        return not self.redis_diff and not self.search_diff


def leader_rows(dsn: str, table: str) -> dict[str, dict[str, Any]]:
    """The table's rows by document id (composite keys too, encoded as the sinks do)."""
    types = column_types(dsn, table)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT to_jsonb(t) FROM {table} t").fetchall()
    out: dict[str, dict[str, Any]] = {}
    for (r,) in rows:
        doc_id = key_id({k: r[k] for k in KEYS[table]})
        out[doc_id] = {c: canonical(v, types[c]) for c, v in r.items()}
    return out


def check_table(names: DemoNames, table: str) -> TableCheck:
    leader = leader_rows(names.dsn, table)
    cache = cache_state(names.dsn, names.redis_url, names.key_prefix, table)
    search = search_state(names.dsn, names.search_url, names.index_prefix, table)
    return TableCheck(
        table, len(leader), len(cache), len(search), diff(leader, cache), diff(leader, search)
    )


def check_all(names: DemoNames) -> list[TableCheck]:
    """One :class:`TableCheck` per sample table."""
    return [check_table(names, t) for t in TABLES]


def check_documents(names: DemoNames) -> TableCheck:
    """The joined product documents (demo/documents.py) against PostgreSQL's own join."""
    want = documents.postgres_join(names.dsn)
    got = documents.index_documents(names.search_url, names.index_prefix)
    label = f"{documents.DOCUMENT['name']} (joined documents)"
    return TableCheck(label, len(want), None, len(got), "", documents.differences(want, got))


def verification_table(checks: list[TableCheck]) -> Table:
    t = Table(title="verification: rows per table, contents compared")
    for col in ("table", "PostgreSQL", "Redis", "OpenSearch", "contents"):
        t.add_column(col, justify="left" if col in ("table", "contents") else "right")
    for c in checks:
        t.add_row(
            c.table,
            f"{c.leader:,}",
            "–" if c.redis is None else f"{c.redis:,}",
            f"{c.search:,}",
            "[green]equal[/]" if c.ok else "[red]DIFFERENT[/]",
        )
    return t
