"""Waits that say what they wait for: a step that may block on something outside the reader
(another session's transaction, a server's answer) logs one line once it has taken
:data:`SAY_AFTER_S`, naming what it waits for, so a silent pause never looks like a hang."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

log = logging.getLogger(__name__)

SAY_AFTER_S = 2.0


@contextlib.contextmanager
def said_if_slow(
    message: Callable[[], str], after_s: float = SAY_AFTER_S, **extra: Any
) -> Iterator[None]:
    """Run the body; if it lasts ``after_s``, log ``message()`` (computed then, on a timer
    thread) once, at WARNING."""

    def say() -> None:
        try:
            text = message()
        except Exception as e:  # what it waits for could not be found out: say that much
            text = f"(could not tell what it waits for: {e})"
        log.warning(text, extra=extra)

    timer = threading.Timer(after_s, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


# A new logical slot waits for every transaction that holds a transaction id, in every
# database of the server (the running-transactions record is server-wide).
_OPEN_TRANSACTIONS = """
SELECT count(*) OVER (), pid, usename, datname, date_trunc('second', xact_start)::text,
       left(query, 60)
FROM pg_stat_activity
WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
ORDER BY xact_start
LIMIT 3
"""


def open_transactions(conn: psycopg.Connection[Any]) -> str:
    """The transactions open on the server that a new slot waits for: how many, and the
    oldest three (pid, user, database, since when, their last statement)."""
    rows = conn.execute(_OPEN_TRANSACTIONS).fetchall()
    if not rows:
        return "none found"
    listed = "; ".join(
        f"pid {pid} ({user} on {db}, open since {since}: {query!r})"
        for _n, pid, user, db, since, query in rows
    )
    return f"{rows[0][0]} open; the oldest: {listed}"
