"""The declared search documents, ``[[search.documents]]`` in the config file (issue 33).

A document is a materialized view of a join, one per row of its root table, written to an
index of its own (``<index_prefix>-<name>``): the root's chosen fields, **lookups**
(many-to-one: the root's ``foreign_key`` column references one row of another table by
that table's key column ``references``; its fields embedded under the lookup's name) and
**nested** lists (one-to-many: every row of another table whose ``foreign_key`` column
holds the root's ``key``; its fields as a list under the list's name), with aggregates of
a nested list (``count(*)``, ``sum``, ``min``, ``max`` of one of its fields) beside it.

These models only read and check the declaration; :mod:`spark_jobs.document_specs` turns it
into the join core's :class:`spark_jobs.join.DocumentSpec`. Tables are not looked up here:
a joined table that is not captured (yet) is allowed, but every join names its columns.
What the join core does not do is refused with what it does: lookups of lookups, lists
inside lists, a list or a lookup holding aggregates it cannot compute, joins on several
columns, one table joined twice or the root joined to itself.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pgcdc.core.contract import MAX_INDEX_NAME_BYTES
from pgcdc.core.qualified_names import split_qualified

_FROZEN = ConfigDict(frozen=True, extra="forbid")

AggregateFunction = Literal["count", "sum", "min", "max"]
FUNCTIONS: Final[tuple[AggregateFunction, ...]] = ("count", "sum", "min", "max")

# What a document may be, said by every refusal of a shape the join core does not take.
SUPPORTED: Final = (
    "supported: lookups (many-to-one) and nested lists (one-to-many) of the root table, "
    "each joined on one column, aggregates on a nested list"
)

# A document's name is its index's last part: never a dot (every table index has one) nor a
# '-' (the watermark index and the next versions of an index have one).
_DOCUMENT_NAME: Final = re.compile(r"[a-z][a-z0-9_]*\Z")
_AGGREGATE: Final = re.compile(r"\s*(?P<function>\w+)\s*\((?P<column>.*)\)\s*\Z", re.S)


def parse_aggregate(text: str) -> tuple[AggregateFunction, str]:
    """``"sum(quantity)"`` -> ``("sum", "quantity")``, ``"count(*)"`` -> ``("count", "*")``;
    ValueError saying what is supported otherwise."""
    supported = "the aggregates are count(*), sum(column), min(column) and max(column)"
    m = _AGGREGATE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not function(column); {supported}")
    function, column = m.group("function").lower(), m.group("column").strip()
    if function not in FUNCTIONS:
        raise ValueError(f"{text!r}: {function} is not supported; {supported}")
    if function == "count" and column != "*":
        raise ValueError(
            f"{text!r}: count(*) counts the list's rows, counting a column's values is not "
            f"supported; {supported}"
        )
    if not column or (column == "*" and function != "count"):
        raise ValueError(f"{text!r}: {function} needs a column of the list; {supported}")
    return cast(AggregateFunction, function), column


def _column(v: str, what: str) -> str:
    if not v.strip():
        raise ValueError(f"{what} must name a column")
    return v


def _columns(v: tuple[str, ...]) -> tuple[str, ...]:
    if not v:
        raise ValueError("fields must list at least one column")
    for c in v:
        if not c.strip():
            raise ValueError("fields: an empty column name")
        if c == "*":
            raise ValueError("fields: list the columns ('*' is not supported)")
    seen = [c for i, c in enumerate(v) if c in v[:i]]
    if seen:
        raise ValueError(f"fields: {seen[0]!r} is listed twice")
    return v


def _member_name(v: str) -> str:
    """A name a lookup, a list or an aggregate takes in the document."""
    if not v or "." in v or v.startswith("_"):
        raise ValueError(
            f"name {v!r} must be a field name of the document: not empty, no '.', not "
            "starting with '_' (OpenSearch's own fields)"
        )
    return v


def _table(v: str) -> str:
    split_qualified(v)  # ValueError naming it
    return v


def _one_column(data: Any, keys: tuple[str, ...], where: str) -> None:
    """A join column given as a list: refused, joins are on one column."""
    if not isinstance(data, dict):
        return
    for key in keys:
        if isinstance(data.get(key), list | tuple):
            what = "a document's id" if key == "key" else "a join"
            raise ValueError(
                f"{where}{key} = {data[key]!r}: {what} on more than one column is not "
                f"supported, give one column; {SUPPORTED}"
            )


class LookupSettings(BaseModel):
    """Many-to-one: the root's ``foreign_key`` column holds the ``references`` (key) column
    of one row of ``table``, whose ``fields`` are embedded under ``name`` (null while no such
    row exists)."""

    model_config = _FROZEN

    name: str = Field(description="the field of the document the looked-up row goes under")
    table: str = Field(description="the looked-up table, schema.table")
    foreign_key: str = Field(
        description="the root table's column holding the key of the looked-up row"
    )
    references: str = Field(
        description="the looked-up table's key column (its primary key) that foreign_key holds"
    )
    fields: tuple[str, ...] = Field(description="the looked-up table's columns to embed")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _member_name(v)

    @field_validator("table")
    @classmethod
    def _qualified(cls, v: str) -> str:
        return _table(v)

    @field_validator("fields")
    @classmethod
    def _listed(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _columns(v)

    @field_validator("foreign_key", "references")
    @classmethod
    def _named(cls, v: str, info: ValidationInfo) -> str:
        return _column(v, str(info.field_name))


class NestedSettings(BaseModel):
    """One-to-many: every row of ``table`` whose ``foreign_key`` column holds the root's
    key, its ``fields`` as a list under ``name`` (in the order of that table's key), and
    ``aggregates`` of the list beside it on the document."""

    model_config = _FROZEN

    name: str = Field(description="the field of the document the list goes under")
    table: str = Field(description="the table of the list's rows, schema.table")
    foreign_key: str = Field(
        description="the list table's column holding the root's key (the document's id)"
    )
    fields: tuple[str, ...] = Field(description="the list table's columns to keep")
    # Name on the document -> "count(*)", "sum(column)", "min(column)" or "max(column)", the
    # column one of the list's fields.
    aggregates: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _member_name(v)

    @field_validator("table")
    @classmethod
    def _qualified(cls, v: str) -> str:
        return _table(v)

    @field_validator("fields")
    @classmethod
    def _listed(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _columns(v)

    @field_validator("foreign_key")
    @classmethod
    def _named(cls, v: str) -> str:
        return _column(v, "foreign_key")

    @field_validator("aggregates")
    @classmethod
    def _over_the_list(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        fields = info.data.get("fields")  # absent when the fields themselves are wrong
        for name, text in v.items():
            _member_name(name)
            function, column = parse_aggregate(text)
            if fields is not None and function != "count" and column not in fields:
                raise ValueError(
                    f"{name} = {text!r}: {column!r} is not one of the list's fields "
                    f"({', '.join(fields)}); an aggregate is over a column its nested list "
                    "keeps"
                )
        return v

    def parsed_aggregates(self) -> tuple[tuple[str, AggregateFunction, str], ...]:
        """Each aggregate as (name, function, column), in the declared order."""
        return tuple((name, *parse_aggregate(text)) for name, text in self.aggregates.items())


class DocumentSettings(BaseModel):
    """One declared document: ``[[search.documents]]``."""

    model_config = _FROZEN

    name: str = Field(
        description="the document's name: lower-case letters, digits and _; its index is "
        "<index_prefix>-<name>"
    )
    table: str = Field(description="the root table, schema.table: one document per row")
    key: str = Field(description="the root table's key column: the document's id")
    fields: tuple[str, ...] = Field(description="the root table's columns to keep")
    lookups: tuple[LookupSettings, ...] = ()
    nested: tuple[NestedSettings, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _supported_shape(cls, data: Any) -> Any:
        # Shapes the join core does not take, refused before their keys read as unknown.
        if not isinstance(data, dict):
            return data
        if "aggregates" in data:
            raise ValueError(
                "aggregates: a document's aggregates belong to one of its nested lists "
                f"([[search.documents.nested]] aggregates = {{...}}); {SUPPORTED}"
            )
        _one_column(data, ("key",), "")
        for kind, items in (("lookup", data.get("lookups")), ("nested", data.get("nested"))):
            for item in items if isinstance(items, list | tuple) else ():
                if not isinstance(item, dict):
                    continue
                where = f"{'lookups' if kind == 'lookup' else 'nested'}.{item.get('name', '?')}."
                inner = [k for k in ("lookups", "nested") if k in item]
                if inner:
                    what = "lookups of a lookup" if kind == "lookup" else "lists inside a list"
                    if kind != "lookup" and inner == ["lookups"]:
                        what = "lookups of a nested list's rows"
                    raise ValueError(f"{where}{inner[0]}: {what} are not supported; {SUPPORTED}")
                if kind == "lookup" and "aggregates" in item:
                    raise ValueError(
                        f"{where}aggregates: a lookup embeds one row and has no aggregates; "
                        f"{SUPPORTED}"
                    )
                _one_column(item, ("foreign_key", "references"), where)
        return data

    @field_validator("name")
    @classmethod
    def _index_name(cls, v: str) -> str:
        if _DOCUMENT_NAME.match(v):
            return v
        if "." in v:
            raise ValueError(
                f"{v!r} has a dot, as the index of a table does (<index_prefix>-schema.table): "
                "a document's name is lower-case letters, digits and _, starting with a letter "
                "(its index is <index_prefix>-<name>)"
            )
        raise ValueError(
            f"{v!r}: a document's name is lower-case letters, digits and _, starting with a "
            "letter (its index is <index_prefix>-<name>)"
        )

    @field_validator("table")
    @classmethod
    def _qualified(cls, v: str) -> str:
        return _table(v)

    @field_validator("fields")
    @classmethod
    def _listed(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _columns(v)

    @field_validator("key")
    @classmethod
    def _named(cls, v: str) -> str:
        return _column(v, "key")

    @model_validator(mode="after")
    def _one_join_per_table_and_one_field_per_name(self) -> DocumentSettings:
        root = split_qualified(self.table)
        joined: dict[tuple[str, str], str] = {}
        for where, table in [
            *((f"lookups.{lk.name}", lk.table) for lk in self.lookups),
            *((f"nested.{n.name}", n.table) for n in self.nested),
        ]:
            t = split_qualified(table)
            if t == root:
                raise ValueError(
                    f"{where}: joins the root table {self.table} to itself, which is not "
                    f"supported; {SUPPORTED}"
                )
            if t in joined:
                raise ValueError(
                    f"{where}: {table} is joined twice (also by {joined[t]}); a table is "
                    f"joined once per document; {SUPPORTED}"
                )
            joined[t] = where
        named: dict[str, str] = {}
        for where, member in [
            *((f"the root's field {f!r}", f) for f in self.fields),
            *((f"lookups.{lk.name}", lk.name) for lk in self.lookups),
            *((f"nested.{n.name}", n.name) for n in self.nested),
            *((f"nested.{n.name}.aggregates.{a}", a) for n in self.nested for a in n.aggregates),
        ]:
            if member in named:
                raise ValueError(
                    f"{where}: the document's field {member!r} also comes from "
                    f"{named[member]}; each field of a document has one source"
                )
            named[member] = where
        return self


def documents_from_text(v: Any) -> Any:
    """``CDC_SEARCH__DOCUMENTS``: the documents as a JSON list (a file gives them as TOML)."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except ValueError as e:
        raise ValueError(
            f"not a JSON list of documents ({e}); in the config file they are "
            "[[search.documents]] tables"
        ) from e


def check_documents(
    documents: tuple[DocumentSettings, ...], index_prefix: str
) -> tuple[DocumentSettings, ...]:
    """Across documents: one name each, and an index name OpenSearch takes."""
    seen: dict[str, int] = {}
    for i, doc in enumerate(documents):
        if doc.name in seen:
            raise ValueError(
                f"documents {seen[doc.name] + 1} and {i + 1} are both named {doc.name!r}: a "
                "document's name is its index, one per document"
            )
        seen[doc.name] = i
        index = f"{index_prefix.lower()}-{doc.name}"
        if len(index.encode()) > MAX_INDEX_NAME_BYTES:
            raise ValueError(
                f"document {doc.name!r}: its index {index[:40]}... is longer than OpenSearch's "
                f"{MAX_INDEX_NAME_BYTES} bytes"
            )
    return documents
