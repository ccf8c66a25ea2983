"""When the reader starts a new run after a failure (cdc.supervise), and when it does not."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Literal

import psycopg
import pytest

from cdc import supervise
from cdc.supervise import run_supervised
from pgcdc.core.errors import ConfigError, ConnectionFailed, SnapshotError

pytestmark = pytest.mark.unit

LOST = ConnectionFailed(
    "replication connection to 127.0.0.1:5432/app failed: terminating "
    "connection due to administrator command"
)


# How far an attempt got: True streamed, SNAPSHOT began the initial snapshot, False neither.
Stage = bool | Literal["snapshot"]
SNAPSHOT: Literal["snapshot"] = "snapshot"


class Script:
    """Attempts that play a list of outcomes: an exception (raised after the stage the attempt
    reached) or a result."""

    def __init__(self, *outcomes: tuple[Stage, BaseException | str]) -> None:
        self.outcomes: Iterator[tuple[Stage, BaseException | str]] = iter(outcomes)
        self.started = 0

    def __call__(self) -> Script:
        self.started += 1
        stage, self._outcome = next(self.outcomes)
        self.reached_streaming = stage is True
        self.began_snapshot = stage is not False
        return self

    def run(self) -> str:
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome


@pytest.fixture(autouse=True)
def short_delays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervise, "FIRST_DELAY_S", 0.001)
    monkeypatch.setattr(supervise, "MAX_DELAY_S", 0.002)


def run(script: Script, timeout_s: float = 60.0, **kwargs: object) -> str:
    return run_supervised(
        script,
        stop=kwargs.pop("stop", threading.Event()),  # type: ignore[arg-type]
        reconnect_timeout_s=timeout_s,
        on_stopped=lambda: "stopped",
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_stream_that_lost_the_server_is_started_again_until_it_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = ConnectionFailed("PostgreSQL at 127.0.0.1:5432/app is unreachable")
    script = Script((True, LOST), (False, refused), (False, refused), (True, "done"))
    with caplog.at_level(logging.WARNING, logger="cdc.supervise"):
        assert run(script) == "done"
    assert script.started == 4
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "attempt 3" in lines[-1] and "administrator command" in lines[0]


def test_a_run_that_never_reached_the_stream_is_not_retried() -> None:
    script = Script((False, ConnectionFailed("PostgreSQL at 127.0.0.1:1/app is unreachable")))
    with pytest.raises(ConnectionFailed, match="unreachable"):
        run(script)
    assert script.started == 1


def test_an_error_that_is_not_about_the_connection_stops_at_once() -> None:
    script = Script((True, ConfigError("bad setting")))
    with pytest.raises(ConfigError):
        run(script)
    assert script.started == 1


def test_a_lost_connection_from_a_catalog_query_counts_as_lost() -> None:
    admin_shutdown = psycopg.errors.AdminShutdown(
        "terminating connection due to administrator command"
    )
    script = Script((True, admin_shutdown), (True, "done"))
    assert run(script) == "done"
    assert script.started == 2


def test_reconnecting_gives_up_after_the_timeout_with_the_setting_named() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 50.0
        return now[0]

    refused = ConnectionFailed("PostgreSQL at 127.0.0.1:5432/app is unreachable")
    script = Script((True, LOST), *[(False, refused)] * 10)
    with pytest.raises(ConnectionFailed, match=r"postgres\.reconnect_timeout_s is 120"):
        run(script, timeout_s=120.0, clock=clock)
    assert script.started == 4  # failures at 50, 100, 150 (> 120 after the first): gave up


def test_a_zero_timeout_never_reconnects() -> None:
    script = Script((True, LOST))
    with pytest.raises(ConnectionFailed):
        run(script, timeout_s=0)
    assert script.started == 1


def test_a_stop_while_waiting_to_reconnect_ends_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervise, "FIRST_DELAY_S", 30.0)
    stop = threading.Event()
    timer = threading.Timer(0.05, stop.set)
    timer.start()
    script = Script((True, LOST), (True, "never reached"))
    assert run(script, stop=stop) == "stopped"
    assert script.started == 1


# What a PostgreSQL restart during the initial snapshot raised before it was classified.
SNAPSHOT_LOST = ConnectionFailed(
    "snapshot failed: terminating connection due to administrator command"
)
REFUSED = ConnectionFailed("PostgreSQL at 127.0.0.1:5432/app is unreachable: Connection refused")


def test_a_snapshot_that_lost_the_server_starts_over_with_one_line_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = Script(
        (SNAPSHOT, SNAPSHOT_LOST),
        (False, REFUSED),  # the server is still starting: reconnecting as after a stream
        (SNAPSHOT, SNAPSHOT_LOST),
        (True, "done"),
    )
    with caplog.at_level(logging.WARNING, logger="cdc.supervise"):
        assert run(script, snapshot_retries=3) == "done"
    assert script.started == 4
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "snapshot attempt 2 of 4" in lines[0] and "administrator command" in lines[0]
    assert "reconnecting in" in lines[1] and "Connection refused" in lines[1]
    assert "snapshot attempt 3 of 4" in lines[2]


def test_a_snapshot_starts_over_at_most_snapshot_retries_times() -> None:
    script = Script(*[(SNAPSHOT, SNAPSHOT_LOST)] * 5)
    with pytest.raises(
        ConnectionFailed, match=r"after 3 attempts; postgres\.snapshot_retries is 2"
    ):
        run(script, snapshot_retries=2)
    assert script.started == 3


def test_snapshot_retries_zero_stops_at_the_first_loss() -> None:
    script = Script((SNAPSHOT, SNAPSHOT_LOST))
    with pytest.raises(ConnectionFailed, match=r"after 1 attempt; postgres\.snapshot_retries is 0"):
        run(script, snapshot_retries=0)
    assert script.started == 1


def test_a_stream_reached_after_snapshot_losses_gets_its_snapshot_retries_back() -> None:
    script = Script(
        (SNAPSHOT, SNAPSHOT_LOST), (True, LOST), (SNAPSHOT, SNAPSHOT_LOST), (True, "done")
    )
    assert run(script, snapshot_retries=1) == "done"
    assert script.started == 4


def test_a_snapshot_that_failed_for_another_reason_is_not_started_over() -> None:
    script = Script((SNAPSHOT, SnapshotError("snapshot failed: invalid input syntax")))
    with pytest.raises(SnapshotError):
        run(script, snapshot_retries=3)
    assert script.started == 1


@pytest.mark.parametrize(
    "error",
    [
        # libpq's words over TLS; psycopg cannot class a failed COPY result (DatabaseError).
        psycopg.DatabaseError("SSL connection has been closed unexpectedly"),
        psycopg.OperationalError("consuming input failed: SSL SYSCALL error: EOF detected"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    ],
)
def test_a_psycopg_error_of_a_lost_connection_is_retried_whatever_its_class(
    error: psycopg.Error,
) -> None:
    script = Script((True, error), (True, "done"))
    assert run(script) == "done"
    assert script.started == 2
