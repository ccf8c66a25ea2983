"""What cdc verify asks OpenSearch of the row digests the search follower keeps (issue 32),
and the same folds computed in Python from the rows a test wrote."""

from __future__ import annotations

from typing import Any

from pgcdc.core import row_digest

_F = row_digest.FIELD
_INTERVAL = 2 ** (32 - row_digest.BUCKET_BITS)


def digest_folds(client: Any, index: str) -> dict[int, tuple[int, int, int, int]]:
    """Per bucket of the key hash, (rows, sums of h1, h2, h3), folded by OpenSearch from the
    digests its documents keep: what cdc verify asks."""
    client.indices.refresh(index=index)
    body = {
        "size": 0,
        "aggs": {
            "b": {
                "histogram": {"field": f"{_F}.b", "interval": _INTERVAL, "min_doc_count": 1},
                "aggs": {h: {"sum": {"field": f"{_F}.{h}"}} for h in ("h1", "h2", "h3")},
            }
        },
    }
    buckets = client.search(index=index, body=body)["aggregations"]["b"]["buckets"]
    return {
        int(b["key"]) // _INTERVAL: (
            b["doc_count"],
            *(int(b[h]["value"]) for h in ("h1", "h2", "h3")),
        )
        for b in buckets
    }


def python_folds(docs: dict[str, dict[str, Any]]) -> dict[int, tuple[int, int, int, int]]:
    """The same folds of the rows as the test wrote them, from row_digest.stored."""
    folds: dict[int, list[int]] = {}
    for key, doc in docs.items():
        kept = row_digest.stored(key, doc)
        fold = folds.setdefault(row_digest.bucket(kept["b"]), [0, 0, 0, 0])
        for i, part in enumerate((1, kept["h1"], kept["h2"], kept["h3"])):
            fold[i] += part
    return {b: (f[0], f[1], f[2], f[3]) for b, f in folds.items()}


def digests_missing(client: Any, index: str) -> int:
    """How many documents of ``index`` keep no digest (verify reads those back)."""
    client.indices.refresh(index=index)
    body = {"size": 0, "aggs": {"m": {"missing": {"field": f"{_F}.b"}}}}
    return int(client.search(index=index, body=body)["aggregations"]["m"]["doc_count"])
