"""OpenSearch warmed up before a run measures the followers.

Right after the stack starts, OpenSearch's JVM has compiled little of its indexing path: the
search follower's documents cost it 155, 85, 67, 56, 45, 37 and 33 µs of CPU each over the
first seven rounds of 60,000 (measured 2026-12-01, 512 MB heap). A run that measured the
followers first then charged OpenSearch's start to whichever mode came first, and a ratio of
two modes in the same run compared a cold server with a warm one. So the run first indexes
rounds of documents shaped like the benchmarks' rows through the search follower itself
(:class:`sinks.search.SearchSink`: the same mapping, versions and row digest) into an index
of its own, until a round costs OpenSearch within :data:`STEADY` of the one before it (its
cost stopped moving), and deletes the index.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from collections.abc import Sequence
from typing import Any, Final

from benchmarks import servers
from sinks.base import Change
from sinks.search import SearchSink

log = logging.getLogger(__name__)

TABLE: Final = "public.warmup"
STEADY: Final = 0.10  # a round within this fraction of the one before it, either way: warm
_STRINGS = ("new", "paid", "shipped", "done")


def _field(name: str, kind: str, semantic: str | None = None) -> dict[str, Any]:
    f: dict[str, Any] = {"field": name, "type": kind, "optional": True}
    if semantic is not None:
        f["name"] = semantic
    return f


# The benchmarks' 10-column row (benchmarks.workload's tables) as the reader's schema says it
# (captured: tests/fixtures/orders_after_fields.json). The amount is a Connect Decimal, which
# the search follower maps as a number read from the decimal's text, and the timestamps are
# ZonedTimestamps, dates, each row's its own in the reader's form. The rounds once wrote the
# amount as a plain string (text with a keyword) and one "+00:00" timestamp for every row:
# the first backlog after them spent 2.5 s of OpenSearch's C2 compiler's CPU, 2.0 s with
# these rows. The rest is the jobs' own writing, which the backlog group warms up on its own
# (benchmarks.followers_backlog.warm_passes). Measured 2026-12-01.
SCHEMA: Final = {
    "type": "struct",
    "fields": [
        {
            "field": "after",
            "type": "struct",
            "fields": [
                _field("id", "int64"),
                _field("customer_id", "int32"),
                _field("status", "string"),
                {
                    **_field("amount", "bytes", "org.apache.kafka.connect.data.Decimal"),
                    "version": 1,
                    "parameters": {"scale": "2", "connect.decimal.precision": "12"},
                },
                _field("quantity", "int32"),
                _field("sku", "string"),
                _field("description", "string"),
                _field("created_at", "string", "io.debezium.time.ZonedTimestamp"),
                _field("updated_at", "string", "io.debezium.time.ZonedTimestamp"),
                _field("version", "int32"),
            ],
        }
    ],
}


def _doc(n: int, start: datetime.datetime) -> dict[str, Any]:
    """Row ``n`` as the search follower gets it: like ``benchmarks.workload.orders``' rows, its
    decimal as text and its timestamps as the reader writes a ZonedTimestamp (UTC, ``Z``,
    microseconds), each row's its own."""
    text = hashlib.md5(str(n).encode()).hexdigest()
    at = (start + datetime.timedelta(microseconds=n)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "id": n,
        "customer_id": (n * 7919) % 100_000,
        "status": _STRINGS[n % 4],
        "amount": f"{(n % 100_000) / 100:.2f}",
        "quantity": 1 + n % 10,
        "sku": f"SKU-{n % 99_991:08d}",
        "description": (text * 3)[:84],
        "created_at": at,
        "updated_at": at,
        "version": 1,
    }


def warm(per_doc: Sequence[float]) -> bool:
    """Whether the rounds so far (OpenSearch's CPU a document in each) say it is warm: the
    last round's cost is within :data:`STEADY` of the one before it, either way (it stopped
    moving). A round that cost more than that above the one before is a pause (a collection,
    a merge, the compiler at work), not a plateau: a fresh server went 321, 133, 192 µs and
    was taken as warm at 192 (make bench cef49a); another went 298, 124, 178, 114, 140, 68.5,
    71.8, still halving after its spikes (2026-12-04)."""
    if len(per_doc) < 2:
        return False
    last, before = per_doc[-1], per_doc[-2]
    return before * (1 - STEADY) <= last <= before * (1 + STEADY)


def warm_opensearch(
    search_url: str, index_prefix: str, *, docs: int, max_rounds: int, chunk: int = 2_000
) -> list[float]:
    """Index rounds of ``docs`` documents until OpenSearch is warm (:func:`warm`) or
    ``max_rounds`` ran; OpenSearch's CPU a document in each round (µs). The index is deleted
    after."""
    sink = SearchSink(search_url, index_prefix)
    start = datetime.datetime.now(datetime.UTC)
    per_doc: list[float] = []
    try:
        sink.register_schema(TABLE, SCHEMA, 1)
        for r in range(max_rounds):
            first = r * docs
            changes = [
                Change(TABLE, str(n), 1_000 + n, 0, _doc(n, start))
                for n in range(first, first + docs)
            ]
            before = servers.cpu_seconds().get("opensearch")
            for at in range(0, docs, chunk):
                sink.apply(changes[at : at + chunk])
            after = servers.cpu_seconds().get("opensearch")
            if before is None or after is None:
                break  # not the stack's OpenSearch: its CPU cannot be read
            per_doc.append((after - before) / docs * 1e6)
            log.info(
                "warming OpenSearch: round %d, %.1f µs of its CPU a document", r + 1, per_doc[-1]
            )
            if warm(per_doc):
                break
    finally:
        try:
            sink.client.indices.delete(index=f"{index_prefix}*", ignore_unavailable=True)
        finally:
            sink.close()
    return per_doc
