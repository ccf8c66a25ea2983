"""`make demo`: start from a running stack and show each real service answering.

The full demo (sample catalog, the reader, both followers, live workload) replaces this once the
reader and the followers exist; for now it proves the local stack is real.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import redis
from confluent_kafka.admin import AdminClient
from opensearchpy import OpenSearch
from rich.console import Console
from rich.table import Table

from cdc.config import load_settings


def main() -> int:
    settings = load_settings()
    console = Console()
    table = Table(title="Local stack")
    for col in ("service", "endpoint", "answer", "ms"):
        table.add_column(col)
    ok = True

    def probe(name: str, endpoint: str, fn) -> None:  # type: ignore[no-untyped-def]
        nonlocal ok
        t0 = time.perf_counter()
        try:
            answer = fn()
            style = "green"
        except Exception as e:  # shown to the user, then the demo fails
            answer, style, ok = f"{type(e).__name__}: {e}", "red", False
        table.add_row(
            name, endpoint, f"[{style}]{answer}[/]", f"{(time.perf_counter() - t0) * 1e3:.0f}"
        )

    dsn = settings.postgres.dsn.get_secret_value()

    def pg() -> str:
        with psycopg.connect(dsn, connect_timeout=5) as c:
            version, wal = c.execute("SELECT version(), current_setting('wal_level')").fetchone()  # type: ignore[misc]
            return f"{version.split(',')[0]}, wal_level={wal}"

    def kafka() -> str:
        md = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers}).list_topics(
            timeout=10
        )
        return f"{len(md.brokers)} broker(s), {len(md.topics)} topic(s)"

    def cache() -> str:
        r = redis.Redis.from_url(settings.redis.url.get_secret_value(), socket_timeout=5)
        key = f"demo:{uuid.uuid4().hex}"
        r.set(key, "ok", ex=10)
        info = r.info("server")
        return f"Redis {info['redis_version']}, SET/GET {r.get(key).decode()}"  # type: ignore[union-attr]

    def search() -> str:
        info = OpenSearch(settings.search.url.get_secret_value(), timeout=10).info()
        return f"OpenSearch {info['version']['number']}"

    probe("PostgreSQL", dsn.split("@")[-1], pg)
    probe("Kafka", settings.kafka.bootstrap_servers, kafka)
    probe("Redis", settings.redis.url.get_secret_value(), cache)
    probe("OpenSearch", settings.search.url.get_secret_value(), search)
    console.print(table)
    console.print("Logs: .stack/logs/<service>.log   Stop: scripts/stack down")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
