"""Ctrl-C on a sync job stops it as SIGTERM does: one line, exit status 0, no traceback.

A terminal sends SIGINT to the whole process group: the spark-submit JVM, this driver and
the Python workers. Left alone, the JVM runs its shutdown hooks (stopping the SparkContext
under the running query) and exits 130, while PySpark's own handler calls into that dying
JVM from inside a py4j read: some 1,500 lines of Python and Java tracebacks. So the driver
owns the stop: the JVM is told to ignore SIGINT (as it does when started under ``nohup``),
the driver's handler only sets an event, and the job's wait loop stops the query between two
short waits (:func:`await_stop`), quietly: a batch the stop cut short ends with a one-line
:class:`BatchInterrupted` and runs again at the next start. A second Ctrl-C exits at once
(status 130).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

SECOND_SIGNAL_EXIT = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended
POLL_S = 0.5  # how often the wait loop looks at the stop event


class BatchInterrupted(Exception):
    """A micro-batch cut short by a stop; the checkpoint does not hold it, so it runs again."""


class Interrupt:
    """The stop event a SIGINT sets."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.stop = threading.Event()

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        """The signal handler: it runs in the main thread, and never calls into the JVM."""
        if self.stop.is_set():
            sys.stderr.flush()
            os._exit(SECOND_SIGNAL_EXIT)
        self.stop.set()
        log.info(
            "received %s; stopping %s (a restart resumes from its checkpoint; "
            "Ctrl-C again exits at once)",
            signal.Signals(signum).name,
            self.job,
            extra={"job": self.job},
        )


def jvm_ignores_sigint(jvm: Any) -> None:
    """Make the driver's JVM (spark-submit's, which hosts py4j) ignore SIGINT: its shutdown
    hooks would stop Spark under the query. SIGTERM still ends it as before."""
    signal_class = jvm.sun.misc.Signal
    signal_class.handle(signal_class("INT"), jvm.sun.misc.SignalHandler.SIG_IGN)


def install(spark: Any, job: str) -> Interrupt:
    """Take over SIGINT (after the SparkContext, which installs PySpark's handler)."""
    interrupt = Interrupt(job)
    jvm_ignores_sigint(spark.sparkContext._jvm)
    signal.signal(signal.SIGINT, interrupt.handle)
    return interrupt


def quiet(jvm: Any) -> None:
    """Silence what a stop makes Spark say: the scheduler's warnings about the tasks it
    cancels (or finds none to cancel), the query's end by interruption, and the py4j
    callback's traceback of the batch that was interrupted. The checkpoint holds only
    completed batches, so the interrupted one runs again at the next start."""
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setRootLevel(log4j.Level.OFF)
    logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)


def await_stop(query: Any, interrupt: Interrupt, jvm: Any, progress: Any = None) -> None:
    """Wait until the query ends or a Ctrl-C asks for a stop (then stop it quietly); between
    two waits, ``progress`` (a :class:`spark_jobs.progress.ProgressLog`) sees the query's
    new progress reports."""
    while not interrupt.stop.is_set():
        ended = query.awaitTermination(POLL_S)
        if progress is not None:
            progress.poll(query)
        if ended:
            return
    quiet(jvm)
    query.stop()
