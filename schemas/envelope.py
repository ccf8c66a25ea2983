"""Debezium-compatible change events: key and value, as Connect JSON or Avro.

Everything that depends only on the table is computed once per table (a :class:`TablePlan`):
the Connect schemas, their JSON bytes, and one converter per column. Building an event is
then a loop over the row's values, a dict, and one ``orjson.dumps`` spliced after the
pre-serialised schema bytes.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

import cdc
from cdc.config import BinaryHandling, SchemaSettings, ValueFormat
from cdc.errors import SchemaError
from cdc.values import UNCHANGED_TOAST, RawValue
from schemas import oids
from schemas.model import SourceInfo, TableSchema, TransactionInfo
from schemas.names import record_name, topic_name
from schemas.typemap import (
    Codec,
    ConnectSchema,
    NonFiniteFloat,
    codec_for,
    connect_schema,
    with_field,
)

log = logging.getLogger(__name__)

CONNECTOR = "postgresql"
# Allowed values of source.snapshot (Debezium's SnapshotRecord enum).
SNAPSHOT_VALUES = (
    "true",
    "first",
    "first_in_data_collection",
    "last_in_data_collection",
    "last",
    "false",
    "incremental",
)
OPS = frozenset("crudt")

SOURCE_SCHEMA: ConnectSchema = connect_schema(
    "struct",
    False,
    name="io.debezium.connector.postgresql.Source",
    version=1,
    fields=[
        with_field(connect_schema("string", False), "version"),
        with_field(connect_schema("string", False), "connector"),
        with_field(connect_schema("string", False), "name"),
        with_field(connect_schema("int64", False), "ts_ms"),
        {
            **connect_schema(
                "string",
                True,
                name="io.debezium.data.Enum",
                version=1,
                parameters={"allowed": ",".join(SNAPSHOT_VALUES)},
            ),
            "default": "false",
            "field": "snapshot",
        },
        with_field(connect_schema("string", False), "db"),
        with_field(connect_schema("string", True), "sequence"),
        with_field(connect_schema("int64", True), "ts_us"),
        with_field(connect_schema("int64", True), "ts_ns"),
        with_field(connect_schema("string", False), "schema"),
        with_field(connect_schema("string", False), "table"),
        with_field(connect_schema("int64", True), "txId"),
        with_field(connect_schema("int64", True), "lsn"),
        with_field(connect_schema("int64", True), "xmin"),
    ],
)

TRANSACTION_SCHEMA: ConnectSchema = connect_schema(
    "struct",
    True,
    name="event.block",
    version=1,
    fields=[
        with_field(connect_schema("string", False), "id"),
        with_field(connect_schema("int64", False), "total_order"),
        with_field(connect_schema("int64", False), "data_collection_order"),
    ],
)


def json_default(obj: Any) -> Any:
    """orjson fallback: bytes as base64 and NaN/±Infinity as strings, like JsonConverter."""
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, NonFiniteFloat):
        return obj.json()
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, default=json_default)


def sequence(last_commit_lsn: int | None, lsn: int | None) -> str:
    """source.sequence: a JSON array of two strings (or nulls), as Debezium renders it."""
    a = "null" if last_commit_lsn is None else f'"{last_commit_lsn}"'
    b = "null" if lsn is None else f'"{lsn}"'
    return f"[{a},{b}]"


class TablePlan:
    """Everything about one table's events that does not change from row to row."""

    __slots__ = (
        "_fast_row",
        "avro",
        "binary",
        "codecs",
        "convert_items",
        "converters",
        "envelope_name",
        "envelope_schema",
        "envelope_schema_json",
        "identity_indexes",
        "key_indexes",
        "key_name",
        "key_names",
        "key_schema",
        "key_schema_json",
        "names",
        "placeholders",
        "table",
        "topic",
        "value_name",
        "value_schema",
    )

    def __init__(self, table: TableSchema, settings: SchemaSettings, prefix: str) -> None:
        self.table = table
        self.topic = topic_name(prefix, table.schema, table.table)
        self.codecs: tuple[Codec, ...] = tuple(codec_for(c, settings) for c in table.columns)
        self.names = tuple(c.name for c in table.columns)
        self.converters = tuple(c.convert for c in self.codecs)
        self.placeholders = tuple(c.placeholder for c in self.codecs)
        self.convert_items = tuple(
            (i, conv) for i, conv in enumerate(self.converters) if conv is not None
        )
        self.identity_indexes = tuple(i for i, conv in enumerate(self.converters) if conv is None)
        self._fast_row = self._compile_row()
        self.binary = tuple(
            _binary_converter(c.type.oid, c.type_modifier, settings, codec)
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
        self.key_name = record_name(prefix, table.schema, table.table, "Key")
        self.value_name = record_name(prefix, table.schema, table.table, "Value")
        self.envelope_name = record_name(prefix, table.schema, table.table, "Envelope")
        fields = [
            with_field(codec.schema, n) for n, codec in zip(self.names, self.codecs, strict=True)
        ]
        self.value_schema = connect_schema("struct", True, name=self.value_name, fields=fields)
        self.key_schema: ConnectSchema | None = None
        if self.key_indexes:
            key_fields = []
            for i in self.key_indexes:
                f = dict(fields[i])
                f["optional"] = False  # key columns are never null
                key_fields.append(f)
            self.key_schema = connect_schema("struct", False, name=self.key_name, fields=key_fields)
        self.envelope_schema = connect_schema(
            "struct",
            False,
            name=self.envelope_name,
            version=2,
            fields=[
                with_field(self.value_schema, "before"),
                with_field(self.value_schema, "after"),
                with_field(SOURCE_SCHEMA, "source"),
                with_field(TRANSACTION_SCHEMA, "transaction"),
                with_field(connect_schema("string", False), "op"),
                with_field(connect_schema("int64", True), "ts_ms"),
                with_field(connect_schema("int64", True), "ts_us"),
                with_field(connect_schema("int64", True), "ts_ns"),
            ],
        )
        self.envelope_schema_json = orjson.dumps(self.envelope_schema)
        self.key_schema_json = None if self.key_schema is None else orjson.dumps(self.key_schema)
        self.avro: Any = None  # built on first use by schemas.avro

    def row(self, values: Sequence[RawValue]) -> dict[str, Any]:
        """One row's Connect values, keyed by column name."""
        if len(values) != len(self.names):
            raise SchemaError(
                f"table {self.table.schema}.{self.table.table}: row has {len(values)} values "
                f"for {len(self.names)} columns"
            )
        try:
            return self._fast_row(values)
        except (SchemaError, ValueError, TypeError, ArithmeticError, IndexError):
            pass  # redo slowly to say which column failed
        vals = list(values)
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
        return dict(zip(self.names, vals, strict=True))

    def _compile_row(self) -> Callable[[Sequence[RawValue]], dict[str, Any]]:
        """A function made for this table: unpack the row, build the dict in one expression."""
        n = len(self.names)
        if n == 0:
            return lambda values: {}
        env: dict[str, Any] = {"S": self._special}
        items = []
        for i, (name, conv) in enumerate(zip(self.names, self.converters, strict=True)):
            v = f"v{i}"
            if conv is None:
                expr = f"{v} if {v}.__class__ is str else None if {v} is None else S({i}, {v})"
            else:
                env[f"c{i}"] = conv
                expr = (
                    f"c{i}({v}) if {v}.__class__ is str else None if {v} is None else S({i}, {v})"
                )
            items.append(f"{name!r}: ({expr})")
        unpack = ", ".join(f"v{i}" for i in range(n))
        src = f"def row(values):\n    {unpack}, = values\n    return {{{', '.join(items)}}}\n"
        exec(compile(src, f"<row {self.topic}>", "exec"), env)  # names are repr()-quoted
        fn: Callable[[Sequence[RawValue]], dict[str, Any]] = env["row"]
        return fn

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

    def _special(self, i: int, v: Any) -> Any:
        if v is UNCHANGED_TOAST:
            return self.placeholders[i]
        return self.binary[i](v)

    def _where(self, i: int) -> str:
        c = self.table.columns[i]
        return f"table {self.table.schema}.{self.table.table} column {c.name} ({c.type.name})"


def _binary_converter(
    oid: int, typmod: int, settings: SchemaSettings, codec: Codec
) -> Callable[[Any], Any]:
    """Converter for a value sent in binary format: only bytea's is its raw bytes."""
    del typmod

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


class EventEncoder:
    """Builds the Kafka key and value of change events for any number of tables."""

    def __init__(
        self,
        settings: SchemaSettings,
        topic_prefix: str,
        database: str,
        registry: Any = None,
    ) -> None:
        self.settings = settings
        self.topic_prefix = topic_prefix
        self.database = database
        self.server_name = settings.server_name or topic_prefix
        self.version = cdc.__version__
        self._plans: dict[int, TablePlan] = {}
        self._avro = settings.value_format is ValueFormat.AVRO
        self._schemas = settings.schemas_enable
        self._registry = registry
        if self._avro and registry is None and settings.registry_url:
            from schemas.registry import SchemaRegistryClient

            self._registry = SchemaRegistryClient(settings.registry_url)

    def plan(self, table: TableSchema) -> TablePlan:
        """The table's precomputed plan (cached by identity of the TableSchema object)."""
        plan = self._plans.get(id(table))
        if plan is None or plan.table is not table:
            plan = TablePlan(table, self.settings, self.topic_prefix)
            self._plans[id(table)] = plan
        return plan

    def topic(self, table: TableSchema) -> str:
        """``<prefix>.<schema>.<table>``."""
        return self.plan(table).topic

    def key_payload(self, table: TableSchema, row: Sequence[RawValue]) -> dict[str, Any] | None:
        """The key's Connect value, None when the table has no key columns."""
        plan = self.plan(table)
        if not plan.key_indexes:
            return None
        return plan.key(row)

    def encode_key(self, table: TableSchema, row: Sequence[RawValue]) -> bytes | None:
        """The record key; ``row`` is aligned with ``table.columns``."""
        plan = self.plan(table)
        if not plan.key_indexes:
            return None
        payload = plan.key(row)
        if self._avro:
            from schemas import avro

            return avro.encode_key(self, plan, payload)
        if not self._schemas:
            return _dumps(payload)
        assert plan.key_schema_json is not None
        return b'{"schema":' + plan.key_schema_json + b',"payload":' + _dumps(payload) + b"}"

    def value_payload(
        self,
        table: TableSchema,
        op: str,
        before: Sequence[RawValue] | None,
        after: Sequence[RawValue] | None,
        source: SourceInfo,
        transaction: TransactionInfo | None = None,
        now_ns: int | None = None,
    ) -> dict[str, Any]:
        """The envelope as a Connect value (dicts, bytes for BYTES)."""
        if op not in OPS:
            raise SchemaError(f"unknown operation {op!r}; expected one of c, r, u, d, t")
        if source.snapshot not in SNAPSHOT_VALUES:
            raise SchemaError(f"unknown source.snapshot {source.snapshot!r}")
        plan = self.plan(table)
        if now_ns is None:
            now_ns = time.time_ns()
        ts_us = source.ts_us
        tx = None
        if transaction is not None and self.settings.provide_transaction_metadata:
            tx = {
                "id": transaction.id,
                "total_order": transaction.total_order,
                "data_collection_order": transaction.data_collection_order,
            }
        return {
            "before": None if before is None else plan.row(before),
            "after": None if after is None else plan.row(after),
            "source": {
                "version": self.version,
                "connector": CONNECTOR,
                "name": self.server_name,
                "ts_ms": ts_us // 1000,
                "snapshot": source.snapshot,
                "db": self.database,
                "sequence": sequence(source.last_commit_lsn, source.lsn),
                "ts_us": ts_us,
                "ts_ns": ts_us * 1000,
                "schema": table.schema,
                "table": table.table,
                "txId": source.txid,
                "lsn": source.lsn,
                "xmin": None,
            },
            "transaction": tx,
            "op": op,
            "ts_ms": now_ns // 1_000_000,
            "ts_us": now_ns // 1000,
            "ts_ns": now_ns,
        }

    def encode_value(
        self,
        table: TableSchema,
        op: str,
        before: Sequence[RawValue] | None,
        after: Sequence[RawValue] | None,
        source: SourceInfo,
        transaction: TransactionInfo | None = None,
    ) -> bytes:
        """The record value of a c/r/u/d event."""
        payload = self.value_payload(table, op, before, after, source, transaction)
        return self._encode_envelope(self.plan(table), payload)

    def encode_truncate(self, table: TableSchema, source: SourceInfo) -> bytes:
        """The record value of a truncate (``op: "t"``) event; it has no key."""
        payload = self.value_payload(table, "t", None, None, source)
        return self._encode_envelope(self.plan(table), payload)

    def _encode_envelope(self, plan: TablePlan, payload: dict[str, Any]) -> bytes:
        if self._avro:
            from schemas import avro

            return avro.encode_value(self, plan, payload)
        if not self._schemas:
            return _dumps(payload)
        return b'{"schema":' + plan.envelope_schema_json + b',"payload":' + _dumps(payload) + b"}"
