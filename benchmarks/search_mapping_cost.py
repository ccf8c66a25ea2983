"""What a document costs OpenSearch, by what the index keeps beside the row (issue 30):
``python -m benchmarks.search_mapping_cost [--docs 100000] [--rounds 4]``.

Each round indexes ``--docs`` documents shaped like the benchmark's 10-column rows (five
numbers, three strings, two timestamps) into a fresh index of each layout, in bulk requests
of 1,000 with external versions as the search follower writes them, then refreshes, and
reports OpenSearch's CPU a document (its process tree's, :func:`benchmarks.servers.cpu_seconds`),
the wall time and the index's store once refreshed. The layouts, in the order run each round:

* ``ours``: the follower's index (:func:`sinks.search_index.dynamic_mapping`): the row digest
  (:mod:`pgcdc.core.row_digest`) mapped and left out of ``_source``, and no
  ``_recovery_source`` kept (:func:`sinks.search_index.without_recovery_source`, OpenSearch
  2.15+);
* ``recovery-source``: the same, with the ``_recovery_source`` OpenSearch keeps by default
  (the follower's indices before 2026-12-02);
* ``digest-in-source``: the same mapping, the digest kept in ``_source`` (for this measure
  only: ``_source`` is then no longer the row);
* ``no-digest``: the row alone (:func:`~sinks.search_index.dynamic_mapping` without it).

The first round warms OpenSearch's compilers and is printed but not summed up. Run it alone
on the machine, against the local stack (``scripts/stack up``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import orjson
from opensearchpy import OpenSearch

from benchmarks.servers import cpu_seconds
from pgcdc.core import row_digest
from pgcdc.core.ports import OPENSEARCH_URL
from sinks.search_index import dynamic_mapping, index_settings, without_recovery_source

LAYOUTS = ("ours", "recovery-source", "digest-in-source", "no-digest")
BULK = 1_000


def _mapping(layout: str) -> dict[str, Any]:
    if layout == "no-digest":
        return dynamic_mapping(digest=False)
    mapping = dynamic_mapping()
    if layout == "digest-in-source":
        del mapping["_source"]
    return without_recovery_source(mapping) if layout == "ours" else mapping


def _row(n: int) -> dict[str, Any]:
    return {
        "id": n,
        "customer_id": n % 977,
        "status": ("pending", "paid", "shipped")[n % 3],
        "amount": f"{n % 1000}.{n % 100:02d}",
        "quantity": n % 50,
        "sku": f"SKU-{n:08d}",
        "description": f"order {n} " + "x" * 74,
        "created_at": "2026-11-28T10:00:00.123456Z",
        "updated_at": "2026-11-28T10:00:01.654321Z",
        "priority": n % 5,
    }


def _bodies(index: str, docs: int, digest: bool) -> list[bytes]:
    bodies = []
    for start in range(0, docs, BULK):
        lines = []
        for n in range(start, min(start + BULK, docs)):
            key = str(n)
            row = _row(n)
            meta = {"index": {"_index": index, "_id": key, "version": n + 1}}
            meta["index"]["version_type"] = "external_gte"
            if digest:
                row[row_digest.FIELD] = row_digest.stored(key, _row(n))
            lines += [orjson.dumps(meta), orjson.dumps(row)]
        bodies.append(b"\n".join(lines) + b"\n")
    return bodies


def measure(client: OpenSearch, layout: str, docs: int) -> tuple[float, float, float]:
    """OpenSearch's CPU a document (µs), the wall time (s) of indexing ``docs`` documents
    into a fresh index of ``layout``, and the index's store then (MB)."""
    index = f"bench-mapping-cost-{layout}-{uuid.uuid4().hex[:8]}"
    client.indices.create(
        index=index, body={"settings": index_settings(), "mappings": _mapping(layout)}
    )
    try:
        bodies = _bodies(index, docs, layout != "no-digest")
        before, started = cpu_seconds()["opensearch"], time.monotonic()
        for body in bodies:
            answer = client.bulk(body=body, params={"filter_path": "errors"})
            if answer.get("errors"):
                raise SystemExit(f"{layout}: OpenSearch refused documents")
        client.indices.refresh(index=index)
        wall = time.monotonic() - started
        cpu = cpu_seconds()["opensearch"] - before
        stats = client.indices.stats(index=index, metric="store")["indices"][index]
        store = stats["primaries"]["store"]["size_in_bytes"] / 1e6
    finally:
        client.indices.delete(index=index)
    return cpu / docs * 1e6, wall, store


def main() -> None:
    parser = argparse.ArgumentParser(
        description="OpenSearch's CPU a document by what the index keeps beside the row."
    )
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=4, help="the first one only warms")
    parser.add_argument("--url", default=OPENSEARCH_URL)
    args = parser.parse_args()
    client = OpenSearch(args.url, timeout=120)
    if "opensearch" not in cpu_seconds():
        raise SystemExit("no OpenSearch of the local stack runs: scripts/stack up")
    seen: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for n in range(args.rounds):
        for layout in LAYOUTS:
            per_doc, wall, store = measure(client, layout, args.docs)
            if n > 0:
                seen[layout].append(per_doc)
            warm = " (warming, not summed)" if n == 0 else ""
            print(
                f"round {n + 1} {layout:17s} {per_doc:5.1f} µs a document, {wall:.2f} s, "
                f"store {store:.1f} MB{warm}"
            )
    for layout, values in seen.items():
        if values:
            print(
                f"{layout:17s} {min(values):5.1f}–{max(values):5.1f} µs a document "
                f"(median {statistics.median(values):.1f}, {len(values)} rounds)"
            )


if __name__ == "__main__":
    main()
