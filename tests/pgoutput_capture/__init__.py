"""Capture pgoutput byte fixtures from a real PostgreSQL into tests/fixtures/pgoutput/.

Each scenario runs some SQL against a fresh database, reads the slot with
``pg_logical_slot_get_binary_changes`` and writes:

- ``<scenario>.bin``: the messages, each as a 4-byte big-endian length then the bytes;
- an entry in ``manifest.json``: the SQL, the options, and for every message the fields a
  decoder must produce.

The expected fields come from PostgreSQL, never from our decoder: text values are the type
output functions' results (``concat(expr)``), binary values come from the ``*send``
functions, ids from the catalogs, xids from the slot function, commit timestamps from
``pg_xact_commit_timestamp`` and commit LSNs from ``pg_walinspect``.

Needs a superuser on a server with ``wal_level=logical``, ``track_commit_timestamp=on`` and
``max_prepared_transactions > 0``, e.g. a throwaway one::

    su postgres -c "/usr/lib/postgresql/15/bin/initdb -D /tmp/pgcap"
    # postgresql.conf: port=55499, unix_socket_directories='/tmp', wal_level=logical,
    #   track_commit_timestamp=on, max_prepared_transactions=5, logical_decoding_work_mem=64kB
    .venv/bin/python -m tests.pgoutput_capture --dsn "host=/tmp port=55499 user=postgres"

Modules: :mod:`.capture` (the slot reader and the oracle queries), :mod:`.row_scenarios`
(row changes, types, TRUNCATE, binary values), :mod:`.protocol_scenarios` (logical
messages, origins, streaming, two-phase commit); ``__main__`` writes the files. Run it from
the repository root.
"""
