"""PostgreSQL's side of a fold in the native module: which columns of a table it renders
from ``COPY`` text straight into the followers' document, and how.

A column is taken when the way from its COPY text to its document value is plain, the same
two steps :class:`schemas.plan.EncodePlan` (``json_row``) and the jobs' converter
(:class:`spark_jobs.convert.RowConverter`) take, for the types most tables are made of:

========  ===================================  =============================================
kind      columns                              document value
========  ===================================  =============================================
text      every type carried as a plain        the text, a JSON string
          string (text, varchar, uuid, json,
          enums, …)
int       smallint, integer, bigint, oid       the text, a JSON integer
bool      boolean                              ``true`` / ``false``
decimal   numeric(p, s), s ≥ 0, precise mode   ``str(Decimal)`` of the value, a JSON string
zoned     timestamptz, in the session's UTC    ZonedTimestamp (ISO-8601, ``Z``)
skip      a column the row images leave out    (none)
========  ===================================  =============================================

A table with any other column is rendered by Python, row by row. Within a table, a row the
native code is not sure of (an escape in its COPY line, a value outside the layouts above,
a placeholder's text, a null where the document holds a fill) is handed back, and Python
renders it. The tests hold the two to one answer (``tests/unit/verify/test_copy_render.py``).
"""

from __future__ import annotations

from typing import Any

import orjson

from pgcdc.core import native
from pgcdc.core.contract import PLACEHOLDER_TEXTS
from schemas import oids
from schemas.connect import DECIMAL_NAME
from schemas.convert import to_bool
from schemas.plan import EncodePlan
from schemas.typemap import resolve_domain

_ZONED = "io.debezium.time.ZonedTimestamp"
_MAX_WIDTH = 6  # microseconds: timestamptz's finest


def column_kinds(plan: EncodePlan) -> list[tuple[str, int]] | None:
    """Each column's kind and its number (a decimal's scale, a timestamp's fraction
    digits), in the table's order; None when a column has none (Python renders the
    table)."""
    kinds: list[tuple[str, int]] = []
    carried = frozenset(plan.value_indexes)
    for i, (column, codec) in enumerate(zip(plan.table.columns, plan.codecs, strict=True)):
        schema = codec.schema
        base, typmod = resolve_domain(column.type, column.type_modifier)
        if i not in carried:
            kinds.append(("skip", 0))
        elif codec.convert is None and schema.get("type") == "string":
            kinds.append(("text", 0))
        elif codec.convert is int:
            kinds.append(("int", 0))
        elif codec.convert is to_bool:
            kinds.append(("bool", 0))
        elif base.oid == oids.NUMERIC and schema.get("name") == DECIMAL_NAME:
            scale = int(schema.get("parameters", {}).get("scale", -1))
            if scale < 0:
                return None
            kinds.append(("decimal", scale))
        elif base.oid == oids.TIMESTAMPTZ and schema.get("name") == _ZONED:
            width = _MAX_WIDTH if typmod < 0 else typmod
            if width > _MAX_WIDTH:
                return None
            kinds.append(("zoned", width))
        else:
            return None
    return kinds


def renders(plan: EncodePlan, id_at: int | None) -> bool:
    """Whether :func:`copy_rows` gives the table's COPY lines to the native module."""
    return native.module() is not None and id_at is not None and column_kinds(plan) is not None


def copy_rows(plan: EncodePlan, id_at: int | None) -> Any:
    """A ``pgcdc_native.CopyRows`` for the table's COPY lines whose document id is the text
    of column ``id_at``; None without the native module, without such a column, or when
    :func:`column_kinds` has none."""
    mod = native.module()
    if mod is None or id_at is None:
        return None
    kinds = column_kinds(plan)
    if kinds is None:
        return None
    names = plan.names
    columns = [
        (kind, arg, orjson.dumps(names[i]), plan.fills[i] is not None)
        for i, (kind, arg) in enumerate(kinds)
    ]
    order = sorted(plan.value_indexes, key=names.__getitem__)
    placeholders = [t.encode() for t in PLACEHOLDER_TEXTS]
    return mod.CopyRows(columns, order, id_at, placeholders)
