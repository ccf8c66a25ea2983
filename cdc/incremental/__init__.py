"""Incremental snapshots: tables read in key-ordered chunks between watermarks while the
stream runs (DBLog's algorithm, as Debezium's incremental snapshots use it), requested by
authenticated signals. One module per job:

- :mod:`~cdc.incremental.merge`: the algorithm, pure, with its invariant;
- :mod:`~cdc.incremental.engine`: the chunks' life beside the stream (ask, merge at the high
  watermark, publish, acknowledge, retry), with :mod:`~cdc.incremental.cursor` (where a
  snapshot stands) and :mod:`~cdc.incremental.progress`; :mod:`~cdc.incremental.requests`:
  what is queued;
- :mod:`~cdc.incremental.worker`: a chunk's reading in PostgreSQL;
- :mod:`~cdc.incremental.queue`: the durable queue in the state topic;
- :mod:`~cdc.incremental.channels`, :mod:`~cdc.incremental.auth`,
  :mod:`~cdc.incremental.signal_table`, :mod:`~cdc.incremental.signal_topic`,
  :mod:`~cdc.incremental.signals`: the signals, their channels and their proofs;
- :mod:`~cdc.incremental.filters`: a signal's filter, checked before use;
- :mod:`~cdc.incremental.send`: what ``cdc snapshot`` checks and sends;
- :mod:`~cdc.incremental.wiring`: the engine's ports made real.

The design, its version rule and its limits: ``docs/incremental-snapshots.md``.
"""

from cdc.incremental.queue import (
    KeyRange,
    SnapshotsState,
    TableSnapshot,
    join_tables,
    load_snapshots,
    save_snapshots,
)

__all__ = [
    "KeyRange",
    "SnapshotsState",
    "TableSnapshot",
    "join_tables",
    "load_snapshots",
    "save_snapshots",
]
