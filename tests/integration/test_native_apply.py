"""A direct-read task on the native path (``spark.apply = native``) into the real Redis and
OpenSearch: a range taken part by part while the followers write, and a range whose later
part holds a record off the native path (the rest goes the Python way)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from opensearchpy import OpenSearch

from benchmarks.envelope import rows as table_rows
from benchmarks.envelope import sources, table
from pgcdc.core import native
from pgcdc.core.contract import HEADER_COMMIT_LSN, HEADER_ORDER, HEADER_UNCHANGED
from pgcdc.core.settings import SchemaSettings, Settings
from schemas.envelope import EventEncoder
from sinks.base import Change
from sinks.cache import CacheSink
from sinks.search_index import index_name
from spark_jobs import fast_changes
from spark_jobs.apply_loop import apply_ranges
from spark_jobs.changes import ChangeBuilder
from spark_jobs.kafka_direct import Range, read_range
from spark_jobs.parse import CHANGE, SCHEMA, RecordParser
from spark_jobs.reduce import latest_per_key
from spark_jobs.stats import BatchStats
from spark_jobs.sync import FOLLOWERS
from tests.conftest import Endpoints

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        native.module() is None or not hasattr(native.module(), "FastChanges"),
        reason="pgcdc's native module is not built (make install, with cargo)",
    ),
]

PART = 100  # records a part (spark_jobs.fast_changes._PART), so that a range has several
KEYS = 150
CHANGES = 1_000


def _produce(endpoints: Endpoints, prefix: str, off_at: int | None) -> str:
    """``CHANGES`` updates of ``KEYS`` keys of the reader's encoder (each key in several
    parts, its versions rising with the offsets), a delete and its tombstone now and then,
    into a topic of one partition; with ``off_at``, that change says it left columns
    unchanged (a record the native path leaves to Python). The topic's name."""
    enc = EventEncoder(SchemaSettings(), prefix, "db")
    tbl = table()
    (source,) = sources(1)
    topic = f"{prefix}.{tbl.schema}.{tbl.table}"
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap, "linger.ms": 5})

    def send(
        key: bytes | None, value: bytes | None, lsn: int, order: int, extra: bool = False
    ) -> None:
        headers: list[tuple[str, str | bytes | None]] = [
            (HEADER_COMMIT_LSN, str(lsn).encode()),
            (HEADER_ORDER, str(order).encode()),
        ]
        if extra:
            headers.append((HEADER_UNCHANGED, b"[]"))
        producer.produce(topic, value, key, headers=headers)

    for i, row in enumerate(table_rows(CHANGES)):
        row = (str(i % KEYS), *row[1:])
        key = enc.encode_key(tbl, row)
        send(key, enc.encode_value(tbl, "u", None, row, source), 1000 + i, 0, i == off_at)
        if i % 53 == 9:
            send(key, enc.encode_value(tbl, "d", row, None, source), 1000 + i, 1)
            send(key, None, 1000 + i, 1)
        producer.poll(0)
    assert producer.flush(30) == 0
    return topic


def _expected(endpoints: Endpoints, prefix: str, topic: str) -> dict[str, Change]:
    """Each key's newest change, as the Python path reduces the whole topic."""
    conf = {"bootstrap.servers": endpoints.kafka_bootstrap}
    records = list(read_range(conf, Range(topic, 0, 0, 10**9), stall_s=5))
    rows = latest_per_key(RecordParser(prefix).rows(records))
    build = ChangeBuilder({r["schema_id"]: r["schema_json"] for r in rows if r["kind"] == SCHEMA})
    return {c.key: c for c in (build(r) for r in rows if r["kind"] == CHANGE)}


def _end(endpoints: Endpoints, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": endpoints.kafka_bootstrap, "group.id": "marks"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Parts of :data:`PART` records; the list grows by the changes of each take."""
    monkeypatch.setattr(fast_changes, "_PART", PART)
    takes: list[int] = []
    take = fast_changes.NativeParts.take

    def counted(
        self: fast_changes.NativeParts,
    ) -> tuple[list[Change], list[tuple[str, int, int]], int]:
        got = take(self)
        takes.append(len(got[0]))
        return got

    monkeypatch.setattr(fast_changes.NativeParts, "take", counted)
    yield takes


@pytest.mark.parametrize("off_at", [None, 620], ids=["native", "python-after-620"])
def test_a_range_taken_part_by_part_leaves_both_followers_at_each_keys_newest(
    endpoints: Endpoints,
    topic_prefix: str,
    key_prefix: str,
    index_prefix: str,
    small_parts: list[int],
    off_at: int | None,
) -> None:
    topic = _produce(endpoints, topic_prefix, off_at)
    settings = Settings.model_validate(
        {
            "spark": {"apply": "native"},
            "kafka": {"topic_prefix": topic_prefix, "bootstrap_servers": endpoints.kafka_bootstrap},
            "redis": {"url": endpoints.redis_url, "key_prefix": key_prefix},
            "search": {"url": endpoints.search_url, "index_prefix": index_prefix},
        }
    )
    followers = [FOLLOWERS["cache"], FOLLOWERS["search"]]
    r = Range(topic, 0, 0, _end(endpoints, topic))
    stats: list[BatchStats] = list(apply_ranges(settings, followers, None, [r], [0]))

    # The first take comes right after the first part (the followers had nothing to write
    # yet); the whole range took two at least. With a record off the path, what was added
    # since the last take is dropped and the rest of the range goes the Python way: a second
    # stats row a follower, with no native change.
    assert small_parts and small_parts[0] > 0, small_parts
    assert sorted({s.job for s in stats}) == sorted(f.job for f in followers)
    assert all(s.unreachable is None and s.failed == 0 for s in stats), stats
    if off_at is None:
        assert len(small_parts) >= 2, small_parts
        assert len(stats) == 2 and all(s.native == sum(small_parts) for s in stats)
    else:
        assert len(stats) == 4
        assert sorted(s.native for s in stats) == [0, 0, sum(small_parts), sum(small_parts)]
        assert all(s.applied > 0 for s in stats)

    expected = _expected(endpoints, topic_prefix, topic)
    table_name = next(iter(expected.values())).table
    cache = CacheSink(endpoints.redis_url, key_prefix)
    try:
        for key, c in expected.items():
            assert cache.read_row(table_name, key) == c.doc, key
    finally:
        cache.close()
    search = OpenSearch(endpoints.search_url)
    index = index_name(index_prefix, table_name)
    search.indices.refresh(index=index)
    hits = search.search(index=index, body={"size": KEYS + 10, "query": {"match_all": {}}})
    held = {h["_id"]: h["_source"] for h in hits["hits"]["hits"]}
    assert held == {k: c.doc for k, c in expected.items() if c.doc is not None}
    assert any(c.doc is None for c in expected.values())  # a key deleted last is gone
