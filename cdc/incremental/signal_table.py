"""The signal table's grants: who may insert a signal (``postgres.signal_data_collection``).

A row of the signal table carries no signature (Debezium's ``id``, ``type``, ``data``), so
the table's grants are what authenticate it: the reader watches it only while every role
that can insert into it is trusted: a superuser, the reader's own role, a role listed in
``postgres.signal_trusted_roles``, or a member of one of those (a member can become it).
Whoever else can insert, directly, through PUBLIC, through a role it belongs to (inherited
or not), through ``pg_write_all_data`` or through a grant on the table's columns (``GRANT
INSERT (id, type, data)``: a row needs no more), makes the reader refuse the table with one
line.
The check runs at startup (the run stops) and again while streaming (rows are then ignored,
each with a line, until the grants are fixed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgcdc.core.errors import ConfigError

_SQL = """
WITH t AS (SELECT %(table)s::pg_catalog.regclass AS oid),
trusted AS (
  SELECT oid FROM pg_catalog.pg_roles
  WHERE rolsuper OR rolname = current_user OR rolname = ANY(%(trusted)s)
),
grantees AS (
  SELECT r.oid FROM pg_catalog.pg_roles r, t
  WHERE pg_catalog.has_table_privilege(r.oid, t.oid, 'INSERT')
     OR pg_catalog.has_any_column_privilege(r.oid, t.oid, 'INSERT')
)
SELECT
  EXISTS (
    SELECT 1 FROM pg_catalog.pg_class c, t,
      LATERAL pg_catalog.aclexplode(c.relacl) a
    WHERE c.oid = t.oid AND a.grantee = 0 AND a.privilege_type = 'INSERT'
  ) OR EXISTS (
    SELECT 1 FROM pg_catalog.pg_attribute at, t,
      LATERAL pg_catalog.aclexplode(at.attacl) a
    WHERE at.attrelid = t.oid AND at.attnum > 0 AND NOT at.attisdropped
      AND a.grantee = 0 AND a.privilege_type = 'INSERT'
  ),
  ARRAY(
    SELECT DISTINCT r.rolname::text FROM pg_catalog.pg_roles r
    WHERE r.rolcanlogin
      AND EXISTS (SELECT 1 FROM grantees g WHERE pg_catalog.pg_has_role(r.oid, g.oid, 'MEMBER'))
      AND NOT EXISTS (
        SELECT 1 FROM trusted tr WHERE pg_catalog.pg_has_role(r.oid, tr.oid, 'MEMBER')
      )
    ORDER BY 1
  )
"""


def untrusted_writers(
    conn: psycopg.Connection[Any], table: tuple[str, str], trusted: Sequence[str]
) -> str | None:
    """Why the signal table may not be watched (who else can insert), or None."""
    name = f"{table[0]}.{table[1]}"
    quoted = sql.Identifier(*table).as_string(conn)
    try:
        with conn.transaction():
            row = conn.execute(_SQL, {"table": quoted, "trusted": list(trusted)}).fetchone()
    except psycopg.errors.UndefinedTable:
        return f"signal table {name} does not exist (create it: id text, type text, data text)"
    assert row is not None
    public, roles = bool(row[0]), list(row[1])
    if public:
        return (
            f"PUBLIC may insert into the signal table {name}: REVOKE INSERT ON {name} FROM PUBLIC "
            "(and REVOKE INSERT (id, type, data) for a grant on its columns)"
        )
    if roles:
        return (
            f"roles {', '.join(roles)} may insert into the signal table {name} but are not "
            "trusted: revoke it, or list them in postgres.signal_trusted_roles"
        )
    return None


def check_signal_table(
    conn: psycopg.Connection[Any], table: tuple[str, str], trusted: Sequence[str]
) -> None:
    """At startup: ConfigError (one line) unless only trusted roles can insert signals."""
    reason = untrusted_writers(conn, table, trusted)
    if reason is not None:
        raise ConfigError(f"refusing to watch the signal table: {reason}")
