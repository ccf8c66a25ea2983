"""Keep the reader running across a lost PostgreSQL connection.

A server restart, a failover or a dropped connection ends a run with a retryable error
(:class:`pgcdc.core.errors.ConnectionFailed`, or a psycopg error that
:mod:`cdc.connection_lost` calls a lost connection: TLS or not, from the stream, the snapshot
or a catalog query). Restarting the run is always safe: the slot holds the position of the last
transaction Kafka acknowledged, so a new run resumes there and loses nothing (duplicates are
possible, and the followers' versions make them harmless); an initial snapshot that did not
complete is started over from a new slot (:func:`cdc.slots.plan_start`), so it is exact again.
:func:`run_supervised` does that restart in the process, with backoff, instead of leaving it to
whoever watches the process.

Three rules keep it from hiding real problems: a run that reached neither the stream nor the
initial snapshot is not retried (a wrong host or a refused password shows at once, as one
line); an initial snapshot starts over at most ``snapshot_retries`` times; and reconnecting
stops after ``reconnect_timeout_s`` of failures in a row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import psycopg

from cdc.replication import classify
from pgcdc.core.errors import CdcError, ConnectionFailed, PublishError

log = logging.getLogger(__name__)

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Attempt(Protocol[R_co]):
    """One run of the reader: ``reached_streaming`` says whether it got that far,
    ``began_snapshot`` whether it got past its checks to the initial snapshot."""

    reached_streaming: bool
    began_snapshot: bool

    def run(self) -> R_co: ...


def retryable(e: BaseException) -> CdcError | None:
    """The error as our hierarchy's, if it is worth a reconnect; else None."""
    if isinstance(e, CdcError):
        return e if e.retryable else None
    if isinstance(e, psycopg.Error):
        err = classify(e, "PostgreSQL connection lost")
        return err if err.retryable else None
    return None


def run_supervised(
    attempt: Callable[[], Attempt[R]],
    *,
    stop: threading.Event,
    reconnect_timeout_s: float,
    on_stopped: Callable[[], R],
    snapshot_retries: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> R:
    """Run ``attempt().run()``, starting a new attempt after each retryable failure.

    ``on_stopped`` gives the result when a stop is asked for while waiting to reconnect.
    """
    failing_since: float | None = None
    delay = FIRST_DELAY_S
    tries = 0
    snapshot_tries = 0  # initial snapshots that lost the connection, in a row
    while True:
        current = attempt()
        try:
            return current.run()
        except Exception as e:
            err = retryable(e)
            if err is None or stop.is_set() or reconnect_timeout_s <= 0:
                raise
            starting_over = current.began_snapshot and not current.reached_streaming
            if current.reached_streaming or starting_over:
                # It worked until now: a new run of failures.
                failing_since, delay, tries = None, FIRST_DELAY_S, 0
                snapshot_tries = snapshot_tries + 1 if starting_over else 0
                if snapshot_tries > snapshot_retries:
                    raise ConnectionFailed(
                        f"{err} (gave up on the initial snapshot after {snapshot_tries} "
                        f"attempt{'s' if snapshot_tries > 1 else ''}; postgres.snapshot_retries "
                        f"is {snapshot_retries})"
                    ) from e
            elif failing_since is None:
                raise  # reached neither: a misconfiguration shows at once, as one line
            now = clock()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since > reconnect_timeout_s:
                raise ConnectionFailed(
                    f"{err} (gave up reconnecting after {now - failing_since:.0f}s; "
                    f"postgres.reconnect_timeout_s is {reconnect_timeout_s:g})"
                ) from e
            tries += 1
            if starting_over:
                log.warning(
                    "the initial snapshot lost PostgreSQL: %s; starting it over in %.0fs "
                    "(snapshot attempt %d of %d)",
                    err,
                    delay,
                    snapshot_tries + 1,
                    snapshot_retries + 1,
                    extra={"attempt": snapshot_tries + 1},
                )
            else:
                log.warning(
                    "lost %s: %s; reconnecting in %.0fs (attempt %d, giving up %.0fs "
                    "after the first failure)",
                    "Kafka" if isinstance(err, PublishError) else "PostgreSQL",
                    err,
                    delay,
                    tries,
                    reconnect_timeout_s,
                    extra={"attempt": tries},
                )
            if stop.wait(delay):
                log.info("stopped while waiting to reconnect")
                return on_stopped()
            delay = min(delay * 2, MAX_DELAY_S)
