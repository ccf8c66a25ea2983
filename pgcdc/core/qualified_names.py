"""Qualified names (``schema.table``, ``schema.function``): the one rule every setting, signal
and command that names a table or a function reads them by.

Quoting is PostgreSQL's: a part in double quotes is taken as it stands, dots, commas and
white space included, with ``""`` for a quote (``"my.schema"."Or""ders"`` is
``my.schema`` and ``Or"ders``); a quote encloses a whole part or none of it. Unquoted parts
are kept as written without the white space around them: PostgreSQL would fold them to
lower case, but names here are compared as the catalog spells them (Debezium's rule). An
empty part is refused.
"""

from __future__ import annotations


def _cut(text: str, sep: str, what: str) -> list[str]:
    """``text`` cut at every ``sep`` outside double quotes; the pieces keep their quotes."""
    pieces: list[str] = []
    start, quoted = 0, False
    for i, c in enumerate(text):
        if c == '"':
            quoted = not quoted  # "" inside a quoted part closes and reopens it at once
        elif c == sep and not quoted:
            pieces.append(text[start:i])
            start = i + 1
    if quoted:
        raise ValueError(f"{what} {text!r}: unterminated quote")
    pieces.append(text[start:])
    return pieces


def _part(piece: str, name: str, what: str) -> str:
    """One part of ``name`` as the catalog spells it."""
    p = piece.strip()
    if p.startswith('"'):
        inner = p[1:-1]
        if len(p) < 2 or not p.endswith('"') or '"' in inner.replace('""', ""):
            raise ValueError(f"{what} {name!r}: a quote must enclose a whole part")
        return inner.replace('""', '"')
    if '"' in p:
        raise ValueError(f"{what} {name!r}: a quote must enclose a whole part")
    return p


def split_name(name: str, what: str = "table") -> list[str]:
    """The parts of a possibly qualified name: ``public.orders`` -> [public, orders],
    ``"my.schema"."T"`` -> [my.schema, T]; ValueError (naming it a ``what``) if a quote is
    misplaced or a part is empty."""
    parts = [_part(p, name, what) for p in _cut(name, ".", what)]
    if not all(parts):
        raise ValueError(f"{what} {name!r} must be written as schema.{what}")
    return parts


def split_qualified(name: str, what: str = "table") -> tuple[str, str]:
    """``(schema, name)`` of ``schema.name``; ValueError unless it has exactly two parts."""
    parts = split_name(name, what)
    if len(parts) != 2:
        raise ValueError(f"{what} {name!r} must be written as schema.{what}")
    return (parts[0], parts[1])


def split_list(text: str) -> tuple[str, ...]:
    """The entries of a comma-separated list, as written (white space around them dropped,
    empty ones left out); a comma inside double quotes belongs to its name."""
    return tuple(p.strip() for p in _cut(text, ",", "list") if p.strip())


def _quoted(part: str) -> str:
    """``part`` in quotes when it needs them to read back as itself (a dot, a comma, a
    quote, white space around it)."""
    if any(c in part for c in '.,"') or part != part.strip():
        return '"' + part.replace('"', '""') + '"'
    return part


def quote_table(table: tuple[str, str]) -> str:
    """``schema.table`` as :func:`split_qualified` reads it back: ``("a.b", "t")`` ->
    ``"a.b".t``; a part is quoted only when it must be."""
    return f"{_quoted(table[0])}.{_quoted(table[1])}"
