"""What Ctrl-C (SIGINT) and SIGTERM do to a running reader: stop it within a second.

A stop is an event (:attr:`Interrupt.stop`) that the snapshot and the streaming loops check
between short steps, so they flush and acknowledge what Kafka holds before they return; code
that checks it runs inside :meth:`Interrupt.graceful`. Anywhere else (connecting, waiting for
a busy slot, creating the slot, loading the state) the reader sits in calls that block, so
there a signal also raises :class:`KeyboardInterrupt` in the main thread: psycopg's and
Python's own waits give way to it at once, and the reader's Kafka waits are cut into slices of
half a second. Stopping there is as safe as a crash, which the reader is built to survive:
nothing is acknowledged that Kafka does not hold, and the next run starts from what the slot
and the state say. A second signal exits at once (status 130).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from pgcdc.core.errors import CdcError

log = logging.getLogger("cdc")

SECOND_SIGNAL_EXIT = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended


class StopRequested(CdcError):
    """A stop was asked for while the reader waited on Kafka (a full queue, a flush)."""


class Interrupt:
    """The stop event, and whether a signal may interrupt the main thread where it is."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._graceful = 0  # nesting depth of code that checks the stop event itself
        self._armed = False  # a run is in progress: a signal may raise KeyboardInterrupt

    def install(self) -> None:
        """Handle SIGINT and SIGTERM (call from the main thread)."""
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    @contextlib.contextmanager
    def graceful(self) -> Iterator[None]:
        """Code that checks :attr:`stop` often: a signal sets it and returns."""
        self._graceful += 1
        try:
            yield
        finally:
            self._graceful -= 1

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """A run in progress: outside :meth:`graceful` a signal interrupts the main thread
        (one that came before the run began stops it at once)."""
        if self.stop.is_set():
            raise KeyboardInterrupt
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        """The signal handler (it runs in the main thread, between two bytecodes)."""
        if self.stop.is_set():
            log.warning("received signal %d again; exiting at once", signum)
            sys.stderr.flush()
            os._exit(SECOND_SIGNAL_EXIT)
        self.stop.set()
        log.info("received signal %d; stopping", signum)
        if self._armed and not self._graceful:
            raise KeyboardInterrupt
