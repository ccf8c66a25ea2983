"""One rule for arrays whose dimensions differ from their column's declaration.

PostgreSQL does not enforce declared array dimensions (``text[]`` and ``text[][]`` are one
type; ``attndims`` only records the declaration), but a Connect schema is one per column. The
schema nests as deep as the declaration says (at least one level) and every value is written
at that depth: more dimensions merge the outer ones (row-major), fewer add outer ones of
length 1, ``{}`` stays empty. The same shape in a column that declares it keeps it.
"""

from __future__ import annotations

import logging

import pytest

from pgcdc.core.settings import SchemaSettings
from schemas import oids
from schemas.model import Column, PgType
from schemas.typemap import array_ndims, codec_for, fit_dims

pytestmark = pytest.mark.unit

TEXT = PgType(oids.TEXT, "text", "b")
INT4 = PgType(oids.INT4, "int4", "b")


def _codec(element: PgType, dims: int, table: str = "public.t") -> object:
    array = PgType(1009 if element is TEXT else 1007, f"_{element.name}", "b", element=element)
    return codec_for(Column("c", array, -1, True, False, dims=dims), SchemaSettings(), table)


def _convert(element: PgType, dims: int, text: str) -> object:
    codec = _codec(element, dims)
    assert codec.convert is not None  # type: ignore[attr-defined]
    return codec.convert(text)  # type: ignore[attr-defined]


def _depth(element: PgType, dims: int) -> int:
    schema = _codec(element, dims).schema  # type: ignore[attr-defined]
    depth = 0
    while schema.get("type") == "array":
        depth, schema = depth + 1, schema["items"]
    return depth


@pytest.mark.parametrize(
    ("dims", "text", "expected"),
    [
        # The case: {{a,b},{c,d}} in a column declared 1-D, and the same in [][].
        (1, "{{a,b},{c,d}}", ["a", "b", "c", "d"]),
        (2, "{{a,b},{c,d}}", [["a", "b"], ["c", "d"]]),
        # Undeclared (attndims 0, e.g. CREATE TABLE AS): one level, like 1.
        (0, "{{a,b},{c,d}}", ["a", "b", "c", "d"]),
        # Fewer dimensions than declared: an outer dimension of length 1.
        (2, "{a,NULL}", [["a", None]]),
        (3, "{a,b}", [[["a", "b"]]]),
        # More: the outer dimensions merge, the innermost rows stay.
        (2, "{{{a,b},{c,d}},{{e,f},{g,h}}}", [["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]]),
        (1, "{{{a,b}},{{c,d}}}", ["a", "b", "c", "d"]),
        # Exact, and empty.
        (1, "{a,b}", ["a", "b"]),
        (2, "{}", []),
        (1, "{}", []),
    ],
)
def test_a_value_is_written_at_the_declared_depth(dims: int, text: str, expected: object) -> None:
    assert _convert(TEXT, dims, text) == expected
    assert _depth(TEXT, dims) == max(1, dims)


def test_elements_are_converted_whatever_the_reshaping() -> None:
    assert _convert(INT4, 1, "{{1,2},{3,NULL}}") == [1, 2, 3, None]
    assert _convert(INT4, 2, "{5,6}") == [[5, 6]]
    assert _convert(INT4, 2, "[0:1][1:2]={{1,2},{3,4}}") == [[1, 2], [3, 4]]


def test_a_reshaped_value_is_named_once_with_the_way_to_keep_its_shape(
    caplog: pytest.LogCaptureFixture,
) -> None:
    codec = _codec(TEXT, 1, "public.warned")  # a column of its own: warned once per process
    with caplog.at_level(logging.WARNING, logger="schemas.typemap"):
        for _ in range(3):
            codec.convert("{{x,y},{z,w}}")  # type: ignore[attr-defined]
        codec.convert("{x,y}")  # type: ignore[attr-defined]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "public.warned.c is declared with 1 array dimension(s)" in warnings[0]
    assert "2-dimensional" in warnings[0] and "TYPE <type>[][]" in warnings[0]


def test_ndims_and_fit() -> None:
    assert [array_ndims(v) for v in ([], ["a"], [["a"]], [[["a"]]])] == [0, 1, 2, 3]
    assert fit_dims([["a", "b"], ["c", "d"]], 2, 1) == ["a", "b", "c", "d"]
    assert fit_dims(["a"], 1, 3) == [[["a"]]]
