"""PostgreSQL's rows rendered as each follower stores them, against what the followers held.

``items_rows.json`` was captured from a running pipeline (the table of
``tests/e2e/test_verify.py``: numeric, timestamptz, text[], jsonb, double precision): each
row's Debezium ``after`` JSON as the reader encodes it, the envelope schema, and the row as
Redis (hash fields) and OpenSearch (``_source``) held it after the sync job applied it. The
digests ``cdc verify`` computes on both sides must agree, and must tell a changed field.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from pgcdc.core.row_digest import canonical, digest_of_canonical
from pgcdc.verify.followers import CacheFollower, SearchFollower, document_converter
from sinks.cache import CacheSink

pytestmark = pytest.mark.unit

CAPTURED = json.loads((Path(__file__).parent / "items_rows.json").read_text())


def _cache(mode: str = "hash") -> CacheFollower:
    # No connection is made: only the sink's layout settings are used here.
    return CacheFollower(CacheSink("redis://127.0.0.1:1/0", "p", value_mode=mode))


def _search() -> SearchFollower:
    return SearchFollower(SimpleNamespace())  # type: ignore[arg-type]


def _docs() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    to_doc = document_converter(orjson.dumps(CAPTURED["envelope_schema"]))
    return [(row, to_doc(row["after_json"].encode())) for row in CAPTURED["rows"]]


def test_the_captured_rows_hold_the_types_that_matter() -> None:
    row = CAPTURED["rows"][0]
    assert row["redis_hash"]["price"] == '"8.75"'  # Decimal bytes became exact text
    assert isinstance(row["search_source"]["tags"], list)
    assert len(CAPTURED["rows"]) == 2


def test_the_cache_digest_of_a_rendered_row_is_the_held_hashs() -> None:
    cache = _cache()
    for row, doc in _docs():
        key = row["key"]
        held = {c: v.encode() for c, v in row["redis_hash"].items()}
        assert cache.stored_digest(key, held) == cache.digest(key, doc)
        changed = {**held, "name": orjson.dumps("other")}
        assert cache.stored_digest(key, changed) != cache.digest(key, doc)
        assert cache.stored_digest(key, {}) is None


def test_the_search_digest_of_a_rendered_row_is_the_held_sources() -> None:
    search = _search()
    for row, doc in _docs():
        key = row["key"]
        source = orjson.loads(orjson.dumps(row["search_source"]))
        held = digest_of_canonical(key, canonical(source))
        assert held == search.digest(key, doc)
        changed = {**source, "price": "0.01"}
        assert digest_of_canonical(key, canonical(changed)) != held


def test_the_json_mode_cache_digest_ignores_key_order_only() -> None:
    cache = _cache("json")
    row, doc = _docs()[0]
    stored = orjson.dumps(dict(reversed(list(doc.items()))))
    assert cache.stored_digest(row["key"], stored) == cache.digest(row["key"], doc)
    assert cache.stored_digest(row["key"], orjson.dumps({**doc, "id": -1})) != cache.digest(
        row["key"], doc
    )
