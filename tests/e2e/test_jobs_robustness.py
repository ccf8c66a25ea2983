"""Both sync jobs in one Spark session (local[2]) against the real Kafka, Redis and
OpenSearch, reading a table topic of 3 partitions:

- issue 12 e2e 4, a poison corpus among good records: a key that is not JSON, a value that
  is not JSON, a scalar key, a ``c`` event with ``after: null``, dates 'infinity', in year
  10000 and BC, a number too large for OpenSearch's ``long``, and a 60 MB document. Every
  record is applied or dead-lettered with its reason and Kafka position; no query stops;
  the good records around them are applied.
- issue 12 e2e 5, each follower unreachable for 30 s mid-stream. The shared servers cannot
  be stopped, so each job reaches its follower through a TCP proxy this test cuts: from the
  job's side an honest outage (connections reset and refused), while the server itself stays
  up for the other users of the stack. The jobs pause and retry, then converge, and nothing
  is dead-lettered for the outage.
- the watermark with several partitions: once it passes a heartbeat, every change committed
  before that heartbeat is in the follower.

The 60 MB document goes to the Redis follower only: the shared OpenSearch runs with a 512 MB
heap that other tests use at the same time, and a 60 MB source document there risks its
circuit breakers for everyone (bulk bodies and 413s are covered by
tests/unit/sinks/test_search_bulk_bytes.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB, VersionOrder, redis_watermark_key
from pgcdc.core.settings import Settings
from schemas.convert import DATE_POSITIVE_INFINITY_DAYS
from tests.conftest import Endpoints, unique, wait_until
from tests.e2e.pipeline import spark_paths
from tests.e2e.proxy import Proxy

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

ROW = [
    {"field": "id", "type": "int32", "optional": False},
    {"field": "name", "type": "string", "optional": True},
    {"field": "day", "type": "int32", "optional": True, "name": "io.debezium.time.Date"},
    {"field": "qty", "type": "int64", "optional": True},
    {"field": "body", "type": "string", "optional": True},
]
ENVELOPE = {
    "type": "struct",
    "name": "t.public.items.Envelope",
    "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": ROW},
        {"field": "after", "type": "struct", "optional": True, "fields": ROW},
        {"field": "op", "type": "string", "optional": False},
    ],
}
GOOD = 150  # good rows, ids 1..GOOD
YEAR_10000 = 2_932_897  # days from 1970-01-01 to 10000-01-01
BC_DAY = -740_000  # a day in the 4th century BC


def _key(i: Any) -> bytes:
    return orjson.dumps({"schema": {"type": "struct", "fields": ROW[:1]}, "payload": {"id": i}})


def _value(op: str, after: dict[str, Any] | None, lsn: int) -> bytes:
    payload = {
        "before": None,
        "after": after,
        "source": {"schema": "public", "table": "items", "lsn": lsn, "txId": 7, "ts_ms": 1},
        "op": op,
        "ts_ms": int(time.time() * 1000),
    }
    # The standard library writes integers of any size (orjson stops at 64 bits).
    return json.dumps({"schema": ENVELOPE, "payload": payload}).encode()


class Topics:
    """The test's topics and a producer that remembers where each record landed."""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        self.prefix = prefix
        self.items = f"{prefix}.public.items"
        self.blobs = f"{prefix}.public.blobs"
        self.heartbeat = f"{prefix}.heartbeat"
        self.dlq = f"{prefix}.dlq"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        big = {"cleanup.policy": "compact", "max.message.bytes": str(64 * 1024 * 1024)}
        new = [
            NewTopic(self.items, 3, 1, config=big),
            NewTopic(self.blobs, 1, 1, config=big),
            NewTopic(self.heartbeat, 1, 1),
        ]
        for fut in admin.create_topics(new).values():
            fut.result(timeout=30)
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "message.max.bytes": 70_000_000, "linger.ms": 5}
        )
        self.placed: dict[str, tuple[str, int, int]] = {}  # label -> (topic, partition, offset)
        self.lsn = 1000
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Like the reader: a heartbeat every half second with the acknowledged LSN.
        self._beats = threading.Thread(target=self._beat_forever, daemon=True)
        self._beats.start()

    def send(
        self, label: str, key: bytes | None, value: bytes | None, topic: str | None = None
    ) -> int:
        """Produce one record with its version headers; returns its commit LSN."""

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            self.placed[label] = (msg.topic(), msg.partition(), msg.offset())

        with self._lock:  # a heartbeat reading the LSN sees this record produced
            self.lsn += 16
            lsn = self.lsn
            self.producer.produce(
                topic or self.items,
                key=key,
                value=value,
                headers=list(VersionOrder(lsn, 0).headers()),
                on_delivery=delivered,
            )
        return lsn

    def beat(self) -> int:
        """A reader heartbeat: the highest LSN sent, once Kafka acknowledged everything."""
        with self._lock:
            lsn = self.lsn
        self.flush()
        self.producer.produce(
            self.heartbeat, key=b'{"serverName":"t"}', value=orjson.dumps({"lsn": lsn})
        )
        self.flush()
        return lsn

    def _beat_forever(self) -> None:
        while not self._stop.wait(0.5):
            self.beat()

    def close(self) -> None:
        self._stop.set()
        self._beats.join(10)

    def flush(self) -> None:
        assert self.producer.flush(120) == 0


