"""The native module renders COPY lines into the followers' documents exactly as Python
does (:class:`schemas.plan.EncodePlan` then the jobs' converter), or hands the line back:
the columns of the all-types table captured from a real server, and generated rows."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.copy_render import column_kinds, copy_rows
from cdc.snapshot import parse_copy_line
from pgcdc.core import native
from pgcdc.core.contract import PLACEHOLDER_TEXTS
from pgcdc.core.row_digest import canonical, fold_docs
from pgcdc.core.settings import DecimalHandling, SchemaSettings
from pgcdc.verify.followers import document_converter
from schemas.formats import json_default
from schemas.model import Column, PgType, TableSchema
from schemas.plan import EncodePlan
from tests.unit.schemas.conftest import load_fixture

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(native.module() is None, reason="the native module is not built"),
]

SETTINGS = SchemaSettings()


def copy_text(value: str | None) -> str:
    """A value as COPY's text format writes it."""
    if value is None:
        return "\\N"
    return (
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    )


def python_text(plan: EncodePlan, line: str, id_at: int) -> tuple[str, bytes]:
    """What the Python path makes of a line: the document id and canonical text."""
    values = parse_copy_line(line)
    to_doc = document_converter(plan.envelope_schema_json)
    doc = to_doc(orjson.dumps(plan.json_row(values), default=json_default))
    key = values[id_at]
    assert isinstance(key, str)
    return key, canonical(doc)


def agree(plan: EncodePlan, lines: Sequence[str], id_at: int = 0) -> int:
    """Each line's native rendering, where there is one, is Python's: how many there were."""
    rows = copy_rows(plan, id_at)
    assert rows is not None
    taken = 0
    for line in lines:
        got = rows.render_line(line.encode())
        if got is not None:
            key, text = python_text(plan, line, id_at)
            assert (got[0].decode(), got[1]) == (key, text), line
            taken += 1
    return taken


# --- the all-types table's columns ------------------------------------------------------


def test_each_column_of_the_all_types_table() -> None:
    """Every column of a type the native code takes, with every value the captured server
    gave it: the same text as Python's, and each kind taken at least once."""
    table, rows = load_fixture()
    taken: Counter[str] = Counter()
    kinds_seen = set()
    for i, column in enumerate(table.columns[1:], start=1):
        sub = TableSchema(table.schema, table.table, (table.columns[0], column), ("id",), "d")
        plan = EncodePlan(sub, SETTINGS, "t")
        kinds = column_kinds(plan)
        if kinds is None:
            continue
        kind = kinds[1][0]
        kinds_seen.add(kind)
        lines = [f"{r[0]}\t{copy_text(r[i])}" for r in rows]
        taken[kind] += agree(plan, lines)
    assert kinds_seen == {"text", "int", "bool", "decimal", "zoned"}
    assert all(taken[k] > 0 for k in kinds_seen), taken


def test_other_types_are_rendered_by_python() -> None:
    table, _rows = load_fixture()
    plan = EncodePlan(table, SETTINGS, "t")
    assert column_kinds(plan) is None  # float, date, arrays, …: not native
    assert copy_rows(plan, 0) is None


def test_decimal_modes_other_than_precise_are_python() -> None:
    table, _rows = load_fixture()
    numeric = next(c for c in table.columns if c.name == "c_numeric")
    sub = TableSchema(table.schema, table.table, (table.columns[0], numeric), ("id",), "d")
    for mode in (DecimalHandling.DOUBLE,):
        plan = EncodePlan(sub, SchemaSettings(decimal_handling_mode=mode), "t")
        assert column_kinds(plan) is None
    plan = EncodePlan(sub, SchemaSettings(decimal_handling_mode=DecimalHandling.STRING), "t")
    kinds = column_kinds(plan)
    assert kinds is None or kinds[1][0] != "decimal"


# --- generated rows ---------------------------------------------------------------------

INT8 = PgType(20, "int8", "b")
INT4 = PgType(23, "int4", "b")
TEXT = PgType(25, "text", "b")
BOOL = PgType(16, "bool", "b")
NUMERIC = PgType(1700, "numeric", "b")
TSTZ = PgType(1184, "timestamptz", "b")


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


COLUMNS = (
    Column("id", INT8, -1, False, True),
    Column("n", INT4, -1, True, False),
    Column("name", TEXT, -1, True, False),
    Column("ok", BOOL, -1, True, False),
    Column("amount", NUMERIC, numeric_typmod(12, 2), True, False),
    Column("whole", NUMERIC, numeric_typmod(38, 0), True, False),
    Column("tiny", NUMERIC, numeric_typmod(20, 9), True, False),
    Column("at", TSTZ, -1, True, False),
    Column("at3", TSTZ, 3, True, False),
    Column("must", TEXT, -1, False, False),  # NOT NULL: a null in it is filled
)
TABLE = TableSchema("public", "t", COLUMNS, ("id",), "d")


