"""Python's cyclic garbage collector paused for one task.

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
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the block (if it was on), and the block's cycles collected
    after it (see the module doc)."""
    if not gc.isenabled():  # paused already (an enclosing task), or off by the process
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)
