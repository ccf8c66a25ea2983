"""``cdc verify``: compare each follower with PostgreSQL, key range by key range.

The shape is reladiff's: the key space of a table (document ids, in code-point order) is cut
into segments open at both ends (:mod:`.segments`); each segment folds, on each side, into an
order-independent ``(count, hash)`` (:mod:`.fold`); a segment whose folds differ is cut into
``factor`` parts again until it holds at most ``threshold`` rows, and only then are its rows
compared key by key (:mod:`.bisect`). Rows are compared in the form the follower stores them,
rendered by the code the sinks use.

The fence (:mod:`.fence`), which keeps a live load from showing as drift:

1. PostgreSQL is read in one ``REPEATABLE READ`` snapshot whose first statement also reads
   ``pg_current_wal_insert_lsn()``: ``L``. Every transaction that snapshot sees wrote its
   commit record before ``L``.
2. The follower is read only once its watermark (every change committed below it is settled)
   has reached ``L``: it then holds everything the snapshot sees. The wait is bounded; past
   it, ``cdc verify`` stops with one line saying which follower did not catch up.
3. A key whose follower version (the commit LSN the sink stores beside the row) is above
   ``L`` changed after the snapshot: it is not drift, it is looked at again.
4. Every candidate key (missing, extra or differing) is read again in fresh snapshots with
   the same fence; it is reported only when two re-checks in a row judge it divergent (one
   can still catch a change in flight that leaves no version behind: a delete applied to
   OpenSearch between the snapshot and the read). A key still changing after ``attempts``
   re-checks is reported as *unsettled*, never as drift.

So a key is reported only when fenced reads in two snapshots in a row both found the
follower holding nothing newer than the snapshot and still different.
"""
