"""The one workload generator, used by the benchmark, the demo and the tests.

A worker runs transactions of a *mix* on a schedule (:mod:`.engine`): the loop owns the
connection, the pacing (open loop at a fixed rate, or closed loop with a pause) and the
moment a change counts as committed; the mix only says what a transaction writes. Workers
run as threads (:mod:`.threads`) or processes (:mod:`.open_loop`). The mixes:

- :mod:`.orders`: the benchmark's 10-column table, 50% inserts, 40% updates, 10% deletes,
  with :func:`bulk_load` for snapshots and :func:`write_backlog` (:mod:`.backlog`) for a
  server-side backlog; :class:`OpenLoopLoad` offers it at a fixed rate;
- :mod:`.marked`: the reader tests' :class:`Workload`, whose writers log every committed
  change with a unique marker;
- ``demo.changes``: the demo's product catalog (inserts, TOAST-preserving updates, cascading
  deletes, primary-key changes), run by :class:`ThreadedLoad` at a paced rate.

``python -m benchmarks.workload`` runs the marked workload from the command line.
"""

from benchmarks.workload.backlog import Backlog, wait_flushed, write_backlog
from benchmarks.workload.engine import Mix, MixFactory, Pacing, WorkerResult, ident, run_worker
from benchmarks.workload.keys import LiveKeys
from benchmarks.workload.marked import Change, MarkedMix, Workload, read_log, write_log
from benchmarks.workload.open_loop import LoadResult, OpenLoopLoad
from benchmarks.workload.orders import (
    COLUMNS,
    MIX,
    ROW_EXPR,
    UPDATE_SET,
    OrdersMix,
    avg_row_bytes,
    bulk_load,
    create_table,
    txn_pattern,
)
from benchmarks.workload.threads import ThreadedLoad

__all__ = [
    "COLUMNS",
    "MIX",
    "ROW_EXPR",
    "UPDATE_SET",
    "Backlog",
    "Change",
    "LiveKeys",
    "LoadResult",
    "MarkedMix",
    "Mix",
    "MixFactory",
    "OpenLoopLoad",
    "OrdersMix",
    "Pacing",
    "ThreadedLoad",
    "WorkerResult",
    "Workload",
    "avg_row_bytes",
    "bulk_load",
    "create_table",
    "ident",
    "read_log",
    "run_worker",
    "txn_pattern",
    "wait_flushed",
    "write_backlog",
    "write_log",
]
