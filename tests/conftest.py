"""Test harness: real servers for every test that needs one.

Servers come from the native stack (`scripts/stack`, started if it is not running), or with
``CDC_TEST_DOCKER=1`` from testcontainers running the project's images (see
``use_containers`` and ``tests/containers.py``). Every test gets
its own resources (database, topic prefix, index prefix, key prefix), so tests cannot interfere
with each other or with a developer's data.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pgcdc.stack import spark_cds

ROOT = Path(__file__).resolve().parent.parent
STACK = ROOT / "scripts" / "stack"

T = TypeVar("T")

# The Spark JVMs the tests start (the session fixture's, and every job through
# scripts/spark-submit: Spark's launcher adds SPARK_SUBMIT_OPTS to the driver's java command)
# keep HotSpot's quick compiler only. They live a minute or less, where the optimizing compiler
# (C2) costs more CPU than it saves: test_sync's three tests took 115 CPU seconds with it,
# 80 without, on two cores the whole suite shares. What the jobs do is the same; users' jobs
# keep their own flags (scripts/spark-submit's C1_ONLY says when). They also map the archive
# of Spark's classes that scripts/test writes first (pgcdc/stack/spark_cds.py), when there is one.
os.environ.setdefault(
    "SPARK_SUBMIT_OPTS", f"-XX:TieredStopAtLevel=1 {spark_cds.jvm_options()}".strip()
)


@dataclass(frozen=True)
class Endpoints:
    """Where the real servers answer. The DSN is a superuser that may replicate."""

    postgres_dsn: str
    kafka_bootstrap: str
    redis_url: str
    search_url: str
    via: str  # "native" or "testcontainers"
    # Restarts the PostgreSQL of postgres_dsn when the tests run one of their own (a major
    # CDC_TEST_POSTGRES chose); None: it is the stack's (scripts/stack down/up postgres).
    restart_postgres: Callable[[], None] | None = field(default=None, compare=False)

    def postgres_dsn_for(self, dbname: str) -> str:
        base, _, _ = self.postgres_dsn.rpartition("/")
        return f"{base}/{dbname}"


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float = 60.0,
    interval: float = 0.1,
    what: str = "",
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail the test at the deadline
    (with what ``detail`` says then, e.g. the end of a process's log)."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except Exception as e:  # the condition may not be ready to evaluate yet
            last_exc = e
        if time.monotonic() >= deadline:
            error = f" (last error: {last_exc!r})" if last_exc else ""
            more = f"\n{detail()}" if detail is not None else ""
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}{error}{more}")
        time.sleep(interval)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadgroup`` (scripts/test), a module's group is one unit of work
    (``tests/schedule.py``), handed out in collection order (slow first)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    from tests import schedule

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return schedule.scope_of(nodeid)

    return ModuleGroups(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group tests by module for parallel workers, the slow modules first
    (``tests/schedule.py`` says why)."""
    from tests import schedule

    def module_of(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    for item in items:
        item.add_marker(pytest.mark.xdist_group(schedule.group_of(module_of(item))))
    weights = {id(item): schedule.weight(module_of(item)) for item in items}
    items.sort(key=lambda item: -weights[id(item)])  # stable: the rest keep their order


_TIME_SPENT: Any = None  # tests.schedule.TimeSpent of a run on parallel workers


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count each phase of each test against its worker and module (xdist reports carry
    the worker: ``report.node``), for the summary below."""
    global _TIME_SPENT
    node = getattr(report, "node", None)
    if node is None:  # not a run on workers
        return
    from tests.schedule import TimeSpent

    if _TIME_SPENT is None:
        _TIME_SPENT = TimeSpent()
    _TIME_SPENT.add(node.gateway.id, report.nodeid, report.when, report.start, report.stop)


_STARTED = time.monotonic()  # this pytest process's start: the phase's wall time


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _TIME_SPENT is not None:
        terminalreporter.section("where the time went")
        before = os.environ.get("CDC_TEST_PHASES_BEFORE")  # scripts/test's earlier phases
        this = f"this phase {time.monotonic() - _STARTED:,.0f} s"
        terminalreporter.write_line(f"phases: {before + ', ' if before else ''}{this}")
        for line in _TIME_SPENT.lines():
            terminalreporter.write_line(line)


def use_containers() -> bool:
    """The rule that picks the servers (the README's "Tests" section says it too): the
    native stack (``scripts/stack``, started if it is down) unless ``CDC_TEST_DOCKER=1``,
    which runs them as containers with testcontainers, from the project's images (built if
    missing, never pulled: a Docker engine that cannot reach a registry works).
    ``CDC_TEST_NATIVE=1`` forces the native stack (it wins over ``CDC_TEST_DOCKER``)."""
    return os.environ.get("CDC_TEST_NATIVE") != "1" and os.environ.get("CDC_TEST_DOCKER") == "1"


def _native_stack() -> Endpoints:
    status = subprocess.run([str(STACK), "status"], capture_output=True, text=True, check=False)
    if status.returncode != 0:
        up = subprocess.run([str(STACK), "up"], capture_output=True, text=True, check=False)
        if up.returncode != 0:
            pytest.exit(f"scripts/stack up failed:\n{up.stdout}\n{up.stderr}", returncode=3)
    env: dict[str, str] = {}
    out = subprocess.run([str(STACK), "env"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        line = line.removeprefix("export ").strip()
        if "=" in line:
            k, v = line.split("=", 1)
            env[k] = v.strip("'\"")
    return Endpoints(
        postgres_dsn=env["CDC_POSTGRES__DSN"],
        kafka_bootstrap=env["CDC_KAFKA__BOOTSTRAP_SERVERS"],
        redis_url=env["CDC_REDIS__URL"],
        search_url=env["CDC_SEARCH__URL"],
        via="native",
    )


def _containers(stack: ExitStack) -> Endpoints:
    from tests.containers import start_servers

    return Endpoints(**start_servers(stack), via="testcontainers")


@pytest.fixture(scope="session")
def endpoints() -> Iterator[Endpoints]:
    """The real servers for this test session.

    ``CDC_TEST_POSTGRES=<major>`` (e.g. 17, 18) swaps PostgreSQL for a server of that major
    started beside the others on a free port (:mod:`tests.pg_majors`); the rest stays.
    """
    from dataclasses import replace

    from tests.pg_majors import session_server

    with ExitStack() as stack:
        found = _containers(stack) if use_containers() else _native_stack()
        server = stack.enter_context(session_server())
        if server is not None:

            def restart() -> None:
                server.stop()
                server.start()

            found = replace(
                found,
                postgres_dsn=server.dsn("cdc"),
                via=f"{found.via}, PostgreSQL {server.runtime.major} on port {server.port}",
                restart_postgres=restart,
            )
        yield found


def pytest_report_header(config: pytest.Config) -> str:
    """Where this session's servers come from (the Docker tests check it in a sub-session)."""
    from tests.pg_majors import ENV

    major = os.environ.get(ENV)
    chosen = f"; PostgreSQL {major} ({ENV})" if major else ""
    if use_containers():
        from tests.containers import IMAGES

        return f"servers: testcontainers ({', '.join(IMAGES.values())}){chosen}"
    return f"servers: the native stack (scripts/stack){chosen}"


# --- per-test isolated resources -------------------------------------------------------------


@pytest.fixture
def pg_database(endpoints: Endpoints) -> Iterator[str]:
    """A fresh database of its own; yields its DSN. Slots in it are dropped afterwards."""
    with fresh_database(endpoints) as dsn:
        yield dsn


@pytest.fixture
def second_pg_database(endpoints: Endpoints) -> Iterator[str]:
    """Another fresh database, beside ``pg_database`` (a second source)."""
    with fresh_database(endpoints) as dsn:
        yield dsn


@contextlib.contextmanager
def fresh_database(endpoints: Endpoints) -> Iterator[str]:
    """A new database's DSN; the database and its slots are dropped afterwards."""
    import psycopg

    name = unique("t")
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield endpoints.postgres_dsn_for(name)
    finally:
        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
            for slot, pid in conn.execute(
                "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
                (name,),
            ).fetchall():
                if pid:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                wait_until(
                    lambda s=slot: (
                        conn.execute(
                            "SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s", (s,)
                        ).fetchone()
                        in (None, (True,))
                    ),
                    timeout=30,
                    what=f"slot {slot} to become inactive",
                )
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    (slot,),
                )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def topic_prefix(endpoints: Endpoints) -> Iterator[str]:
    """A topic prefix of its own; every topic under it is deleted afterwards."""
    from confluent_kafka.admin import AdminClient

    prefix = unique("t")
    yield prefix
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    topics = [
        t
        for t in admin.list_topics(timeout=10).topics
        if t.startswith(prefix) or t == f"__cdc-heartbeat.{prefix}"
    ]
    if topics:
        for fut in admin.delete_topics(topics, operation_timeout=30).values():
            fut.result()


