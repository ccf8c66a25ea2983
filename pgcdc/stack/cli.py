"""Command line of ``scripts/stack``: up, down, status, env, jars."""

from __future__ import annotations

import argparse
import fcntl
import importlib
import os
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pgcdc.core.ports import (
    ALL_PORTS,
    CLUSTER_SERVICES,
    HOST,
    KAFKA_CLUSTER_PORTS,
    KAFKA_CONTROLLER_PORT,
    KAFKA_SECURE_CONTROLLER_PORT,
    OPTIONAL_PORTS,
    OPTIONAL_SERVICES,
    PORTS,
    REDIS_CLUSTER_PORTS,
    REGISTRY_MANAGEMENT_PORT,
    SECURE_PORTS,
    SECURE_SERVICES,
    SERVICES,
    env_vars,
    registry_env_vars,
)
from pgcdc.stack import common, prereqs
from pgcdc.stack.service import Service

HELP = f"""\
Run the project's servers natively on {HOST} (no Docker):

  postgres    PostgreSQL (the distribution's), wal_level=logical, TLS  port {PORTS["postgres"]}
  redis       Redis (Debian redis-server), no persistence              port {PORTS["redis"]}
  kafka       Kafka 4.x KRaft (Maven Central jars), broker+controller  port {PORTS["kafka"]} (controller {KAFKA_CONTROLLER_PORT})
  opensearch  OpenSearch 2.19 integ-test zip (Maven Central), JDK 17   port {PORTS["opensearch"]}

On demand only (named, or --registry), beside the ones above:

  registry    Apicurio Registry 3.3 (Maven Central), Java 21+, the     port {OPTIONAL_PORTS["registry"]} (management {REGISTRY_MANAGEMENT_PORT})
              schema registry for Avro: Confluent's API at /apis/ccompat/v7,
              BACKWARD compatibility, schemas kept in .stack/registry/

On demand only (named, or --secure), beside the ones above:

  kafka-secure  a second broker, SASL_SSL only (SCRAM-SHA-512)   port {SECURE_PORTS["kafka-secure"]} (controller {KAFKA_SECURE_CONTROLLER_PORT})
  redis-secure  a second redis-server, TLS only, an ACL user     port {SECURE_PORTS["redis-secure"]}

Clusters, on demand only (named), beside the single servers:

  kafka-cluster  three KRaft nodes (broker+controller each), replication factor 3,
                 min.insync.replicas=2      ports {",".join(map(str, KAFKA_CLUSTER_PORTS))}  (also: up --kafka-brokers 3)
  redis-cluster  a Redis Cluster of three masters                ports {",".join(map(str, REDIS_CLUSTER_PORTS))}

A Spark standalone cluster (a master and two workers) for the jobs is started by
`python -m pgcdc.stack.spark_cluster up|down|status` (see the README's spark-submit section).

Certificates come from a local CA made with openssl in .stack/tls/ (clients trust
.stack/tls/ca.crt); passwords are random, in .stack/tls/credentials.json. PostgreSQL
accepts TLS on its usual port (sslmode=verify-full). `env --secure` prints the settings
that reach the secured endpoints.

PostgreSQL's binaries are found for the installed version (/usr/lib/postgresql/<N>/bin,
pg_config --bindir, PATH; PG_BINDIR overrides). `up --postgres 17` (or 18) runs that major
instead, on the same port with the same roles: one the machine has installed from its
binaries, one it lacks from a Debian root (17 from Debian 13, 18 from Debian testing; built
once into .cache/pgroots/ from the machine's Debian mirror, about 40 MB, and run with chroot,
so it needs root). The choice is kept until `up --postgres` chooses again (`up --postgres 15`
goes back); `--port` moves the server, for a second stack beside another (with its own
STACK_DIR). Stop the running one first: `scripts/stack down postgres`. As root, PostgreSQL runs as the postgres
user and OpenSearch as cdcstack; otherwise both run as you, and missing packages are
installed through sudo (or the exact command is printed).

State lives in .stack/ (STACK_DIR), downloads in .cache/ (CACHE_DIR); both are gitignored,
so `down` then `up` downloads nothing. Logs: .stack/logs/<service>.log. Pidfiles:
.stack/run/<service>.pid. Missing Debian packages are installed with apt-get (needs root).
`jars` prints the Spark Kafka connector jars (comma-separated) for spark.jars / --jars.
"""


