"""The joined documents' fan-out (issue 33): one category holding ``--products`` products is
renamed, and every product's document must show the new name.

    .venv/bin/python -m benchmarks.documents_fanout [--products 100000] [--keep]

The demo catalog's three tables (categories, products, stock levels: one stock row a
product) in a database of the run's own, the demo's ``products`` document declared
(``docs/documents.md``), our reader streaming, and the documents' job
(``spark_jobs/documents_sync.py``, as users submit it) streaming from the topics' start.
Measured:

1. the first build: seconds from the job's start until the index holds every product;
2. the fan-out: one ``UPDATE categories SET name = …``; seconds from its commit until a
   count of the documents with the new name (``match_phrase`` on ``category.name``, after a
   refresh) reaches every product. Polled every 0.2 s;
3. the join's state on disk (the checkpoint's ``documents-state``) and the job's peak RSS
   (its process tree, JVM and Python) over the run.

Target: the fan-out within 30 s on this machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch

from benchmarks.context import Bench
from benchmarks.env import BenchEnv, run_alone
from benchmarks.followers import SparkJobs
from benchmarks.ours import OursReader
from benchmarks.results import Figure
from benchmarks.workload.catalog_document import DOCUMENT
from pgcdc.core.settings import load_settings

log = logging.getLogger("bench.documents_fanout")

TABLES = ["public.categories", "public.products", "public.stock_levels"]
DDL = """
CREATE TABLE categories (id int PRIMARY KEY, name text NOT NULL, parent_id int);
CREATE TABLE products (
    id int PRIMARY KEY, sku text NOT NULL, category_id int NOT NULL, title text NOT NULL,
    price numeric(10, 2) NOT NULL, active boolean NOT NULL DEFAULT true);
CREATE TABLE stock_levels (
    product_id int NOT NULL, warehouse text NOT NULL, quantity int NOT NULL,
    PRIMARY KEY (product_id, warehouse));
"""
_POLL_S = 0.2
_BUILD_LIMIT_S = 1800.0
_FANOUT_LIMIT_S = 600.0


def _load(env: BenchEnv, products: int) -> None:
    env.create_database()
    with env.connect() as conn:
        conn.execute(DDL)
        conn.execute("INSERT INTO categories VALUES (1, 'Lighting', NULL), (2, 'Desks', NULL)")
        conn.execute(
            "INSERT INTO products SELECT i, 'SKU-' || i, 1, 'Product ' || i, (i %% 1000) / 10.0, "
            "true FROM generate_series(1, %s) i",
            (products,),
        )
        conn.execute(
            "INSERT INTO stock_levels SELECT i, 'north', i %% 17 FROM generate_series(1, %s) i",
            (products,),
        )


def _count(client: OpenSearch, index: str, name: str | None = None) -> int:
    """Documents in ``index`` (with ``category.name`` = ``name`` if given), after a refresh;
    0 while the index does not exist."""
    if not client.indices.exists(index=index):
        return 0
    client.indices.refresh(index=index)
    body = {"query": {"match_phrase": {"category.name": name}}} if name else None
    return int(client.count(index=index, body=body)["count"])


def _wait(
    jobs: SparkJobs, what: str, limit_s: float, done: Any, started: float | None = None
) -> float:
    """Seconds from ``started`` (now if None) until ``done()`` holds; fails on a dead job."""
    t0 = time.monotonic() if started is None else started
    while not done():
        if (dead := jobs.dead()) is not None:
            raise RuntimeError(dead)
        if time.monotonic() - t0 > limit_s:
            raise RuntimeError(f"{what}: not done after {limit_s:.0f} s")
        time.sleep(_POLL_S)
    return time.monotonic() - t0


def _state_bytes(checkpoints: Path) -> int:
    """Bytes of every ``documents-state`` directory under the job's checkpoints."""
    total = 0
    for state in checkpoints.rglob("documents-state"):
        total += sum(f.stat().st_size for f in state.rglob("*") if f.is_file())
    return total


def run(env: BenchEnv, products: int) -> dict[str, Any]:
    """Load, build, rename, measure; every figure of the run."""
    settings = load_settings()
    search_url = settings.search.url.get_secret_value()
    _load(env, products)
    reader = OursReader(env, TABLES, role="df")
    prefix = env.name("df")
    jobs = SparkJobs(
        env, reader.prefix, reader.workdir, jobs=("documents_sync",), follower_prefix=prefix,
        starting_offsets="earliest",
    )  # fmt: skip
    index = f"{prefix}-{DOCUMENT['name']}".lower()
    client = OpenSearch(hosts=[search_url], timeout=60)
    streaming = reader.launch(until_current=False, snapshot_mode="initial")
    os.environ["CDC_SEARCH__DOCUMENTS"] = json.dumps([DOCUMENT])
    try:
        jobs.start()
        build_s = _wait(jobs, "the first build", _BUILD_LIMIT_S,
                        lambda: _count(client, index) >= products)  # fmt: skip
        log.info("the index holds %d documents %.1f s after the job started", products, build_s)
        new_name = f"Lamps {time.time_ns()}"
        with env.connect() as conn:
            conn.execute("UPDATE categories SET name = %s WHERE id = 1", (new_name,))
            committed = time.monotonic()
        fanout_s = _wait(jobs, "the fan-out", _FANOUT_LIMIT_S,
                         lambda: _count(client, index, new_name) >= products, committed)  # fmt: skip
        log.info("%d documents show the new name %.1f s after its commit", products, fanout_s)
        state = _state_bytes(jobs.checkpoints)
    finally:
        os.environ.pop("CDC_SEARCH__DOCUMENTS", None)
        rss = jobs.stop()
        reader.finish(streaming)
        if not env.keep:
            client.indices.delete(index=f"{prefix}-*", ignore_unavailable=True)
    return {
        "products": products,
        "build_s": round(build_s, 1),
        "fanout_s": round(fanout_s, 1),
        "fanout_docs_per_s": round(products / fanout_s),
        "state_mib": round(state / 2**20, 1),
        "peak_rss_mib": round(rss["documents_sync"]),
        "peak_parts": jobs.peak_parts.get("documents_sync", ""),
    }


def documents_fanout(b: Bench) -> None:
    """The ``documents`` group: 100,000 products (quick: 5,000); figures under
    ``documents``."""
    products = 5_000 if b.env.quick else 100_000
    detail = (
        f"{products:,} products in one category, one rename, the documents' job streaming "
        "(local[2]); target ≤ 30 s"
    )
    names = ["fan-out of one rename, s", "first build, s", "join state on disk, MiB",
             "job peak RSS, MiB"]  # fmt: skip
    with b.record.guarded("documents", names, detail):
        got = run(b.env, products)
        b.record.add(Figure("documents", names[0], got["fanout_s"], "s", detail))
        b.record.add(Figure("documents", names[1], got["build_s"], "s", detail))
        b.record.add(Figure("documents", names[2], got["state_mib"], "MiB", detail))
        b.record.add(Figure("documents", names[3], got["peak_rss_mib"], "MiB",
                            f"{detail}; {got['peak_parts']}"))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.documents_fanout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--products", type=int, default=100_000)
    p.add_argument("--keep", action="store_true", help="keep the database, topics and index")
    a = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("opensearch").setLevel(logging.ERROR)
    return run_alone(a.keep, "documents_fanout", lambda env: run(env, a.products))


if __name__ == "__main__":
    sys.exit(main())
