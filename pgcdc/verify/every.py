"""``cdc verify --every``: a pass each interval, until stopped.

Each pass is what a one-off ``cdc verify`` does (given as ``run_pass``); what becomes of its
result is the caller's (``on_pass``: the record ``cdc status`` reads, the metrics, the log
line). Passes start ``interval_s`` apart; one that takes longer than that is followed by the
next at once, never by a burst to catch up (the row rate, ``verify.max_rows_per_second``,
bounds what a pass reads, not how often passes start). A pass that fails (a server that
cannot be read, a follower whose watermark did not reach the snapshot in time) is recorded
as failed and the next one runs at its time; a settings error (a ``TABLE`` no longer
captured) ends the run, as it ends a one-off ``cdc verify``. The stop event ends the wait
between passes at once; a stop during a pass is the caller's (a signal interrupts it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from pgcdc.core.durations import duration
from pgcdc.core.errors import CdcError, ConfigError
from pgcdc.core.verify_record import Outcome, VerifyPass
from pgcdc.verify.report import as_record
from pgcdc.verify.run import TableResult

log = logging.getLogger(__name__)


def run_every(
    interval_s: float,
    run_pass: Callable[[], Sequence[TableResult]],
    on_pass: Callable[[VerifyPass], None],
    stop: threading.Event,
    *,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> int:
    """Run passes until ``stop`` is set; the number of passes run."""
    if interval_s <= 0:
        raise ValueError("the interval must be above zero")
    number = 0
    next_start = monotonic()
    while not stop.is_set():
        number += 1
        started = clock()
        try:
            results = run_pass()
        except ConfigError:
            raise
        except Exception as e:  # recorded as a failed pass, said in its line
            line = str(e) if isinstance(e, CdcError) else f"unexpected {type(e).__name__}: {e}"
            log.debug("pass %d failed", number, exc_info=True)
            record = as_record([], started, clock(), error=line, every_s=interval_s, number=number)
        else:
            record = as_record(results, started, clock(), every_s=interval_s, number=number)
        on_pass(record)
        next_start = max(next_start + interval_s, monotonic())
        if stop.wait(max(0.0, next_start - monotonic())):
            break
    return number


def pass_line(record: VerifyPass) -> str:
    """One line for a person: the pass, its tables and followers, rows checked, what it
    found, how long it took."""
    tables = len({c.table for c in record.checks})
    followers = ", ".join(sorted({c.follower for c in record.checks})) or "-"
    seconds = record.finished_at - record.started_at
    took = f"{seconds:.1f}s" if seconds < 60 else duration(seconds)
    head = f"verify pass {record.number}"
    if record.outcome is Outcome.FAILED:
        return f"{head} failed after {took}: {record.error}"
    found = {
        Outcome.CLEAN: "clean",
        Outcome.UNSETTLED: "no drift, "
        + f"{sum(c.counts.get('unsettled', 0) for c in record.checks)} key(s) unsettled",
    }.get(record.outcome)
    if found is None:
        found = "DRIFT: " + "; ".join(
            f"{c.table} on {c.follower} ("
            + ", ".join(f"{k} {c.counts[k]}" for k in ("missing", "extra", "differ") if c.counts[k])
            + ")"
            for c in record.checks
            if c.outcome is Outcome.DRIFT
        )
    return (
        f"{head}: {tables} table(s) on {followers}, {record.rows_checked} rows checked, "
        f"{found}, in {took}"
    )
