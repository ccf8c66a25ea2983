"""What the event format needs to know about a table, a change and its transaction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PgType:
    """A PostgreSQL type as resolved from pg_catalog."""

    oid: int
    name: str  # typname, e.g. "int4", "numeric", "my_enum", "_int4"
    kind: str  # pg_type.typtype: "b" base, "e" enum, "d" domain, "r" range, "c", "m", "p"
    element: PgType | None = None  # for arrays
    base: PgType | None = None  # for domains
    enum_values: tuple[str, ...] = ()
    # A domain's own modifier (pg_type.typtypmod), e.g. numeric(10,2) for a money-like domain.
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: PgType
    type_modifier: int  # atttypmod (-1 when none)
    optional: bool  # nullable
    part_of_key: bool
    # The column's DEFAULT as pg_get_expr renders it (None: no default), for the value
    # schema's "default" the way Debezium derives it.
    default: str | None = None
    # Declared array dimensions (pg_attribute.attndims; 0 for a non-array or undeclared).
    dims: int = 0


@dataclass(frozen=True, slots=True)
class TableSchema:
    schema: str
    table: str
    columns: tuple[Column, ...]
    key_columns: tuple[str, ...]  # primary key, else replica identity index columns, else ()
    replica_identity: str  # "d" default, "f" full, "i" index, "n" nothing


@dataclass(frozen=True, slots=True)
class SourceInfo:
    ts_us: int  # commit time (streaming) or read time (snapshot), µs since epoch
    snapshot: str  # "false", "true", "first", "last", ...
    txid: int | None
    lsn: int | None  # this change's LSN; rendered as a number like Debezium
    last_commit_lsn: int | None  # for `sequence`


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    id: str
    total_order: int
    data_collection_order: int
