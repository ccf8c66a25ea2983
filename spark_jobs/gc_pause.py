"""Python's cyclic garbage collector paused for one task, and what outlived it set aside.

A task holds its partition's records, parsed rows and changes at once (the reduction needs
them all), tens of thousands of dicts and lists. The collector's full passes walk every one
of them, again each time the heap has grown by a quarter, although a task makes almost no
cycles: reference counting frees nearly everything. Measured by ``benchmarks.task_cost``,
that walking was about a quarter of a direct-read task's CPU.

So the collector is off while a task runs, and what the task left in reference cycles (a
caught exception's traceback, say) is collected when it ends: at that point every object the
task made is still in the youngest generation (nothing was collected to promote it), so one
young-generation pass finds it all and walks only what the task made. Memory stays bounded
per task as before; only the moment of collection moves.

What is left after that pass outlives the task: the worker's modules and its cached sinks
(``spark_jobs.apply_loop.cached_sink``), some 146,000 objects. PySpark's daemon runs a *full*
collection after every task of a reused worker (``pyspark/daemon.py``), the source's tasks
too, and each walked all of them: 55-65 ms of CPU a task, measured in the shared job, 1-3 a
batch per worker, about 40 % of its workers' CPU outside the tasks themselves. They are
frozen (``gc.freeze``) instead, so those passes walk only what is new since. A frozen object
is still freed by reference counting; only a cycle among frozen objects would wait, and the
one such case known, a cached sink dropped after a failure, thaws them (:func:`thaw`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the block (if it was on), the block's cycles collected after
    it, and what survived frozen (see the module doc)."""
    if not gc.isenabled():  # paused already (an enclosing task), or off by the process
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)
        gc.freeze()


def thaw() -> None:
    """Let the next full collection see every object again (something long-lived, such as
    a cached sink, was let go and may leave cycles behind)."""
    gc.unfreeze()
