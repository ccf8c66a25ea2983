"""A table's encode plan: everything about its events that does not change from row to row.

The Connect schemas (and their JSON bytes), one converter per column, and the row and key
functions generated for the table (:mod:`schemas.rowfuncs`). Not to be confused with the
snapshotter's per-table read plan in ``cdc.snapshot``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from pgcdc.core.contract import table_topic
from pgcdc.core.errors import SchemaError
from pgcdc.core.settings import BinaryHandling, SchemaSettings
from pgcdc.core.values import UNCHANGED_TOAST, RawValue
from schemas import oids
from schemas.column_defaults import fallback, schema_default
from schemas.connect import Codec, ConnectSchema, NonFiniteFloat, connect_schema, with_field
from schemas.debezium import envelope_schema
from schemas.model import Column, TableSchema
from schemas.names import record_name
from schemas.rowfuncs import Fill, KeyColumnNull, KeyFromRow, RowCompiler, RowFunction
from schemas.typemap import codec_for, is_unknown, resolve_domain

# What a generated function raises on a value it cannot take; the slow path then explains.
FAST_PATH_ERRORS = (SchemaError, ValueError, TypeError, ArithmeticError, IndexError)
_FAST_KEY_ERRORS = (KeyColumnNull, *FAST_PATH_ERRORS)


class EncodePlan:
    """Everything about one table's events that does not change from row to row.

    Rows are converted by functions generated for the table (one dict expression, the
    common types inlined), in two flavours: Connect values (``row``, bytes for BYTES, used
    by Avro and ``value_payload``) and JSON-ready values (``json_row``, BYTES already as
    base64 text, used by the JSON encoders). Both give way to a slow, column-by-column path
    that names the failing column when anything goes wrong. The generated functions
    themselves (``fast_*``) raise on anything unusual and are for callers that inline the
    fallback on their hot path.
    """

    __slots__ = (
        "avro",
        "binary",
        "codecs",
        "convert_items",
        "converters",
        "envelope_name",
        "envelope_schema",
        "envelope_schema_fragment",
        "envelope_schema_json",
        "fast_json_key",
        "fast_json_row",
        "fast_key_from_row",
        "fast_row",
        "fills",
        "identity_indexes",
        "key_indexes",
        "key_name",
        "key_names",
        "key_schema",
        "key_schema_fragment",
        "key_schema_json",
        "names",
        "placeholders",
        "table",
        "topic",
        "value_indexes",
        "value_name",
        "value_names",
        "value_schema",
    )

    def __init__(self, table: TableSchema, settings: SchemaSettings, prefix: str) -> None:
        self.table = table
        self.topic = table_topic(prefix, table.schema, table.table)
        where = f"{table.schema}.{table.table}"
        self.codecs: tuple[Codec, ...] = tuple(codec_for(c, settings, where) for c in table.columns)
        self.names = tuple(c.name for c in table.columns)
        self.converters = tuple(c.convert for c in self.codecs)
        self.placeholders = tuple(c.placeholder for c in self.codecs)
        self.convert_items = tuple(
            (i, conv) for i, conv in enumerate(self.converters) if conv is not None
        )
        self.identity_indexes = tuple(i for i, conv in enumerate(self.converters) if conv is None)
        self.binary = tuple(
            _binary_converter(c.type.oid, settings, codec)
            for c, codec in zip(table.columns, self.codecs, strict=True)
        )
        index = {n: i for i, n in enumerate(self.names)}
        missing = [k for k in table.key_columns if k not in index]
        if missing:
            raise SchemaError(
                f"table {table.schema}.{table.table}: key columns {missing} are not columns"
            )
        self.key_indexes = tuple(index[k] for k in table.key_columns)
        self.key_names = table.key_columns
        # The columns the row images carry: all, or (include_unknown_datatypes false, as
        # Debezium's default) all but those of unmapped types. Key columns always stay.
        self.value_indexes = tuple(
            i
            for i, (c, codec) in enumerate(zip(table.columns, self.codecs, strict=True))
            if settings.include_unknown_datatypes or c.part_of_key or not is_unknown(codec.schema)
        )
        self.value_names = tuple(self.names[i] for i in self.value_indexes)
        self.fills = tuple(
            _fill(c, codec) for c, codec in zip(table.columns, self.codecs, strict=True)
        )
        compiler = RowCompiler(
            self.names, self.codecs, self._special, self.topic, self.fills, self.value_indexes
        )
        self.fast_row: RowFunction = compiler.row(json=False)
        self.fast_json_row: RowFunction = compiler.row(json=True)
        self.fast_json_key: RowFunction = compiler.key(self.key_indexes)
        self.fast_key_from_row: KeyFromRow = compiler.key_from_row(self.key_indexes)
        self.key_name = record_name(prefix, table.schema, table.table, "Key")
        self.value_name = record_name(prefix, table.schema, table.table, "Value")
        self.envelope_name = record_name(prefix, table.schema, table.table, "Envelope")
        fields = [
            _field_schema(c, codec) for c, codec in zip(table.columns, self.codecs, strict=True)
        ]
        self.value_schema = connect_schema(
            "struct", True, name=self.value_name, fields=[fields[i] for i in self.value_indexes]
        )
        self.key_schema: ConnectSchema | None = None
        if self.key_indexes:
            key_fields = []
            for i in self.key_indexes:
                f = dict(fields[i])
                f["optional"] = False  # key columns are never null
                key_fields.append(f)
            self.key_schema = connect_schema("struct", False, name=self.key_name, fields=key_fields)
        self.envelope_schema = envelope_schema(self.envelope_name, self.value_schema)
        self.envelope_schema_json = orjson.dumps(self.envelope_schema)
        self.key_schema_json = None if self.key_schema is None else orjson.dumps(self.key_schema)
        # Spliced verbatim into each event by orjson (same bytes as the schema dumped again).
        self.envelope_schema_fragment = orjson.Fragment(self.envelope_schema_json)
        self.key_schema_fragment = (
            None if self.key_schema_json is None else orjson.Fragment(self.key_schema_json)
        )
        self.avro: Any = None  # built on first use by schemas.avro.avro_plan

    def row(self, values: Sequence[RawValue]) -> dict[str, Any]:
        """One row's Connect values, keyed by column name."""
        if len(values) != len(self.names):
            raise self._width_error(values)
        try:
            return self.fast_row(values)
        except FAST_PATH_ERRORS:
            pass  # redo slowly to say which column failed
        return self._slow_row(values)

    def json_row(self, values: Sequence[RawValue]) -> dict[str, Any]:
        """One row's values ready for ``orjson.dumps(..., default=json_default)``.

        The same JSON as :meth:`row`'s dict gives, only with fewer fallbacks to
        ``json_default`` (top-level BYTES values are base64 text already).
        """
        if len(values) != len(self.names):
            raise self._width_error(values)
        try:
            return self.fast_json_row(values)
        except FAST_PATH_ERRORS:
            pass  # the slow path names the failing column (or gives the same JSON)
        return self._slow_row(values)

    def json_key(self, values: Sequence[RawValue]) -> dict[str, Any]:
        """The key columns' values ready for JSON (only those are converted)."""
        try:
            return self.fast_json_key(values)
        except _FAST_KEY_ERRORS:
            pass
        return self.key(values)

    def json_key_from_row(
        self, converted: dict[str, Any], values: Sequence[RawValue]
    ) -> dict[str, Any]:
        """The key, taken from a row :meth:`json_row` already converted (``values`` is that
        row, used only when a key column is null, to raise the usual error)."""
        try:
            return self.fast_key_from_row(converted)
        except KeyColumnNull:
            return self.key(values)  # raises: a key column is null

    def key(self, values: Sequence[RawValue]) -> dict[str, Any]:
        """The key columns' Connect values (only those are converted)."""
        out: dict[str, Any] = {}
        for i in self.key_indexes:
            v = values[i]
            conv = self.converters[i]
            try:
                if v.__class__ is str:
                    out[self.names[i]] = v if conv is None else conv(v)
                elif v is None:
                    raise SchemaError("a key column is null")
                else:
                    out[self.names[i]] = self._special(i, v)
            except SchemaError as e:
                raise SchemaError(f"{self._where(i)}: {e}") from e
            except (ValueError, TypeError, ArithmeticError, IndexError) as e:
                raise SchemaError(f"{self._where(i)}: cannot convert {v!r}: {e}") from e
        return out

    def _width_error(self, values: Sequence[RawValue]) -> SchemaError:
        return SchemaError(
            f"table {self.table.schema}.{self.table.table}: row has {len(values)} values "
            f"for {len(self.names)} columns"
        )

    def _slow_row(self, values: Sequence[RawValue]) -> dict[str, Any]:
        vals = list(values)
        for i, fill in enumerate(self.fills):
            if fill is not None and vals[i] is None:
                vals[i] = fill.value
        i = -1
        try:
            for i, conv in self.convert_items:
                v = vals[i]
                if v.__class__ is str:
                    vals[i] = conv(v)
                elif v is not None:
                    vals[i] = self._special(i, v)
            for i in self.identity_indexes:
                v = vals[i]
                if v.__class__ is not str and v is not None:
                    vals[i] = self._special(i, v)
        except SchemaError as e:
            raise SchemaError(f"{self._where(i)}: {e}") from e
        except (ValueError, TypeError, ArithmeticError, IndexError) as e:
            raise SchemaError(f"{self._where(i)}: cannot convert {values[i]!r}: {e}") from e
        return {self.names[i]: vals[i] for i in self.value_indexes}

    def _special(self, i: int, v: Any) -> Any:
        """A value that is not text: an unchanged TOAST marker or a binary-format value."""
        if v is UNCHANGED_TOAST:
            return self.placeholders[i]
        return self.binary[i](v)

    def _where(self, i: int) -> str:
        c = self.table.columns[i]
        return f"table {self.table.schema}.{self.table.table} column {c.name} ({c.type.name})"