@pytest.fixture
def topics(endpoints: Endpoints, topic_prefix: str) -> Iterator[Topics]:
    t = Topics(endpoints.kafka_bootstrap, topic_prefix)
    yield t
    t.close()


def _letters(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("dlq"),
            "enable.partition.eof": True,
            "fetch.max.bytes": 64 * 1024 * 1024,
        }
    )
    try:
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return []
        parts = list(md.partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out, done = [], set()
        deadline = time.monotonic() + 30
        while len(done) < len(parts) and time.monotonic() < deadline:
            m = c.poll(1)
            if m is None:
                continue
            if m.error() is not None:
                done.add(m.partition())
                continue
            out.append(orjson.loads(m.value()))
        return out
    finally:
        c.close()


def _redis_row(r: redis.Redis, key_prefix: str, i: Any) -> dict[str, Any] | None:
    raw = r.hgetall(f"{key_prefix}:public.items:{i}")
    return {k.decode(): orjson.loads(v) for k, v in raw.items()} if raw else None


def test_poison_records_and_follower_outages(
    spark: Any,
    endpoints: Endpoints,
    topics: Topics,
    key_prefix: str,
    index_prefix: str,
    tmp_path: Path,
) -> None:
    from opensearchpy import OpenSearch

    from spark_jobs.apply_loop import ApplyBatch
    from spark_jobs.cache_sync import cache_sink
    from spark_jobs.options import JobOptions
    from spark_jobs.search_sync import search_sink
    from spark_jobs.source import kafka_stream

    redis_url = urlsplit(endpoints.redis_url)
    search_url = urlsplit(endpoints.search_url)
    redis_proxy = Proxy(redis_url.hostname or "127.0.0.1", redis_url.port or 6379)
    search_proxy = Proxy(search_url.hostname or "127.0.0.1", search_url.port or 9200)
    settings = Settings(
        kafka={  # type: ignore[arg-type]
            "bootstrap_servers": endpoints.kafka_bootstrap,
            "topic_prefix": topics.prefix,
            "heartbeat_topic": topics.heartbeat,
            "dead_letter_topic": topics.dlq,
        },
        redis={"url": redis_proxy.url("redis") + redis_url.path, "key_prefix": key_prefix},  # type: ignore[arg-type]
        search={"url": search_proxy.url("http"), "index_prefix": index_prefix},  # type: ignore[arg-type]
        spark={  # type: ignore[arg-type]
            "checkpoint_dir": str(tmp_path),
            "follower_retry_s": 300,
            **spark_paths(),
        },
    )

    def options(job: str, *topic_names: str) -> JobOptions:
        return JobOptions(
            name=job,
            heartbeat_topic=topics.heartbeat,
            topics=topic_names,
            topic_pattern=None,
            starting_offsets="earliest",
            checkpoint=str(tmp_path / job),
            available_now=False,
            trigger_interval="300 milliseconds",
            max_offsets_per_trigger=None,
        )

    jobs = {
        CACHE_JOB: (options(CACHE_JOB, topics.items, topics.blobs), cache_sink),
        SEARCH_JOB: (options(SEARCH_JOB, topics.items), search_sink),
    }
    batches: dict[str, ApplyBatch] = {}
    queries: dict[str, Any] = {}
    for job, (opts, make_sink) in jobs.items():
        batches[job] = ApplyBatch(settings, opts, make_sink)
        query = (
            batches[job]
            .events(kafka_stream(spark, settings, opts))
            .writeStream.foreachBatch(batches[job])
            .option("checkpointLocation", opts.checkpoint)
            .trigger(processingTime=opts.trigger_interval)
            .queryName(f"{job}_{topics.prefix}")
            .start()
        )
        batches[job].last_progress = lambda q=query: q.lastProgress
        queries[job] = query

    r = redis.Redis.from_url(endpoints.redis_url)
    search = OpenSearch(endpoints.search_url)
    index = f"{index_prefix}-public.items"
    try:
        # -- wave 1: good rows with the poison corpus among them -----------------------
        for i in range(1, GOOD + 1):
            after = {"id": i, "name": f"v1-{i}", "day": 19000 + i, "qty": i, "body": "b"}
            topics.send(f"good{i}", _key(i), _value("c", after, topics.lsn))
            if i == GOOD // 2:
                poison = {
                    "key-not-json": (b"{not json", _value("c", {"id": 9001}, 1)),
                    "value-not-json": (_key(9002), b"\x00\xffnot json at all"),
                    "scalar-key": (b"42", _value("c", {"id": 42}, 1)),
                    "after-null": (_key(9003), _value("c", None, 1)),
                    "day-infinity": (
                        _key(9004),
                        _value("c", {"id": 9004, "day": DATE_POSITIVE_INFINITY_DAYS}, 1),
                    ),
                    "day-10000": (_key(9005), _value("c", {"id": 9005, "day": YEAR_10000}, 1)),
                    "day-bc": (_key(9006), _value("c", {"id": 9006, "day": BC_DAY}, 1)),
                    "qty-too-large": (_key(9007), _value("c", {"id": 9007, "qty": 2**70}, 1)),
                }
                for label, (k, v) in poison.items():
                    topics.send(label, k, v)
        h1 = topics.beat()

        def wave(n: int) -> bool:
            want = [f"v{n}-{i}" for i in range(1, GOOD + 1)]
            got = [(_redis_row(r, key_prefix, i) or {}).get("name") for i in range(1, GOOD + 1)]
            if got != want:
                return False
            search.indices.refresh(index=index)
            docs = search.mget(index=index, body={"ids": [str(i) for i in range(1, GOOD + 1)]})
            return [d.get("_source", {}).get("name") for d in docs["docs"]] == want

        wait_until(lambda: wave(1), timeout=300, interval=1, what="wave 1 in both followers")
        # The watermark across 3 partitions: once past the heartbeat, everything before it
        # is there (rows are checked right after the watermark is seen).
        wm_key = redis_watermark_key(key_prefix, CACHE_JOB)
        wait_until(lambda: int(r.get(wm_key) or 0) >= h1, timeout=120, what="the watermark past h1")
        assert all(_redis_row(r, key_prefix, i) for i in range(1, GOOD + 1))
        # The 60 MB document, once the watermark is checked (its batch takes a while).
        blob = "x" * (60 * 1024 * 1024)
        topics.send("blob", _key(1), _value("c", {"id": 1, "body": blob}, 1), topics.blobs)

        # -- every poison record is applied or dead-lettered, with a reason -------------
        def settled() -> dict[str, list[dict[str, Any]]]:
            letters = _letters(endpoints.kafka_bootstrap, topics.dlq)
            by_job: dict[str, list[dict[str, Any]]] = {CACHE_JOB: [], SEARCH_JOB: []}
            for letter in letters:
                by_job[letter["job"]].append(letter)
            return by_job

        def at(letters: list[dict[str, Any]], label: str) -> dict[str, Any] | None:
            topic, partition, offset = topics.placed[label]
            for letter in letters:
                if (letter["topic"], letter["partition"], letter["offset"]) == (
                    topic,
                    partition,
                    offset,
                ):
                    return letter
            return None

        unreadable = ("key-not-json", "value-not-json", "scalar-key", "after-null")
        letters = wait_until(
            lambda: (
                (s := settled()) and all(at(s[j], lab) for j in jobs for lab in unreadable) and s
            ),
            timeout=120,
            what="the unreadable records dead-lettered by both jobs",
        )
        for job in jobs:
            for label in unreadable:
                letter = at(letters[job], label)
                assert letter is not None and letter["reason"], (job, label)
        assert "not JSON" in at(letters[CACHE_JOB], "key-not-json")["reason"]  # type: ignore[index]
        assert "Debezium" in at(letters[CACHE_JOB], "value-not-json")["reason"]  # type: ignore[index]
        assert "JSON object" in at(letters[CACHE_JOB], "scalar-key")["reason"]  # type: ignore[index]
        assert "'after'" in at(letters[CACHE_JOB], "after-null")["reason"]  # type: ignore[index]
        # Dates PostgreSQL accepts reach Redis in PostgreSQL's own text.
        assert _redis_row(r, key_prefix, 9004)["day"] == "infinity"  # type: ignore[index]
        assert _redis_row(r, key_prefix, 9005)["day"] == "10000-01-01"  # type: ignore[index]
        assert _redis_row(r, key_prefix, 9006)["day"].endswith(" BC")  # type: ignore[index]
        # In OpenSearch each is applied or refused by the mapping and dead-lettered.
        for label, doc_id in (
            ("day-infinity", 9004),
            ("day-10000", 9005),
            ("day-bc", 9006),
            ("qty-too-large", 9007),
        ):
            held = search.get(index=index, id=str(doc_id), ignore=[404])
            letter = at(letters[SEARCH_JOB], label)
            assert held.get("found") or (letter is not None and letter["reason"]), label
        assert at(letters[SEARCH_JOB], "qty-too-large") is not None  # long cannot hold 2**70

        # The 60 MB document is applied whole.
        def blob_done() -> tuple[int, dict[str, Any] | None] | None:
            held = r.hstrlen(f"{key_prefix}:public.blobs:1", "body")
            letter = at(settled()[CACHE_JOB], "blob")
            return (held, letter) if held or letter else None

        held, letter = wait_until(blob_done, timeout=240, interval=2, what="the 60 MB document")
        assert letter is None, letter  # applied, not dead-lettered
        assert held == len(blob) + 2
        no_letters_for_good = [
            lt
            for j in jobs
            for lt in letters[j]
            if lt["offset"] is None or "unreachable" in lt["reason"]
        ]
        assert not no_letters_for_good

        # -- wave 2 while each follower is unreachable for 30 s ---------------------------
        before = {j: len(v) for j, v in letters.items()}
        redis_proxy.cut()
        search_proxy.cut()
        cut_at = time.monotonic()
        for i in range(1, GOOD + 1):
            after = {"id": i, "name": f"v2-{i}", "day": 19000 + i, "qty": i, "body": "b"}
            topics.send(f"good{i}", _key(i), _value("u", after, topics.lsn))
        h2 = topics.beat()
        wait_until(
            lambda: all(b.outage_retries for b in batches.values()),
            timeout=60,
            interval=0.5,
            what="both jobs to pause and retry on the outage",
        )
        time.sleep(max(0.0, 30 - (time.monotonic() - cut_at)))  # the outage lasts 30 s
        assert all(q.isActive for q in queries.values()), "a job stopped on the outage"
        assert redis_proxy.refused and search_proxy.refused  # they kept trying
        redis_proxy.restore()
        search_proxy.restore()

        wait_until(lambda: wave(2), timeout=300, interval=1, what="wave 2 after the outage")
        wait_until(lambda: int(r.get(wm_key) or 0) >= h2, timeout=120, what="the watermark past h2")
        assert all(q.isActive and q.exception() is None for q in queries.values())
        after_outage = settled()
        assert {j: len(v) for j, v in after_outage.items()} == before, (
            "something was dead-lettered for the outage"
        )
    finally:
        for q in queries.values():
            q.stop()
        r.close()
        search.close()
        redis_proxy.close()
        search_proxy.close()
