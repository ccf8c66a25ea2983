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
3. on the server (:func:`check_on_server`), PostgreSQL says what it means: the filter is
   compiled into a throwaway view over ``ONLY`` the table (in a transaction always rolled
   back) and the view's analysed tree is judged. Every function it calls, directly, through
   an operator, through field notation (``(x).f`` is ``f(x)``) or through an I/O cast (the
   types' input and output functions), must be immutable, a plain function, in pg_catalog
   (or listed in ``postgres.signal_filter_functions``) and not one that reports on the
   server (:data:`_DENIED`); no value of a ``reg*`` type (a catalog lookup), no node outside
   :data:`_NODES` (no subquery, no ``CURRENT_USER``), no column of another relation;
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

from pgcdc.core.qualified_names import split_qualified

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
    allowed = {split_qualified(f, "function") for f in allowed_functions}
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
    def __init__(self, columns: set[str], allowed: set[tuple[str, str]]) -> None:
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


# What a filter means is PostgreSQL's to say: it is compiled into a throwaway view (in a
# transaction always rolled back) and the view's analysed tree (pg_rewrite.ev_action, the
# node tree the executor would run) is read back. Field notation ((x).f is the call f(x)),
# implicit casts, operators and I/O coercions all appear there as what they call.
_VIEW = "cdc_filter_check"
_TREE_SQL = (
    "SELECT ev_action::text FROM pg_catalog.pg_rewrite "
    "WHERE ev_class = 'pg_temp.cdc_filter_check'::pg_catalog.regclass"
)
# Node types a filter's analysed tree may hold (anything else: refused).
_NODES = frozenset(
    {
        "FROMEXPR", "RANGETBLREF", "TARGETENTRY", "VAR", "CONST", "OPEXPR", "FUNCEXPR",
        "BOOLEXPR", "NULLTEST", "BOOLEANTEST", "SCALARARRAYOPEXPR", "ARRAYEXPR", "ROWEXPR",
        "ROWCOMPAREEXPR", "COALESCEEXPR", "MINMAXEXPR", "CASEEXPR", "CASEWHEN", "CASETESTEXPR",
        "RELABELTYPE", "COERCEVIAIO", "ARRAYCOERCEEXPR", "DISTINCTEXPR", "NULLIFEXPR",
        "SUBSCRIPTINGREF", "COLLATEEXPR", "FIELDSELECT",
    }
)  # fmt: skip
_NODE = re.compile(r"\{([A-Z_]+)")
_CALLS = re.compile(r":(?:funcid|opfuncid|hashfuncid|negfuncid) (\d+)")
_OPERATORS = re.compile(r":opno (\d+)|:opnos \(o([ \d]*)\)")
_TYPES = re.compile(r":(?:consttype|resulttype|vartype|minmaxtype|rowtypeid) (\d+)")
_VARNOS = re.compile(r":varno (\d+)")
_RTINDEX = re.compile(r":rtindex (\d+)")
_PROCS_SQL = """
SELECT p.oid::int8, n.nspname, p.proname, p.provolatile, p.prokind, p.proretset
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE p.oid = ANY(%s::oid[])
"""
_OPCODES_SQL = "SELECT oprcode::oid::int8 FROM pg_catalog.pg_operator WHERE oid = ANY(%s::oid[])"
_TYPES_SQL = """
SELECT t.oid::int8, n.nspname, t.typname, t.typinput::oid::int8, t.typoutput::oid::int8
FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
WHERE t.oid = ANY(%s::oid[])
"""


def check_on_server(
    conn: psycopg.Connection[Any], checked: CheckedFilter, schema: str, table: str
) -> None:
    """Rule 3 of the module docstring: FilterRefused unless every function the analysed
    filter calls (directly, through an operator, through field notation, through an I/O
    cast) is immutable, a plain function, in pg_catalog or listed in
    ``postgres.signal_filter_functions``, and not one of :data:`_DENIED`; no ``reg*`` type
    and no other relation appear; and the server compiles it over the table. ``conn`` must
    be outside a transaction: the check runs in one of its own, always rolled back."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("check_on_server needs a connection outside a transaction")
    view = sql.SQL("CREATE TEMP VIEW {} AS SELECT 1 AS one FROM ONLY {} WHERE ({})").format(
        sql.Identifier(_VIEW), sql.Identifier(schema, table), sql.SQL(checked.sql)
    )
    listed = {f for f in checked.functions if f[0] is not None}
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(SAFE_SEARCH_PATH)
            conn.execute(view)
            row = conn.execute(_TREE_SQL).fetchone()
            assert row is not None
            _judge(conn, _quals(str(row[0])), listed)
    except (psycopg.errors.QueryCanceled, psycopg.OperationalError):
        raise  # not the filter's fault: the caller retries
    except psycopg.Error as e:
        if conn.closed:
            raise
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FilterRefused(f"the server refuses it: {text}") from e


def _quals(tree: str) -> str:
    """The part of a view's query tree after its range table: the join tree (the WHERE
    clause) and the target list (one constant)."""
    at = tree.find(":jointree")
    if at < 0:
        raise FilterRefused("the server's analysed filter has no WHERE clause to judge")
    return tree[at:]


def _judge(conn: psycopg.Connection[Any], tree: str, listed: set[tuple[str | None, str]]) -> None:
    for node in sorted(set(_NODE.findall(tree)) - _NODES):
        what = {"SUBLINK": "a subquery", "SQLVALUEFUNCTION": "CURRENT_USER, CURRENT_DATE and"
                " their kind", "PARAM": "a parameter"}.get(node, node.lower())  # fmt: skip
        raise FilterRefused(f"{what} is not allowed in a filter")
    tables = set(_RTINDEX.findall(tree))  # the view's one relation (its range table index)
    if len(tables) != 1 or any(v not in tables for v in _VARNOS.findall(tree)):
        raise FilterRefused("a filter reads the table's own columns only")
    calls = {int(x) for x in _CALLS.findall(tree)} - {0}
    operators: set[int] = set()
    for one, many in _OPERATORS.findall(tree):
        operators.update(int(x) for x in (one or many).split())
    if operators:
        calls.update(int(r[0]) for r in conn.execute(_OPCODES_SQL, (sorted(operators),)))
    types = {int(x) for x in _TYPES.findall(tree)}
    io_cast = "{COERCEVIAIO" in tree  # its types' input and output functions run
    for _oid, nsp, name, typin, typout in conn.execute(_TYPES_SQL, (sorted(types),)):
        if nsp == "pg_catalog" and name.startswith("reg"):
            raise FilterRefused(f"a value of type {name} (a catalog lookup) is not allowed")
        if io_cast:
            calls.update((typin, typout))
    for _oid, nsp, name, volatility, kind, retset in conn.execute(_PROCS_SQL, (sorted(calls),)):
        shown = name if nsp == "pg_catalog" else f"{nsp}.{name}"
        if nsp != "pg_catalog" and (nsp, name) not in listed:
            raise FilterRefused(
                f"function {shown} is not allowed in a filter (only pg_catalog's, "
                "or those listed in postgres.signal_filter_functions)"
            )
        if nsp == "pg_catalog" and _DENIED.match(name):
            raise FilterRefused(f"function {name} is not allowed in a filter")
        if kind != "f" or retset:
            raise FilterRefused(f"{shown} is not a plain function (aggregate, window, set)")
        if volatility != "i":
            how = "volatile" if volatility == "v" else "stable (its result depends on more"
            how += "" if volatility == "v" else " than its arguments)"
            raise FilterRefused(f"function {shown} is {how}: only immutable ones are allowed")
