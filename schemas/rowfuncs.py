"""Row and key functions generated for one table: the reader's per-event hot path.

Each function unpacks a row and builds its dict in one expression, with the common
converters inlined. They raise on anything unusual (a bad value, a wrong width, a null key)
and their caller, :class:`schemas.plan.EncodePlan`, redoes the row column by column to name
the failing column, so the generated code never needs to explain an error itself.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from pgcdc.core.values import RawValue
from schemas.connect import Codec, NonFiniteFloat
from schemas.convert import EPOCH_ORDINAL, to_bool, to_epoch_days, to_float

RowFunction = Callable[[Sequence[RawValue]], dict[str, Any]]
KeyFromRow = Callable[[dict[str, Any]], dict[str, Any]]
# (column index, a value that is neither text nor None) → its Connect value.
SpecialValue = Callable[[int, Any], Any]


@dataclass(frozen=True, slots=True)
class Fill:
    """What a null of a column becomes: as a Connect value, and ready for JSON."""

    value: Any
    json: Any


class KeyColumnNull(Exception):
    """A key column is null (or not text): the plan's slow path raises the clear SchemaError."""


class RowCompiler:
    """Writes and compiles one table's row and key functions.

    Column names are ``repr()``-quoted into the source and converters are passed in the
    function's globals, never as text.
    """

    def __init__(
        self,
        names: Sequence[str],
        codecs: Sequence[Codec],
        special: SpecialValue,
        label: str,
        fills: Sequence[Fill | None] = (),
        kept: Sequence[int] | None = None,
    ) -> None:
        self._names = tuple(names)
        self._codecs = tuple(codecs)
        self._converters = tuple(c.convert for c in codecs)
        self._special = special
        self._label = label  # names the generated code in tracebacks
        # What a null becomes per column (None: it stays null).
        self._fills = tuple(fills) or (None,) * len(self._names)
        # The columns a row carries (None: all); the others are unpacked and ignored.
        self._kept = frozenset(range(len(self._names)) if kept is None else kept)

    def row(self, *, json: bool) -> RowFunction:
        """All columns: Connect values, or JSON-ready ones (BYTES as base64 text)."""
        n = len(self._names)
        if n == 0:
            return lambda values: {}
        env: dict[str, Any] = {"S": self._special}
        items = []
        for i, name in enumerate(self._names):
            if i not in self._kept:
                continue
            v = f"v{i}"
            text = self._text_expr(i, v, json, env)
            null = "None"
            fill = self._fills[i]
            if fill is not None:
                env[f"F{i}"] = fill.json if json else fill.value
                null = f"F{i}"
            expr = f"{text} if {v}.__class__ is str else {null} if {v} is None else S({i}, {v})"
            items.append(f"{name!r}: ({expr})")
        unpack = ", ".join(f"v{i}" for i in range(n))
        src = f"def row(values):\n    {unpack}, = values\n    return {{{', '.join(items)}}}\n"
        fn: RowFunction = self._exec(src, "row", env)
        return fn

    def key(self, key_indexes: Sequence[int]) -> RowFunction:
        """Key columns only, JSON-ready; anything but text raises :class:`KeyColumnNull`."""
        env: dict[str, Any] = {"KeyNull": KeyColumnNull}
        lines = ["def key(values):"]
        items = []
        for i in key_indexes:
            v = f"v{i}"
            lines.append(f"    {v} = values[{i}]")
            lines.append(f"    if {v}.__class__ is not str: raise KeyNull")
            items.append(f"{self._names[i]!r}: {self._text_expr(i, v, True, env)}")
        lines.append(f"    return {{{', '.join(items)}}}")
        fn: RowFunction = self._exec("\n".join(lines) + "\n", "key", env)
        return fn

    def key_from_row(self, key_indexes: Sequence[int]) -> KeyFromRow:
        """The key taken from a converted row; a null key column raises KeyColumnNull."""
        env: dict[str, Any] = {"KeyNull": KeyColumnNull}
        lines = ["def key(row):"]
        items = []
        for j, i in enumerate(key_indexes):
            lines.append(f"    k{j} = row[{self._names[i]!r}]")
            lines.append(f"    if k{j} is None: raise KeyNull")
            items.append(f"{self._names[i]!r}: k{j}")
        lines.append(f"    return {{{', '.join(items)}}}")
        fn: KeyFromRow = self._exec("\n".join(lines) + "\n", "key", env)
        return fn

    def _text_expr(self, i: int, v: str, json: bool, env: dict[str, Any]) -> str:
        """Source of the expression converting text ``v`` of column ``i``."""
        conv = self._converters[i]
        if conv is None:
            return v
        if conv is int or conv is float:
            return f"{conv.__name__}({v})"
        if conv is to_bool:  # output function's t/f inline; anything else takes the checks
            env["B"] = to_bool
            return f"(True if {v} == 't' else False if {v} == 'f' else B({v}))"
        env[f"c{i}"] = conv
        if conv is to_float:  # to_float inline: finite floats as they are
            env["NF"] = NonFiniteFloat
            return f"(f if (f := float({v})) - f == 0 else NF(f))"
        if conv is to_epoch_days:
            # to_epoch_days' fast path inline; a value it refuses raises ValueError, and the
            # row is redone by the slow path, which runs the full converter.
            env["fromiso"] = date.fromisoformat
            return (
                f"(fromiso({v}).toordinal() - {EPOCH_ORDINAL} "
                f"if len({v}) == 10 and {v}[4] == '-' and {v}[7] == '-' else c{i}({v}))"
            )
        if json and self._codecs[i].schema["type"] == "bytes":
            env["b2a"] = binascii.b2a_base64
            return f"b2a(c{i}({v}), newline=False).decode()"  # base64 without a call frame
        return f"c{i}({v})"

    def _exec(self, src: str, name: str, env: dict[str, Any]) -> Any:
        exec(compile(src, f"<{name} {self._label}>", "exec"), env)
        return env[name]
