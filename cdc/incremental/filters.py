"""A signal's filter (``--where``, Debezium's ``additional-conditions``), checked before use.

Nothing a signal carries runs as written. A filter must be one boolean expression over the
table's own columns:

1. PostgreSQL's own parser (libpg_query, through ``pglast``) reads it as the WHERE clause of
   an otherwise empty ``SELECT``; anything else in that statement (a second statement after
   ``;``, ``ORDER BY``, ``LIMIT``, ``FOR UPDATE``, a set operation) refuses it;
2. the parse tree is walked against an allow-list (:data:`_ALLOWED`): operators, AND/OR/NOT,
   IS [NOT] NULL/TRUE, IN, LIKE, BETWEEN, CASE, COALESCE, GREATEST/LEAST, NULLIF, casts,
   literals, arrays, rows, subscripts, COLLATE, CURRENT_DATE and the like, unqualified
   column names of the table, and calls of plain functions. No subquery, no reference to
   another relation (a qualified column, ``*``), no parameter, no aggregate or window call;
3. on the server (:func:`check_on_server`), every function it calls must be in pg_catalog
   (or listed in ``postgres.signal_filter_functions``), immutable or stable, a plain
   function, and not one that runs SQL text or reports on the server (:data:`_DENIED`); every
   operator must be pg_catalog's with an immutable or stable function; and ``EXPLAIN`` of
   the chunk query must succeed (types, columns);
4. what runs is the tree deparsed again (:attr:`CheckedFilter.sql`), never the text received,
   in a ``READ ONLY`` transaction with ``search_path = pg_catalog, pg_temp``, so a name cannot
   resolve to a user's object.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pglast import ast, parse_sql
from pglast.enums import A_Expr_Kind
from pglast.parser import ParseError
from pglast.stream import RawStream
from psycopg import sql

SAFE_SEARCH_PATH = "SET LOCAL search_path TO pg_catalog, pg_temp"

# Node types a filter may hold (a value node, String/Integer/..., anywhere).
_ALLOWED = (
    ast.BoolExpr,
    ast.A_Expr,
    ast.NullTest,
    ast.BooleanTest,
    ast.ColumnRef,
    ast.A_Const,
    ast.TypeCast,
    ast.TypeName,
    ast.FuncCall,
    ast.CaseExpr,
    ast.CaseWhen,
    ast.CoalesceExpr,
    ast.MinMaxExpr,
    ast.A_ArrayExpr,
    ast.RowExpr,
    ast.A_Indirection,
    ast.A_Indices,
    ast.CollateClause,
    ast.SQLValueFunction,
    ast.String,
    ast.Integer,
    ast.Float,
    ast.Boolean,
    ast.BitString,
)
_KINDS = {
    A_Expr_Kind.AEXPR_OP,
    A_Expr_Kind.AEXPR_OP_ANY,
    A_Expr_Kind.AEXPR_OP_ALL,
    A_Expr_Kind.AEXPR_DISTINCT,
    A_Expr_Kind.AEXPR_NOT_DISTINCT,
    A_Expr_Kind.AEXPR_NULLIF,
    A_Expr_Kind.AEXPR_IN,
    A_Expr_Kind.AEXPR_LIKE,
    A_Expr_Kind.AEXPR_ILIKE,
    A_Expr_Kind.AEXPR_SIMILAR,
    A_Expr_Kind.AEXPR_BETWEEN,
    A_Expr_Kind.AEXPR_NOT_BETWEEN,
    A_Expr_Kind.AEXPR_BETWEEN_SYM,
    A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM,
}
_BETWEEN = {
    A_Expr_Kind.AEXPR_BETWEEN,
    A_Expr_Kind.AEXPR_NOT_BETWEEN,
    A_Expr_Kind.AEXPR_BETWEEN_SYM,
    A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM,
}
# pg_catalog functions that are stable yet run SQL text or report on the server and its
# settings: refused whatever their volatility.
_DENIED = re.compile(
    r"^(pg_.*|has_.*|.*_to_xml.*|ts_stat|ts_rewrite|current_setting|set_config|lo_.*|"
    r"dblink.*|txid_.*|inet_(client|server)_.*)$"
)


class FilterRefused(ValueError):
    """The filter is not one we run; the message says why."""


@dataclass(frozen=True)
class CheckedFilter:
    """A filter that passed the parse and the allow-list: what to run, and what to check on
    the server (function names, unqualified or schema-qualified, and operator names)."""

    sql: str
    functions: frozenset[tuple[str | None, str]] = field(default_factory=frozenset)
    operators: frozenset[str] = field(default_factory=frozenset)


def check_expression(
    text: str, columns: Collection[str], allowed_functions: Iterable[str] = ()
) -> CheckedFilter:
    """Parse ``text`` and walk it (rules 1, 2 of the module docstring); FilterRefused if it
    is not one boolean expression over ``columns``."""
    allowed = {tuple(f.split(".", 1)) for f in allowed_functions}
    try:
        statements = parse_sql(f"SELECT WHERE {text}")
    except ParseError as e:
        raise FilterRefused(f"it does not parse: {e}") from e
    if len(statements) != 1:
        raise FilterRefused("it holds more than one statement (a ';')")
    stmt = statements[0].stmt
    if not isinstance(stmt, ast.SelectStmt) or stmt.whereClause is None:
        raise FilterRefused("it is not a boolean expression")
    for name in _slots(stmt):
        if name in ("whereClause", "op", "all", "groupDistinct", "limitOption"):
            continue
        if getattr(stmt, name):
            raise FilterRefused(f"it is more than an expression ({name} after it)")
    walker = _Walker(set(columns), allowed)
    walker.visit(stmt.whereClause)
    return CheckedFilter(
        RawStream()(stmt.whereClause), frozenset(walker.functions), frozenset(walker.operators)
    )


class _Walker:
    def __init__(self, columns: set[str], allowed: set[tuple[str, ...]]) -> None:
        self.columns = columns
        self.allowed = allowed
        self.functions: set[tuple[str | None, str]] = set()
        self.operators: set[str] = set()

    def visit(self, node: Any) -> None:
        if isinstance(node, tuple | list):
            for item in node:
                self.visit(item)
            return
        if not isinstance(node, ast.Node):
            return  # None, an enum, a plain value
        if not isinstance(node, _ALLOWED):
            raise FilterRefused(f"{_describe(node)} is not allowed in a filter")
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is not None:
            handler(node)
            return
        for name in _slots(node):
            self.visit(getattr(node, name))

    def _ColumnRef(self, node: ast.ColumnRef) -> None:
        fields = node.fields or ()
        if len(fields) != 1 or not isinstance(fields[0], ast.String):
            raise FilterRefused(
                "a filter names the table's own columns only, unqualified (no other relation, no *)"
            )
        name = fields[0].sval
        if name not in self.columns:
            raise FilterRefused(f"column {name!r} is not a column of the table")

    def _A_Expr(self, node: ast.A_Expr) -> None:
        if node.kind not in _KINDS:
            raise FilterRefused(f"expression kind {node.kind} is not allowed in a filter")
        names = _names(node.name)
        if len(names) != 1:
            raise FilterRefused("a schema-qualified operator is not allowed in a filter")
        if node.kind in _BETWEEN:
            self.operators.update((">=", "<="))
        elif node.kind is A_Expr_Kind.AEXPR_SIMILAR:
            self.operators.add("~")
            self.functions.add((None, "similar_to_escape"))
        elif node.kind is A_Expr_Kind.AEXPR_IN:
            self.operators.add(names[0])
        else:
            self.operators.add(names[0])
        self.visit(node.lexpr)
        self.visit(node.rexpr)

    def _FuncCall(self, node: ast.FuncCall) -> None:
        if node.agg_star or node.agg_distinct or node.agg_order or node.agg_filter:
            raise FilterRefused("an aggregate call is not allowed in a filter")
        if node.over is not None or node.agg_within_group:
            raise FilterRefused("a window or ordered-set call is not allowed in a filter")
        names = _names(node.funcname)
        if len(names) == 2 and names[0] == "pg_catalog":
            names = names[1:]
        if len(names) == 1:
            self.functions.add((None, names[0]))
        elif len(names) == 2 and tuple(names) in self.allowed:
            self.functions.add((names[0], names[1]))
        else:
            raise FilterRefused(
                f"function {'.'.join(names)} is not allowed in a filter (only pg_catalog's, "
                "or those listed in postgres.signal_filter_functions)"
            )
        self.visit(node.args)

    def _TypeCast(self, node: ast.TypeCast) -> None:
        tn = node.typeName
        names = _names(tn.names if tn is not None else None)
        if len(names) == 2 and names[0] == "pg_catalog":
            names = names[1:]
        if len(names) != 1 or (tn is not None and (tn.setof or tn.pct_type)):
            raise FilterRefused("a cast to a schema-qualified type is not allowed in a filter")
        self.visit(node.arg)
        if tn is not None:
            self.visit(tn.typmods)

    def _CollateClause(self, node: ast.CollateClause) -> None:
        if len(node.collname or ()) != 1:
            raise FilterRefused("a schema-qualified collation is not allowed in a filter")
        self.visit(node.arg)


def _slots(node: ast.Node) -> tuple[str, ...]:
    return tuple(getattr(node, "__slots__", ()))


def _names(nodes: Any) -> list[str]:
    """The strings of a name list (String nodes), e.g. a function's or an operator's."""
    return [n.sval for n in nodes or () if isinstance(n, ast.String) and n.sval is not None]


def _describe(node: ast.Node) -> str:
    names = {
        "SubLink": "a subquery",
        "ParamRef": "a parameter",
        "A_Star": "*",
        "GroupingFunc": "GROUPING",
        "RangeVar": "a relation",
    }
    return names.get(type(node).__name__, type(node).__name__)


_FUNCTIONS_SQL = """
SELECT n.nspname, p.proname, p.provolatile, p.prokind, p.proretset
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = %s AND p.proname = %s
"""
_OPERATORS_SQL = """
SELECT o.oprname, p.proname, p.provolatile
FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode
WHERE o.oprnamespace = 'pg_catalog'::pg_catalog.regnamespace AND o.oprname = %s
"""


def check_on_server(
    conn: psycopg.Connection[Any], checked: CheckedFilter, schema: str, table: str
) -> None:
    """Rule 3 of the module docstring. FilterRefused if a function or an operator is not
    allowed, or the server refuses the chunk query. Outside a transaction it opens a READ
    ONLY one with the safe search_path; inside one (the worker's chunk) it uses that."""
    for nsp, name in sorted(checked.functions, key=lambda f: (f[0] or "", f[1])):
        if nsp is None and _DENIED.match(name):
            raise FilterRefused(f"function {name} is not allowed in a filter")
        rows = conn.execute(_FUNCTIONS_SQL, (nsp or "pg_catalog", name)).fetchall()
        shown = f"{nsp}.{name}" if nsp else name
        if not rows:
            raise FilterRefused(f"function {shown} does not exist in {nsp or 'pg_catalog'}")
        for _nsp, _name, volatility, kind, retset in rows:
            if kind != "f" or retset:
                raise FilterRefused(f"{shown} is not a plain function (aggregate, window, set)")
            if volatility == "v":
                raise FilterRefused(f"function {shown} is volatile")
    for op in sorted(checked.operators):
        rows = conn.execute(_OPERATORS_SQL, (op,)).fetchall()
        if not rows:
            raise FilterRefused(f"operator {op} does not exist in pg_catalog")
        for _op, proname, volatility in rows:
            if volatility == "v":
                raise FilterRefused(f"operator {op} calls the volatile function {proname}")
    explain = sql.SQL("EXPLAIN SELECT 1 FROM {} WHERE {}").format(
        sql.Identifier(schema, table), sql.SQL(checked.sql)
    )
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    try:
        with conn.transaction():
            if idle:
                conn.execute("SET TRANSACTION READ ONLY")
                conn.execute(SAFE_SEARCH_PATH)
            conn.execute(explain)
    except (psycopg.errors.QueryCanceled, psycopg.OperationalError):
        raise  # not the filter's fault: the caller retries
    except psycopg.Error as e:
        if conn.closed:
            raise
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FilterRefused(f"the server refuses it: {text}") from e