ALL_SERVICES = (*SERVICES, *OPTIONAL_SERVICES, *SECURE_SERVICES, *CLUSTER_SERVICES)


def _services(
    names: list[str], *, secure: bool = False, clusters: bool = False, registry: bool = False
) -> list[Service]:
    """The chosen services, always in start order. None named: the default ones, plus the
    secured ones with ``secure`` and the clusters with ``clusters``. ``registry`` adds the
    schema registry to those named or to the default ones."""
    unknown = sorted(set(names) - set(ALL_SERVICES))
    if unknown:
        raise common.StackError(
            f"unknown service {', '.join(unknown)}; choose from {', '.join(ALL_SERVICES)}"
        )
    wanted = set(names) or {
        *SERVICES,
        *(SECURE_SERVICES if secure else ()),
        *(CLUSTER_SERVICES if clusters else ()),
    }
    if registry:
        wanted |= set(OPTIONAL_SERVICES)
    chosen = [n for n in ALL_SERVICES if n in wanted]
    paths = common.paths()
    # Each module is imported only when its service is asked for.
    return [
        getattr(importlib.import_module(f"pgcdc.stack.{module}"), cls)(paths)
        for module, cls in (_CLASSES[n] for n in chosen)
    ]


# Service name -> (module in pgcdc.stack, class).
_CLASSES = {
    "postgres": ("postgres", "Postgres"),
    "redis": ("redis", "Redis"),
    "kafka": ("kafka", "Kafka"),
    "opensearch": ("opensearch", "OpenSearch"),
    "registry": ("registry", "Registry"),
    "kafka-secure": ("kafka_secure", "KafkaSecure"),
    "redis-secure": ("redis_secure", "RedisSecure"),
    "kafka-cluster": ("kafka_cluster", "KafkaClusterService"),
    "redis-cluster": ("redis_cluster", "RedisClusterService"),
}


