"""`make demo`: the whole pipeline, live, on a sample product catalog.

Steps: remove what a previous demo left; create the ``demo`` database and load the sample
catalog; start the reader (``cdc run``), the shared sync job and the joined documents' job
(spark-submit) as real subprocesses in their own process groups; run a live workload of
inserts, updates, deletes and primary-key changes while the screen shows events/s, lags,
watermarks, a running search and the products of one category found by its name among the
joined documents, with their stock; wait for the followers to converge; compare PostgreSQL,
Redis and OpenSearch row by row, and the documents with PostgreSQL's own join; stop
everything and exit 0 only if all are equal.

On a terminal the screen is a rich Live layout; with CI=true or when stdout is not a
terminal it prints plain progress lines. Options: ``--workload-seconds`` (default 60),
``--tx-per-second`` (default 25), ``--toasted-key-changes`` (see demo/changes.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from rich.console import Console

from demo.resources import DemoNames
from demo.run import Demo, DemoFailed
from demo.screen import Screen
from demo.verify import TableCheck, verification_table
from pgcdc.core import ports
from pgcdc.core.settings import load_settings

NEXT_STEPS = f"""\
Where to look next (the demo's data stays until the next `make demo`):
  reader status   set -a; . .stack/demo/demo.env; set +a; .venv/bin/cdc status
  logs            .stack/demo/logs/{{reader,sync,documents_sync}}.log; servers: .stack/logs/
  Kafka topics    .venv/bin/python -m demo.peek demo.public.products 3   (last 3 events)
  Redis           redis-cli -p {ports.PORTS["redis"]} --scan --pattern 'demo:public.products:*' | head -3
                  redis-cli -p {ports.PORTS["redis"]} HGETALL demo:public.products:<id>
  OpenSearch      curl -s '{ports.OPENSEARCH_URL}/demo-public.products/_search?q=title:waterproof&size=3&pretty'
  documents       curl -s '{ports.OPENSEARCH_URL}/demo-products/_search?q=category.name:Lamps&size=3&pretty'
  PostgreSQL      (after sourcing demo.env as above) psql "$CDC_POSTGRES__DSN" -c '\\d+ products'
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m demo", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--workload-seconds", type=float, default=60.0)
    p.add_argument("--tx-per-second", type=float, default=25.0)
    p.add_argument(
        "--toasted-key-changes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also change the primary key of products with TOASTed descriptions (default on;\n"
        "the reader carries the unchanged description over to the new key)",
    )
    args = p.parse_args(argv)

    settings = load_settings()
    names = DemoNames(
        admin_dsn=settings.postgres.dsn.get_secret_value(),
        kafka_bootstrap=settings.kafka.bootstrap_servers,
        redis_url=settings.redis.url.get_secret_value(),
        search_url=settings.search.url.get_secret_value(),
    )
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    console = Console()
    live = sys.stdout.isatty() and not ci
    screen = Screen(live=live, console=console)
    demo = Demo(names, screen, args)
    checks: list[TableCheck] = []
    failure: str | None = None
    t0 = time.monotonic()
    try:
        with screen:
            checks = demo.run()
    except DemoFailed as e:
        failure = str(e)
    except KeyboardInterrupt:
        failure = "interrupted"
    finally:
        demo.stop()
    if not live and demo.last is not None:
        console.print(screen.plain_line(), markup=False, highlight=False, soft_wrap=True)
    if checks:
        console.print(verification_table(checks))
        for c in checks:
            for follower, d in (("Redis", c.redis_diff), ("OpenSearch", c.search_diff)):
                if d:
                    console.print(f"[red]{follower} differs from {c.table}:[/]\n{d}")
    console.print(NEXT_STEPS, markup=False, highlight=False, soft_wrap=True)
    took = time.monotonic() - t0
    if failure:
        console.print(f"[red]demo failed after {took:.0f}s:[/] {failure}", highlight=False)
        return 2
    ok = bool(checks) and all(c.ok for c in checks)
    console.print(
        f"[green]all followers equal PostgreSQL[/] ({took:.0f}s)"
        if ok
        else f"[red]followers differ from PostgreSQL[/] ({took:.0f}s)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
