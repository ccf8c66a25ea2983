"""The health endpoint (``/healthz``, ``/readyz``) and the reader's readiness rule."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from cdc.health import ReaderHealth
from pgcdc.core.health import HealthServer
from pgcdc.core.lsn import Lsn

pytestmark = pytest.mark.unit


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_server_answers_alive_and_the_check() -> None:
    state = {"ready": (False, "not yet")}
    server = HealthServer(lambda: state["ready"], 0).start()
    try:
        assert _get(server.port, "/healthz") == (200, "alive\n")
        assert _get(server.port, "/readyz") == (503, "not yet\n")
        state["ready"] = (True, "streaming")
        assert _get(server.port, "/readyz") == (200, "streaming\n")
        assert _get(server.port, "/other")[0] == 404
    finally:
        server.close()


def test_a_failing_check_is_not_ready() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("py4j gone")

    server = HealthServer(broken, 0).start()
    try:
        status, body = _get(server.port, "/readyz")
        assert status == 503 and "RuntimeError: py4j gone" in body
    finally:
        server.close()


def test_the_reader_is_ready_while_its_loop_reports() -> None:
    now = [100.0]
    health = ReaderHealth(ready_s=30, clock=lambda: now[0])
    assert health.ready() == (False, "not streaming yet (snapshot or start-up)")
    health.on_acknowledged(Lsn(0x16B3748))
    ok, why = health.ready()
    assert ok and "0/16B3748" in why
    now[0] += 31
    ok, why = health.ready()
    assert not ok and "no streaming progress for 31s" in why
    health.on_lag(0)  # the loop reports its lag every few seconds while it streams
    assert health.ready()[0]
    assert health.lag_bytes._value.get() == 0  # still the Prometheus gauge


def test_the_reader_is_ready_as_soon_as_it_streams() -> None:
    """Streaming, not a first change or acknowledgment, is what /readyz reports (before,
    a reader with nothing to stream stayed 503 until the first change arrived)."""
    now = [100.0]
    health = ReaderHealth(ready_s=30, clock=lambda: now[0])
    assert not health.ready()[0]
    health.on_streaming(Lsn(0x16B3748))
    ok, why = health.ready()
    assert ok and why.startswith("streaming") and "0/16B3748" in why
    assert health.acked_lsn._value.get() == 0x16B3748


class _FakeQuery:
    def __init__(self, active: bool, busy: bool, progress: dict[str, object] | None) -> None:
        self.isActive = active
        self.status = {"isTriggerActive": busy}
        self.lastProgress = progress


def test_a_job_is_ready_while_its_query_is_active_and_reports() -> None:
    from spark_jobs.job import query_ready

    now = 1_700_000_030.0  # 2023-11-14T22:13:50Z
    recent = {"batchId": 7, "timestamp": "2023-11-14T22:13:40.000Z"}
    assert query_ready(_FakeQuery(False, False, recent), 30, lambda: now)[0] is False
    assert query_ready(_FakeQuery(True, False, None), 30, lambda: now) == (
        False,
        "no micro-batch has completed yet",
    )
    assert query_ready(_FakeQuery(True, True, None), 30, lambda: now)[0] is True
    ok, why = query_ready(_FakeQuery(True, False, recent), 30, lambda: now)
    assert ok and why == "batch 7 10.0s ago"
    ok, why = query_ready(_FakeQuery(True, False, recent), 5, lambda: now)
    assert not ok and "no progress for 10s" in why


def test_the_job_takes_its_health_port_out_of_its_arguments() -> None:
    from spark_jobs.job import split_health_port

    assert split_health_port(["--available-now", "--health-port", "8081", "--name", "x"]) == (
        8081,
        ["--available-now", "--name", "x"],
    )
    assert split_health_port(["--available-now"]) == (None, ["--available-now"])


def test_a_job_at_info_hides_the_libraries_line_per_batch() -> None:
    import logging

    from spark_jobs.job import PER_BATCH_LOGGERS, quiet_per_batch_loggers

    loggers = [logging.getLogger(name) for name in PER_BATCH_LOGGERS]
    # Put back as found: the shared Spark session's fixture (tests/conftest.py) keeps py4j
    # at WARNING for the rest of the process, whose exit would otherwise print a logging
    # error at the end of the run.
    were = [lg.level for lg in loggers]
    try:
        quiet_per_batch_loggers(logging.INFO)
        # py4j.clientserver's "Received command c on object id p0" is INFO: not shown.
        assert logging.getLogger("py4j.clientserver").getEffectiveLevel() == logging.WARNING
        assert logging.getLogger("opensearch").getEffectiveLevel() == logging.WARNING
        quiet_per_batch_loggers(logging.DEBUG)
        assert [lg.level for lg in loggers] == [logging.NOTSET] * len(loggers)
    finally:
        for lg, level in zip(loggers, were, strict=True):
            lg.setLevel(level)
