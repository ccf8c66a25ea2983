"""Keep the reader running across a lost PostgreSQL connection.

A server restart, a failover or a dropped connection ends a run with a retryable error
(:class:`pgcdc.core.errors.ConnectionFailed`, or psycopg's ``OperationalError`` from a catalog
query). Restarting the run is always safe: the slot holds the position of the last transaction
Kafka acknowledged, so a new run resumes there and loses nothing (duplicates are possible, and
the followers' versions make them harmless). :func:`run_supervised` does that restart in the
process, with backoff, instead of leaving it to whoever watches the process.

Two rules keep it from hiding real problems: a run that never reached streaming is not retried
(a wrong host or a refused password shows at once, as one line), and reconnecting stops after
``reconnect_timeout_s`` of failures in a row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import psycopg

from cdc.replication import classify
from pgcdc.core.errors import CdcError, ConnectionFailed, KafkaUnavailable

log = logging.getLogger(__name__)

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Attempt(Protocol[R_co]):
    """One run of the reader; ``reached_streaming`` says whether it got that far."""

    reached_streaming: bool

    def run(self) -> R_co: ...


def retryable(e: BaseException) -> CdcError | None:
    """The error as our hierarchy's, if it is worth a reconnect; else None."""
    if isinstance(e, CdcError):
        return e if e.retryable else None
    if isinstance(e, psycopg.OperationalError):
        err = classify(e, "PostgreSQL connection lost")
        return err if err.retryable else None
    return None


def run_supervised(
    attempt: Callable[[], Attempt[R]],
    *,
    stop: threading.Event,
    reconnect_timeout_s: float,
    on_stopped: Callable[[], R],
    clock: Callable[[], float] = time.monotonic,
) -> R:
    """Run ``attempt().run()``, starting a new attempt after each retryable failure.

    ``on_stopped`` gives the result when a stop is asked for while waiting to reconnect.
    """
    failing_since: float | None = None
    delay = FIRST_DELAY_S
    tries = 0
    while True:
        current = attempt()
        try:
            return current.run()
        except Exception as e:
            err = retryable(e)
            if err is None or stop.is_set() or reconnect_timeout_s <= 0:
                raise
            if current.reached_streaming:  # it worked until now: a new run of failures
                failing_since, delay, tries = None, FIRST_DELAY_S, 0
            elif failing_since is None:
                raise  # never streamed: a misconfiguration shows at once, as one line
            now = clock()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since > reconnect_timeout_s:
                raise ConnectionFailed(
                    f"{err} (gave up reconnecting after {now - failing_since:.0f}s; "
                    f"postgres.reconnect_timeout_s is {reconnect_timeout_s:g})"
                ) from e
            tries += 1
            log.warning(
                "lost %s: %s; reconnecting in %.0fs (attempt %d, giving up %.0fs "
                "after the first failure)",
                "Kafka" if isinstance(err, KafkaUnavailable) else "PostgreSQL",
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
