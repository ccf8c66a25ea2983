"""What a snapshot reads of a published table: the rows the publication publishes as it.

A publication lists an inheritance child as a table of its own (``FOR TABLE parent`` adds
the children, ``FOR TABLE ONLY parent`` does not), and pgoutput sends a child's changes under
the child's name. So a plain table is read ``ONLY``: its children's rows are never its own
(without it, ``SELECT … FROM parent`` returns them under the parent's topic, keys and all).
A partitioned table is in a publication's tables only with ``publish_via_partition_root``,
and then its partitions' changes are sent as its own: it is read whole. Its partitions,
listed instead when the option is off, are plain tables.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql


def from_item(conn: psycopg.Connection[Any], schema: str, table: str) -> sql.Composable:
    """``ONLY "schema"."table"``, or the name alone for a partitioned table."""
    ident = sql.Identifier(schema, table)
    row = conn.execute(
        "SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = %s::regclass",
        (ident.as_string(conn),),
    ).fetchone()
    if row is not None and row[0] == "p":
        return ident
    return sql.SQL("ONLY {}").format(ident)