def decimal_text(scale: int, digits: int) -> st.SearchStrategy[str]:
    bound = 10**digits - 1
    return st.integers(-bound, bound).map(
        lambda u: format(Decimal(u).scaleb(-scale), "f") if scale else str(u)
    )


def tstz_text(t: dt.datetime) -> str:
    text = t.strftime("%Y-%m-%d %H:%M:%S")
    if t.microsecond:
        text += f".{t.microsecond:06d}".rstrip("0")
    return text + "+00"


TEXTS = st.one_of(
    st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",))),
    st.sampled_from(sorted(PLACEHOLDER_TEXTS)),
    st.sampled_from(["", "\\", "\t", "a\nb", '"q"', "\x01\x1f\x7f", "\u2028", "é"]),
)
VALUES = (
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.integers(-(2**31), 2**31 - 1).map(str),
    TEXTS,
    st.sampled_from(["t", "f"]),
    decimal_text(2, 12),
    st.one_of(decimal_text(0, 38), decimal_text(0, 1)),
    st.one_of(decimal_text(9, 20), st.sampled_from(["0.000000000", "-0.000000001"])),
    st.one_of(
        st.datetimes(dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31)).map(tstz_text),
        st.sampled_from(["infinity", "-infinity", "0044-03-15 00:00:00+00 BC"]),
    ),
    st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1)).map(tstz_text),
    TEXTS,
)


@st.composite
def lines(draw: Any) -> str:
    values = [draw(v) if i == 0 else draw(st.one_of(st.none(), v)) for i, v in enumerate(VALUES)]
    if draw(st.booleans()):
        values[-1] = draw(TEXTS)  # mostly not null, as PostgreSQL keeps it
    return "\t".join(copy_text(v) for v in values)


@given(st.lists(lines(), min_size=1, max_size=20))
@settings(max_examples=300, deadline=None)
def test_generated_rows(rows: list[str]) -> None:
    plan = EncodePlan(TABLE, SETTINGS, "t")
    agree(plan, rows)


def test_plain_rows_are_taken_and_folded_like_python() -> None:
    """A batch of lines: those taken are folded as Python folds them, the rest handed back
    in order, and the two together are Python's folds of the whole batch."""
    plan = EncodePlan(TABLE, SETTINGS, "t")
    plain = [
        f"{i}\t{i * 7}\tname {i}\t{'tf'[i % 2]}\t{i}.05\t{i}\t0.00000000{i % 10}"
        f"\t2026-11-30 12:00:0{i % 10}.5+00\t2026-11-30 12:00:00+00\tx"
        for i in range(1, 200)
    ]
    odd = ["500\t\\N\tback\\\\slash\tt\t1.00\t1\t0.000000001\t2026-11-30 12:00:00+00\t\\N\tx",
           "501\t1\tok\tt\t1.00\t1\t0.000000001\tinfinity\t\\N\tx",
           "502\t1\tok\tt\t1.00\t1\t0.000000001\t\\N\t\\N\t\\N"]  # fmt: skip
    batch = plain[:100] + odd + plain[100:]
    rows = copy_rows(plan, 0)
    left = rows.add("".join(line + "\n" for line in batch).encode())
    assert [line.decode() for line in left] == odd
    assert rows.rows == len(plain)
    docs = {}
    to_doc = document_converter(plan.envelope_schema_json)
    for line in plain:
        values = parse_copy_line(line)
        docs[values[0]] = to_doc(orjson.dumps(plan.json_row(values), default=json_default))
    assert rows.folds() == fold_docs(docs)


def test_decimal_forms() -> None:
    """``str(Decimal)``'s forms: plain, and scientific past six places after the point."""
    plan = EncodePlan(TABLE, SETTINGS, "t")
    rows = copy_rows(plan, 0)
    for tiny, form in [
        ("0.000000000", "0E-9"),
        ("0.000001000", "0.000001000"),
        ("0.000000100", "1.00E-7"),
        ("-0.000000001", "-1E-9"),
        ("12.000000000", "12.000000000"),
    ]:
        line = f"1\t\\N\t\\N\t\\N\t\\N\t\\N\t{tiny}\t\\N\t\\N\tx"
        got = rows.render_line(line.encode())
        assert got is not None
        assert orjson.loads(got[1])["tiny"] == form == str(Decimal(tiny))
