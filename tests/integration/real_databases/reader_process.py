"""``cdc run`` as a process of a test's own, the way users run it, against a throwaway server.

:func:`cdc_run` starts it with its output in a log file; on the way out it asks the reader to
stop (SIGTERM), deletes the run's topics and, when the test body passed, requires exit code 0.
The fixture ``server`` (:func:`server_fixture`) is a throwaway server without TLS, then one
with TLS (import it into a test module: ``from ...reader_process import server_fixture``).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.conftest import wait_until
from tests.e2e.pipeline import CDC, ROOT, Pipeline
from tests.integration.reader_support import assert_topic_equals_table, read_topic
from tests.integration.real_databases.throwaway import ThrowawayServer, throwaway_server

STOP_TIMEOUT_S = 60


@pytest.fixture(name="server", params=[False, True], ids=["plain", "tls"])
def server_fixture(request: pytest.FixtureRequest) -> Iterator[ThrowawayServer]:
    """A throwaway server of the test's own: plain, then with TLS."""
    with throwaway_server(tls=request.param) as s:
        yield s


def dsn_of(server: ThrowawayServer, dbname: str) -> str:
    """The DSN of ``dbname``, requiring TLS from a server that has it and refusing it otherwise."""
    return server.dsn(dbname) + ("?sslmode=require" if server.tls else "?sslmode=disable")


def topic_equals_table(bootstrap: str, topic: str, dsn: str, table: str = "items") -> bool:
    """:func:`assert_topic_equals_table` as a condition for :func:`wait_until`."""
    assert_topic_equals_table(read_topic(bootstrap, topic), dsn, table)
    return True


def tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:]


def require_running(reader: subprocess.Popen[bytes], log: Path) -> None:
    """Fail the test at once (through :func:`wait_until` too) if the reader has exited."""
    if reader.poll() is not None:
        pytest.fail(f"the reader exited with {reader.returncode}:\n{tail(log)}")


@contextlib.contextmanager
def cdc_run(p: Pipeline, log: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """``cdc run`` with ``p``'s settings and ``env``; stopped and its topics deleted after."""
    with log.open("ab") as out:
        reader = subprocess.Popen(
            [*CDC, "run"],
            env=p.env(PYTHONUNBUFFERED="1", **env),
            cwd=ROOT,
            stdout=out,
            stderr=out,
        )
    try:
        yield reader
    finally:
        reader.send_signal(signal.SIGTERM)
        try:
            rc = reader.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            reader.kill()
            rc = reader.wait()
        admin = AdminClient({"bootstrap.servers": p.endpoints.kafka_bootstrap})
        topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(p.name)]
        if topics:
            for fut in admin.delete_topics(topics, operation_timeout=30).values():
                fut.result()
    assert rc == 0, tail(log)


def wait_streaming(
    server: ThrowawayServer,
    slot: str,
    reader: subprocess.Popen[bytes],
    log: Path,
    timeout: float = 90,
) -> bool:
    """Until a walsender streams ``slot`` (the reader created it and reached the stream);
    returns whether that walsender talks TLS to the reader. Fails at once if the reader exits."""
    sql = (
        "SELECT s.ssl FROM pg_replication_slots r JOIN pg_stat_replication w "
        "ON w.pid = r.active_pid JOIN pg_stat_ssl s ON s.pid = w.pid "
        "WHERE r.slot_name = %s AND w.state = 'streaming'"
    )

    def streaming() -> tuple[bool] | None:
        require_running(reader, log)
        with server.connect() as conn:
            return conn.execute(sql, (slot,)).fetchone()

    return wait_until(streaming, timeout=timeout, what="the reader to stream")[0]