@pytest.fixture
def index_prefix(endpoints: Endpoints) -> Iterator[str]:
    """An OpenSearch index prefix of its own; its indices are deleted afterwards."""
    from opensearchpy import OpenSearch

    prefix = unique("t").lower()
    yield prefix
    client = OpenSearch(endpoints.search_url)
    client.indices.delete(index=f"{prefix}*", ignore_unavailable=True, expand_wildcards="all")
    client.close()


@pytest.fixture
def key_prefix(endpoints: Endpoints) -> Iterator[str]:
    """A Redis key prefix of its own; its keys are deleted afterwards."""
    import redis

    prefix = unique("t")
    yield prefix
    r = redis.Redis.from_url(endpoints.redis_url)
    keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


def _drop_bare_gateway() -> None:
    """Shut down a JVM that an earlier test started without a session (a job's ``run()``
    joins or starts one to read spark-submit's options, ``spark_jobs.source.submitted_conf``):
    the session would be made in it, with its class path, which lacks the driver class path
    below, so the JVM would not map the archive of Spark's classes."""
    from pyspark.core.context import SparkContext

    if SparkContext._gateway is not None and SparkContext._active_spark_context is None:
        SparkContext._gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession with the Kafka connector jars fetched by scripts/stack."""
    from pyspark.sql import SparkSession

    jars = subprocess.run(
        [str(STACK), "jars"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # Python workers run this interpreter (its packages), not whatever python3 is first.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    _drop_bare_gateway()
    session = (
        SparkSession.builder.master("local[2]")
        .appName("cdc-tests")
        .config("spark.jars", jars)
        # As scripts/spark-submit gives them, so that the archive of Spark's classes
        # (spark_cds) serves this JVM and the jobs' alike.
        .config("spark.driver.extraClassPath", spark_cds.driver_class_path(jars.split(",")))
        # A 60 MB record takes several copies in the JVM (bytes, text, parsed JSON) and
        # on its way to Python: 1g ran out in tests/e2e/test_jobs_robustness.py.
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    # py4j logs at INFO as its connections close, the last from a finalizer at interpreter
    # exit, after pytest closed the stream a test's logging setup pointed at: "--- Logging
    # error --- ValueError: I/O operation on closed file" at the end of the run's output.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    yield session
    session.stop()
