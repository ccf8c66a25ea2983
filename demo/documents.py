"""The demo's joined document: one per product, with its category and its stock levels
(docs/documents.md), kept in the index ``<index_prefix>-products`` by the documents' job
(``spark_jobs/documents_sync.py``); the same join computed by PostgreSQL, which the demo's
final check and the end-to-end tests compare the index with; and the screen's search of it
by category name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg
from opensearchpy import OpenSearch
from opensearchpy.exceptions import NotFoundError

from benchmarks.workload.catalog_document import DOCUMENT as DOCUMENT
from benchmarks.workload.catalog_document import JOIN_SQL
from pgcdc.core.contract import document_index
from pgcdc.core.search_documents import every_document


def documents_env() -> dict[str, str]:
    """The setting that declares the demo's document, for the jobs' environment."""
    return {"CDC_SEARCH__DOCUMENTS": json.dumps([DOCUMENT])}


def index(index_prefix: str) -> str:
    return document_index(index_prefix, DOCUMENT["name"])


def postgres_join(dsn: str) -> dict[str, dict[str, Any]]:
    """Every product's document as PostgreSQL joins it, by document id."""
    with psycopg.connect(dsn) as conn:
        return {str(i): doc for i, doc in conn.execute(JOIN_SQL).fetchall()}


def index_documents(search_url: str, index_prefix: str) -> dict[str, dict[str, Any]]:
    """Every document of the index, by id (none while the index does not exist)."""
    return {h["_id"]: h["_source"] for h in every_document(search_url, index(index_prefix))}


def differences(want: dict[str, Any], got: dict[str, Any], limit: int = 5) -> str:
    """'' when equal; else the first few documents that differ."""
    lines = [f"missing {k}: {want[k]}" for k in sorted(want.keys() - got.keys())]
    lines += [f"extra {k}: {got[k]}" for k in sorted(got.keys() - want.keys())]
    lines += [
        f"{k}: want {want[k]}\n     got {got[k]}"
        for k in sorted(want.keys() & got.keys())
        if want[k] != got[k]
    ]
    return "\n".join(lines[:limit]) + (f"\n... {len(lines)} in all" if len(lines) > limit else "")


@dataclass(frozen=True)
class DocumentHit:
    id: str
    title: str
    category: str
    total_stock: int | None


def search_by_category(
    client: OpenSearch, index_prefix: str, category: str
) -> tuple[int | None, list[DocumentHit]]:
    """Products whose category's name matches ``category``; (total, the five with the most
    stock). None while the index does not exist."""
    body: dict[str, Any] = {
        "size": 5,
        "track_total_hits": True,
        "query": {"match": {"category.name": category}},
        "_source": ["title", "category.name", "total_stock"],
        # Not on _id: sorting on it is deprecated (a warning).
        "sort": [{"total_stock": {"order": "desc", "unmapped_type": "long"}},
                 {"id": {"order": "asc", "unmapped_type": "long"}}],
    }  # fmt: skip
    try:
        res = client.search(index=index(index_prefix), body=body)
    except NotFoundError:
        return None, []
    hits = []
    for h in res["hits"]["hits"]:
        src = h["_source"]
        hits.append(
            DocumentHit(
                h["_id"],
                str(src.get("title")),
                str((src.get("category") or {}).get("name")),
                src.get("total_stock"),
            )
        )
    return int(res["hits"]["total"]["value"]), hits
