"""What the demo's screen shows, read from the real servers once per tick.

- Reader: the slot's lag, ``pg_current_wal_lsn() - confirmed_flush_lsn`` in bytes (what is
  committed in PostgreSQL but not yet acknowledged by Kafka).
- Kafka: the end offsets of the table topics; their growth per second is the events/s.
- Followers: the offsets the shared job (spark_jobs/sync.py) has committed to its Spark
  checkpoint (the last batch with a commit file), or, for a follower that fell behind, the
  offsets it is behind since (``followers-behind.json``); "behind" is Kafka's end offsets minus
  those. And each follower's watermark (the highest commit LSN it applied), compared with the
  slot's confirmed flush LSN in bytes.
- A full-text search on the products index, whose results change as the workload runs.
- The joined product documents (demo/documents.py) of one category, found by its name, with
  their stock, which the workload's stock updates change.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from confluent_kafka import Consumer, TopicPartition
from opensearchpy import OpenSearch
from opensearchpy.exceptions import NotFoundError

from demo.documents import DocumentHit, search_by_category
from demo.resources import DemoNames
from demo.sample import DOCUMENTS_CATEGORY, SEARCH_WORD
from pgcdc.core.contract import (
    CACHE_JOB,
    DOCUMENTS_JOB,
    JOBS,
    SEARCH_JOB,
    SYNC_JOB,
    redis_watermark_key,
)
from pgcdc.core.lsn import Lsn
from sinks.search import SearchSink
from sinks.search_index import index_name
from spark_jobs import behind


@dataclass(frozen=True)
class Hit:
    id: str
    title: str
    price: str


@dataclass
class Sample:
    """One reading of every figure on the screen."""

    at: float
    wal_lsn: int = 0
    flush_lsn: int | None = None  # the slot's confirmed_flush_lsn (acked by Kafka)
    slot_active: bool = False
    kafka_end: dict[str, int] = field(default_factory=dict)  # topic -> sum of end offsets
    applied: dict[str, dict[str, int] | None] = field(
        default_factory=dict
    )  # job -> topic -> offset
    watermark: dict[str, int | None] = field(default_factory=dict)
    search_total: int | None = None
    search_hits: list[Hit] = field(default_factory=list)
    # The joined product documents (demo/documents.py): those of DOCUMENTS_CATEGORY, and the
    # events of the documents' topics its job has not committed (None: nothing yet).
    documents_total: int | None = None
    documents_hits: list[DocumentHit] = field(default_factory=list)
    documents_behind: int | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def slot_lag_bytes(self) -> int | None:
        return None if self.flush_lsn is None else max(0, self.wal_lsn - self.flush_lsn)

    @property
    def kafka_total(self) -> int:
        return sum(self.kafka_end.values())

    def behind(self, job: str) -> int | None:
        """Events in Kafka that ``job`` has not yet committed as applied."""
        applied = self.applied.get(job)
        if applied is None:
            return None if self.kafka_end else 0
        return sum(max(0, end - applied.get(t, 0)) for t, end in self.kafka_end.items())

    def watermark_lag_bytes(self, job: str) -> int | None:
        w = self.watermark.get(job)
        if w is None or self.flush_lsn is None:
            return None
        return max(0, self.flush_lsn - w)


def committed_offsets(checkpoint: Path) -> dict[str, int] | None:
    """Kafka offsets of the last batch a Structured Streaming checkpoint has committed.

    The offset log's file ``offsets/<n>`` holds a version line, a metadata line, then one JSON
    line per source (``{topic: {partition: offset}}``); ``commits/<n>`` appears once batch n
    is done. Returns {topic: sum over partitions}, or None before the first commit.
    """
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return None
    done = sorted((int(p.name) for p in commits.iterdir() if p.name.isdigit()), reverse=True)
    for batch in done:
        try:
            lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
        except FileNotFoundError:  # purged by Spark's retention meanwhile
            continue
        out: dict[str, int] = {}
        for line in lines[2:]:
            for topic, parts in json.loads(line).items():
                out[topic] = sum(int(v) for v in parts.values())
        return out
    return None


def follower_offsets(checkpoint: Path) -> dict[str, dict[str, int] | None]:
    """Per follower job, the offsets it has applied up to in the shared job checkpointed at
    ``checkpoint``: the committed batch's, or where a follower left behind stopped."""
    committed = committed_offsets(checkpoint)
    left_behind = behind.load(checkpoint) if checkpoint.is_dir() else {}
    out: dict[str, dict[str, int] | None] = {}
    for job in JOBS:
        b = left_behind.get(job)
        if b is None:
            out[job] = committed
        else:
            out[job] = {t: sum(max(0, v) for v in parts.values()) for t, parts in b.offsets.items()}
    return out