@contextmanager
def _lock() -> Iterator[None]:
    """Serialise up/down between concurrent callers (several engineers share one stack)."""
    p = common.paths()
    p.run.mkdir(parents=True, exist_ok=True)
    with open(p.run / "stack.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _choose_postgres(major: int | None, port: int | None) -> None:
    """Record ``up --postgres/--port``; refuse while another choice's server runs."""
    from pgcdc.stack import postgres

    paths = common.paths()
    current = postgres.load_choice(paths)
    wanted = postgres.Choice(
        current.major if major is None else major, current.port if port is None else port
    )
    if major is not None and major == _installed_default():
        wanted = postgres.Choice(None, wanted.port)  # the installed one: the plain layout
    if wanted == current:
        return
    running = postgres.Postgres(paths)
    if running.pid() is not None:
        was = f"PostgreSQL {current.major or 'installed'} on {HOST}:{current.port}"
        raise common.StackError(
            f"{was} is running; stop it first (scripts/stack down postgres), then up again"
        )
    postgres.save_choice(paths, wanted)


def _installed_default() -> int | None:
    from pgcdc.stack import pgbin

    found = pgbin.find()
    return pgbin.version(found) if found is not None else None


def cmd_up(
    names: list[str],
    secure: bool = False,
    postgres_major: int | None = None,
    postgres_port: int | None = None,
    registry: bool = False,
) -> int:
    t0 = time.monotonic()
    if os.geteuid() == 0 and os.environ.get("SUDO_USER"):
        common.say(
            "running through sudo: .stack/ will belong to root. scripts/stack also runs as "
            f"{os.environ['SUDO_USER']} and uses sudo only to install missing packages"
        )
    with _lock():  # also keeps two first-time callers from running apt-get at once
        if postgres_major is not None or postgres_port is not None:
            _choose_postgres(postgres_major, postgres_port)
        services = _services(names, secure=secure, registry=registry)
        prereqs.ensure([prereqs.BASE, *(s.required_packages() for s in services)])
        common.paths().logs.mkdir(parents=True, exist_ok=True)
        common.reserve_ports(ALL_PORTS)
        started = [s for s in services if s.start()]
        for s in services:
            s.wait_ready()
    if not names:
        # The Spark Kafka connector jars, fetched once (scripts/spark-submit adds them).
        from pgcdc.stack import sparkjars

        sparkjars.ensure(common.paths())
    for s in services:
        state = "started" if s in started else "already running"
        print(f"{s.name:<13} up    {s.address:<16} {state}")
    common.say(f"up in {time.monotonic() - t0:.1f}s")
    return 0


def cmd_down(names: list[str]) -> int:
    with _lock():
        # Nothing named: every service, the secured ones and clusters too (none is left behind).
        for s in reversed(_services(names, secure=True, clusters=True, registry=not names)):
            was = s.stop()
            print(f"{s.name:<13} {'stopped' if was else 'was not running'}")
    return 0


def cmd_status(names: list[str], secure: bool = False, registry: bool = False) -> int:
    if not names and not registry:
        # An on-demand server that runs is shown too (one that does not is no failure).
        registry = any(s.pid() is not None for s in _services(list(OPTIONAL_SERVICES)))
    ok = True
    for s in _services(names, secure=secure, registry=registry):
        up, line = s.status()
        ok &= up
        print(line)
    return 0 if ok else 1


def cmd_env(secure: bool = False, registry: bool = False) -> int:
    avro = registry_env_vars() if registry else {}
    if secure:
        from pgcdc.stack import secure as secured

        for k, v in (secured.env_vars(common.paths()) | avro).items():
            print(f"export {k}={shlex.quote(v)}")
        return 0
    from pgcdc.stack import postgres

    choice = postgres.load_choice(common.paths())
    for k, v in (env_vars() | avro).items():
        if k == "CDC_POSTGRES__DSN":
            v = v.replace(f":{PORTS['postgres']}/", f":{choice.port}/")
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
            "services", nargs="*", metavar="SERVICE", help=f"any of: {', '.join(ALL_SERVICES)}"
        )
        if name == "up":
            p.add_argument(
                "--kafka-brokers",
                type=int,
                choices=(1, 3),
                default=1,
                help="3: also start kafka-cluster (three KRaft brokers) beside the single one",
            )
            p.add_argument(
                "--postgres",
                type=int,
                metavar="MAJOR",
                help="the PostgreSQL major to run (15, 17, 18; default: the last chosen, "
                "else the installed one); kept until chosen again",
            )
            p.add_argument(
                "--port",
                type=int,
                metavar="PORT",
                help=f"PostgreSQL's port (default {PORTS['postgres']}); kept until chosen again",
            )
        if name != "down":  # down with no service named stops them all anyway
            p.add_argument(
                "--secure",
                action="store_true",
                help=f"with no SERVICE: also {', '.join(SECURE_SERVICES)}",
            )
            p.add_argument(
                "--registry",
                action="store_true",
                help="also the schema registry for Avro (registry)",
            )
    env = sub.add_parser("env", help="print export lines for the CDC_* settings")
    env.add_argument(
        "--secure",
        action="store_true",
        help="the secured endpoints: PostgreSQL verify-full, Kafka SASL_SSL, Redis TLS + ACL",
    )
    env.add_argument(
        "--registry",
        action="store_true",
        help="also Avro through the stack's schema registry (CDC_SCHEMA__*)",
    )
    sub.add_parser("jars", help="fetch the Spark Kafka connector jars; print them comma-separated")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            names = list(args.services)
            if args.kafka_brokers == 3:
                if not names:  # the default services, plus the cluster
                    names = [*SERVICES, *(SECURE_SERVICES if args.secure else ())]
                names.append("kafka-cluster")
            return cmd_up(names, args.secure, args.postgres, args.port, args.registry)
        if args.cmd == "down":
            return cmd_down(args.services)
        if args.cmd == "status":
            return cmd_status(args.services, args.secure, args.registry)
        if args.cmd == "env":
            return cmd_env(args.secure, args.registry)
        return cmd_jars()
    except common.StackError as e:
        print(f"stack: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
