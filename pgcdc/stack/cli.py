"""Command line of ``scripts/stack``: up, down, status, env, jars."""

from __future__ import annotations

import argparse
import fcntl
import importlib
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pgcdc.core.ports import HOST, KAFKA_CONTROLLER_PORT, PORTS, SERVICES, env_vars
from pgcdc.stack import common, prereqs
from pgcdc.stack.service import Service

HELP = f"""\
Run the project's servers natively on {HOST} (no Docker):

  postgres    PostgreSQL 15 (Debian postgresql-15), wal_level=logical  port {PORTS["postgres"]}
  redis       Redis (Debian redis-server), no persistence              port {PORTS["redis"]}
  kafka       Kafka 4.x KRaft (Maven Central jars), broker+controller  port {PORTS["kafka"]} (controller {KAFKA_CONTROLLER_PORT})
  opensearch  OpenSearch 2.19 integ-test zip (Maven Central), JDK 17   port {PORTS["opensearch"]}

State lives in .stack/ (STACK_DIR), downloads in .cache/ (CACHE_DIR); both are gitignored,
so `down` then `up` downloads nothing. Logs: .stack/logs/<service>.log. Pidfiles:
.stack/run/<service>.pid. Missing Debian packages are installed with apt-get (needs root).
`jars` prints the Spark Kafka connector jars (comma-separated) for spark.jars / --jars.
"""


def _services(names: list[str]) -> list[Service]:
    """The chosen services (default: all), always in start order."""
    unknown = sorted(set(names) - set(SERVICES))
    if unknown:
        raise common.StackError(
            f"unknown service {', '.join(unknown)}; choose from {', '.join(SERVICES)}"
        )
    chosen = [n for n in SERVICES if not names or n in names]
    paths = common.paths()
    # Each module is imported only when its service is asked for.
    return [
        getattr(importlib.import_module(f"pgcdc.stack.{n}"), _CLASSES[n])(paths) for n in chosen
    ]


_CLASSES = {"postgres": "Postgres", "redis": "Redis", "kafka": "Kafka", "opensearch": "OpenSearch"}


@contextmanager
def _lock() -> Iterator[None]:
    """Serialise up/down between concurrent callers (several engineers share one stack)."""
    p = common.paths()
    p.run.mkdir(parents=True, exist_ok=True)
    with open(p.run / "stack.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def cmd_up(names: list[str]) -> int:
    t0 = time.monotonic()
    services = _services(names)
    with _lock():  # also keeps two first-time callers from running apt-get at once
        prereqs.ensure([prereqs.BASE, *(s.packages for s in services)])
        common.paths().logs.mkdir(parents=True, exist_ok=True)
        started = [s for s in services if s.start()]
        for s in services:
            s.wait_ready()
    if not names:
        # The Spark Kafka connector jars, fetched once (scripts/spark-submit adds them).
        from pgcdc.stack import sparkjars

        sparkjars.ensure(common.paths())
    for s in services:
        state = "started" if s in started else "already running"
        print(f"{s.name:<11} up    {s.address:<16} {state}")
    common.say(f"up in {time.monotonic() - t0:.1f}s")
    return 0


def cmd_down(names: list[str]) -> int:
    with _lock():
        for s in reversed(_services(names)):
            was = s.stop()
            print(f"{s.name:<11} {'stopped' if was else 'was not running'}")
    return 0


def cmd_status(names: list[str]) -> int:
    ok = True
    for s in _services(names):
        up, line = s.status()
        ok &= up
        print(line)
    return 0 if ok else 1


def cmd_env() -> int:
    for k, v in env_vars().items():
        print(f"export {k}={v}")
    return 0


def cmd_jars() -> int:
    from pgcdc.stack import sparkjars

    print(",".join(str(p) for p in sparkjars.ensure(common.paths())))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="scripts/stack", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, what in (
        ("up", "start services (default: all) and wait until they answer"),
        ("down", "stop the services this stack started, by recorded pid"),
        ("status", "show each service as up/down; exit 1 unless all are up"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument(
            "services", nargs="*", metavar="SERVICE", help=f"any of: {', '.join(SERVICES)}"
        )
    sub.add_parser("env", help="print export lines for the CDC_* settings")
    sub.add_parser("jars", help="fetch the Spark Kafka connector jars; print them comma-separated")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            return cmd_up(args.services)
        if args.cmd == "down":
            return cmd_down(args.services)
        if args.cmd == "status":
            return cmd_status(args.services)
        if args.cmd == "env":
            return cmd_env()
        return cmd_jars()
    except common.StackError as e:
        print(f"stack: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