class Monitor:
    """Reads the figures; keeps its connections open between ticks."""

    def __init__(self, names: DemoNames) -> None:
        self.names = names
        self.pg = psycopg.connect(names.admin_dsn, autocommit=True)
        self.consumer = Consumer(
            {"bootstrap.servers": names.kafka_bootstrap, "group.id": "demo-monitor"}
        )
        self.redis = redis.Redis.from_url(names.redis_url, socket_timeout=5)
        self.search = SearchSink(names.search_url, names.index_prefix, max_attempts=1)
        self.os = OpenSearch(names.search_url, timeout=5, max_retries=0)

    def close(self) -> None:
        self.pg.close()
        self.consumer.close()
        self.redis.close()
        self.search.close()
        self.os.close()

    def sample(self) -> Sample:
        s = Sample(at=time.monotonic())
        for part in (self._slot, self._kafka, self._followers, self._search, self._documents):
            try:
                part(s)
            except Exception as e:  # shown on the screen; the next tick tries again
                s.errors.append(f"{part.__name__.strip('_')}: {type(e).__name__}: {e}")
        return s

    def _slot(self, s: Sample) -> None:
        row = self.pg.execute(
            "SELECT pg_current_wal_lsn()::text, "
            "(SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s), "
            "(SELECT active FROM pg_replication_slots WHERE slot_name = %s)",
            (self.names.slot, self.names.slot),
        ).fetchone()
        assert row is not None
        s.wal_lsn = Lsn.parse(row[0]).value
        s.flush_lsn = Lsn.parse(row[1]).value if row[1] else None
        s.slot_active = bool(row[2])

    def _kafka(self, s: Sample) -> None:
        prefix = self.names.topic_prefix + "."
        md = self.consumer.list_topics(timeout=5)
        for name, topic in md.topics.items():
            # Table topics only: <prefix>.<schema>.<table>, as the jobs subscribe.
            if not name.startswith(prefix) or name[len(prefix) :].count(".") != 1:
                continue
            total = 0
            for p in topic.partitions:
                _low, high = self.consumer.get_watermark_offsets(TopicPartition(name, p), timeout=5)
                total += high
            s.kafka_end[name] = total

    def _followers(self, s: Sample) -> None:
        s.applied.update(follower_offsets(self.names.checkpoint_dir / SYNC_JOB))
        raw = self.redis.get(redis_watermark_key(self.names.key_prefix, CACHE_JOB))
        s.watermark[CACHE_JOB] = int(raw) if raw else None
        s.watermark[SEARCH_JOB] = self.search.read_watermark(SEARCH_JOB)

    def _search(self, s: Sample) -> None:
        s.search_total, s.search_hits = search_products(self.os, self.names, SEARCH_WORD)

    def _documents(self, s: Sample) -> None:
        applied = committed_offsets(self.names.checkpoint_dir / DOCUMENTS_JOB)
        if applied is not None:  # the job reads the documents' topics only
            s.documents_behind = sum(
                max(0, end - applied[t]) for t, end in s.kafka_end.items() if t in applied
            )
        s.documents_total, s.documents_hits = search_by_category(
            self.os, self.names.index_prefix, DOCUMENTS_CATEGORY
        )


def search_products(
    client: OpenSearch, names: DemoNames, text: str
) -> tuple[int | None, list[Hit]]:
    """Full-text match on product titles and descriptions; (total hits, top 5)."""
    index = index_name(names.index_prefix, "public.products")
    body: dict[str, Any] = {
        "size": 5,
        "track_total_hits": True,
        "query": {"multi_match": {"query": text, "fields": ["title^3", "description"]}},
        "_source": ["title", "price"],
        # Ties by the product id field: sorting on _id is deprecated (a warning).
        "sort": [{"_score": "desc"}, {"id": {"order": "asc", "unmapped_type": "long"}}],
    }
    try:
        res = client.search(index=index, body=body)
    except NotFoundError:
        return None, []
    hits = [
        Hit(h["_id"], str(h["_source"].get("title")), str(h["_source"].get("price")))
        for h in res["hits"]["hits"]
    ]
    return int(res["hits"]["total"]["value"]), hits