def _json_ready(value: Any) -> Any:
    """A Connect value as JSON carries it at the top of a row (BYTES as base64 text)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, NonFiniteFloat):
        return value.json()
    return value


def _field_schema(column: Column, codec: Codec) -> ConnectSchema:
    """The column's schema in the row struct, with its default when Debezium gives one."""
    has_default, default = schema_default(column, codec)
    if not has_default:
        return with_field(codec.schema, column.name)
    out = dict(codec.schema)
    out["default"] = _json_ready(default)
    out["field"] = column.name
    return out


def _fill(column: Column, codec: Codec) -> Fill | None:
    """What a null becomes in a NOT NULL column: a row that does not carry the column (the
    old row of a delete under REPLICA IDENTITY DEFAULT) gets its default or its type's zero,
    as Debezium writes it; Kafka Connect refuses a null in a required field. Key columns
    are always carried (and a null key is an error)."""
    if column.optional or column.part_of_key:
        return None
    has_default, default = schema_default(column, codec)
    value = default if has_default else fallback(codec, resolve_domain(column.type, -1)[0].name)
    return Fill(value, _json_ready(value))


def _binary_converter(oid: int, settings: SchemaSettings, codec: Codec) -> Callable[[Any], Any]:
    """Converter for a value sent in binary format: only bytea's is its raw bytes."""

    def bytea(v: Any) -> Any:
        raw = bytes(v)
        if settings.binary_handling_mode is BinaryHandling.BASE64:
            return base64.b64encode(raw).decode("ascii")
        if settings.binary_handling_mode is BinaryHandling.HEX:
            return raw.hex()
        return raw

    def unsupported(v: Any) -> Any:
        raise SchemaError(
            f"binary-format value ({len(v)} bytes) for type {codec.schema.get('type')}: "
            "only text format is supported for this type"
        )

    return bytea if oid == oids.BYTEA else unsupported
