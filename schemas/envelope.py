"""Debezium-compatible change events: key and value, as Connect JSON or Avro.

Everything that depends only on the table is computed once per table (a :class:`TablePlan`):
the Connect schemas, their JSON bytes, and one converter per column. Building an event is
then a loop over the row's values, a dict, and one ``orjson.dumps`` spliced after the
pre-serialised schema bytes.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any

import orjson

import pgcdc
from pgcdc.core.contract import table_topic
from pgcdc.core.errors import SchemaError
from pgcdc.core.settings import BinaryHandling, SchemaSettings, ValueFormat
from pgcdc.core.values import UNCHANGED_TOAST, RawValue
from schemas import oids
from schemas.connect import Codec, ConnectSchema, NonFiniteFloat, connect_schema, with_field
from schemas.convert import EPOCH_ORDINAL, to_bool, to_epoch_days, to_float
from schemas.model import SourceInfo, TableSchema, TransactionInfo
from schemas.names import record_name
from schemas.typemap import codec_for

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
_SNAPSHOT_SET = frozenset(SNAPSHOT_VALUES)
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


class _KeyNull(Exception):
    """Internal: a key column is null; the slow path raises the clear SchemaError."""


def sequence(last_commit_lsn: int | None, lsn: int | None) -> str:
    """source.sequence: a JSON array of two strings (or nulls), as Debezium renders it."""
    a = "null" if last_commit_lsn is None else f'"{last_commit_lsn}"'
    b = "null" if lsn is None else f'"{lsn}"'
    return f"[{a},{b}]"


class TablePlan:
    """Everything about one table's events that does not change from row to row.

    Rows are converted by functions generated for the table (one dict expression, the
    common types inlined), in two flavours: Connect values (``row``, bytes for BYTES, used
    by Avro and ``value_payload``) and JSON-ready values (``json_row``, BYTES already as
    base64 text, used by the JSON encoders). Both give way to a slow, column-by-column path
    that names the failing column when anything goes wrong.
    """

    __slots__ = (
        "_fast_row",
        "_json_key",
        "_json_row",
        "_key_from_row",
        "avro",
        "binary",
        "codecs",
        "convert_items",
        "converters",
        "envelope_name",
        "envelope_schema",
        "envelope_schema_fragment",
        "envelope_schema_json",
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
        "value_name",
        "value_schema",
    )

    def __init__(self, table: TableSchema, settings: SchemaSettings, prefix: str) -> None:
        self.table = table
        self.topic = table_topic(prefix, table.schema, table.table)
        self.codecs: tuple[Codec, ...] = tuple(codec_for(c, settings) for c in table.columns)
        self.names = tuple(c.name for c in table.columns)
        self.converters = tuple(c.convert for c in self.codecs)
        self.placeholders = tuple(c.placeholder for c in self.codecs)
        self.convert_items = tuple(
            (i, conv) for i, conv in enumerate(self.converters) if conv is not None
        )
        self.identity_indexes = tuple(i for i, conv in enumerate(self.converters) if conv is None)
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
        self._fast_row = self._compile_row(json=False)
        self._json_row = self._compile_row(json=True)
        self._json_key = self._compile_key()
        self._key_from_row = self._compile_key_from_row()
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
        # Spliced verbatim into each event by orjson (same bytes as the schema dumped again).
        self.envelope_schema_fragment = orjson.Fragment(self.envelope_schema_json)
        self.key_schema_fragment = (
            None if self.key_schema_json is None else orjson.Fragment(self.key_schema_json)
        )
        self.avro: Any = None  # built on first use by schemas.avro

    def row(self, values: Sequence[RawValue]) -> dict[str, Any]:
        """One row's Connect values, keyed by column name."""
        if len(values) != len(self.names):
            raise self._width_error(values)
        try:
            return self._fast_row(values)
        except (SchemaError, ValueError, TypeError, ArithmeticError, IndexError):
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
            return self._json_row(values)
        except (SchemaError, ValueError, TypeError, ArithmeticError, IndexError):
            pass  # the slow path names the failing column (or gives the same JSON)
        return self._slow_row(values)

    def json_key(self, values: Sequence[RawValue]) -> dict[str, Any]:
        """The key columns' values ready for JSON (only those are converted)."""
        try:
            return self._json_key(values)
        except (_KeyNull, SchemaError, ValueError, TypeError, ArithmeticError, IndexError):
            pass
        return self.key(values)

    def json_key_from_row(
        self, converted: dict[str, Any], values: Sequence[RawValue]
    ) -> dict[str, Any]:
        """The key, taken from a row :meth:`json_row` already converted (``values`` is that
        row, used only when a key column is null, to raise the usual error)."""
        try:
            return self._key_from_row(converted)
        except _KeyNull:
            return self.key(values)  # raises: a key column is null

    def _width_error(self, values: Sequence[RawValue]) -> SchemaError:
        return SchemaError(
            f"table {self.table.schema}.{self.table.table}: row has {len(values)} values "
            f"for {len(self.names)} columns"
        )

    def _slow_row(self, values: Sequence[RawValue]) -> dict[str, Any]:
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

    def _text_expr(self, i: int, v: str, json: bool, env: dict[str, Any]) -> str:
        """Source of the expression converting text ``v`` of column ``i``."""
        conv = self.converters[i]
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
            # to_epoch_days' fast path inline; a value it refuses raises ValueError, and the row
            # is redone by the slow path, which runs the full converter.
            env["fromiso"] = date.fromisoformat
            return (
                f"(fromiso({v}).toordinal() - {EPOCH_ORDINAL} "
                f"if len({v}) == 10 and {v}[4] == '-' and {v}[7] == '-' else c{i}({v}))"
            )
        if json and self.codecs[i].schema["type"] == "bytes":
            env["b2a"] = binascii.b2a_base64
            return f"b2a(c{i}({v}), newline=False).decode()"  # = _b64, without its frame
        return f"c{i}({v})"

    def _compile_row(self, *, json: bool) -> Callable[[Sequence[RawValue]], dict[str, Any]]:
        """A function made for this table: unpack the row, build the dict in one expression."""
        n = len(self.names)
        if n == 0:
            return lambda values: {}
        env: dict[str, Any] = {"S": self._special}
        items = []
        for i, name in enumerate(self.names):
            v = f"v{i}"
            text = self._text_expr(i, v, json, env)
            expr = f"{text} if {v}.__class__ is str else None if {v} is None else S({i}, {v})"
            items.append(f"{name!r}: ({expr})")
        unpack = ", ".join(f"v{i}" for i in range(n))
        src = f"def row(values):\n    {unpack}, = values\n    return {{{', '.join(items)}}}\n"
        fn: Callable[[Sequence[RawValue]], dict[str, Any]] = self._exec(src, "row", env)
        return fn

    def _compile_key(self) -> Callable[[Sequence[RawValue]], dict[str, Any]]:
        """Key columns only; anything but text (null, TOAST, binary) goes to :meth:`key`."""
        env: dict[str, Any] = {"KeyNull": _KeyNull}
        lines = ["def key(values):"]
        items = []
        for i in self.key_indexes:
            v = f"v{i}"
            lines.append(f"    {v} = values[{i}]")
            lines.append(f"    if {v}.__class__ is not str: raise KeyNull")
            items.append(f"{self.names[i]!r}: {self._text_expr(i, v, True, env)}")
        lines.append(f"    return {{{', '.join(items)}}}")
        fn: Callable[[Sequence[RawValue]], dict[str, Any]]
        fn = self._exec("\n".join(lines) + "\n", "key", env)
        return fn

    def _compile_key_from_row(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        env: dict[str, Any] = {"KeyNull": _KeyNull}
        lines = ["def key(row):"]
        items = []
        for j, i in enumerate(self.key_indexes):
            lines.append(f"    k{j} = row[{self.names[i]!r}]")
            lines.append(f"    if k{j} is None: raise KeyNull")
            items.append(f"{self.names[i]!r}: k{j}")
        lines.append(f"    return {{{', '.join(items)}}}")
        fn: Callable[[dict[str, Any]], dict[str, Any]]
        fn = self._exec("\n".join(lines) + "\n", "key", env)
        return fn

    def _exec(self, src: str, name: str, env: dict[str, Any]) -> Any:
        # Column names are repr()-quoted and converters are passed in env, never as text.
        exec(compile(src, f"<{name} {self.topic}>", "exec"), env)
        return env[name]

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
        self.version = pgcdc.__version__
        self._plans: dict[int, TablePlan] = {}
        self._avro = settings.value_format is ValueFormat.AVRO
        self._schemas = settings.schemas_enable
        self._tx_metadata = settings.provide_transaction_metadata
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
        if self._avro:
            from schemas import avro

            return avro.encode_key(self, plan, plan.key(row))
        return self._key_json(plan, plan.json_key(row))

    def _key_json(self, plan: TablePlan, payload: dict[str, Any]) -> bytes:
        if plan.key_schema_fragment is None or not self._schemas:
            return _dumps(payload)
        # One orjson call writes the pre-serialised schema too: no concatenation copies.
        return orjson.dumps(
            {"schema": plan.key_schema_fragment, "payload": payload}, default=json_default
        )

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
        plan = self.plan(table)
        return self._payload(
            plan,
            op,
            None if before is None else plan.row(before),
            None if after is None else plan.row(after),
            source,
            transaction,
            time.time_ns() if now_ns is None else now_ns,
        )

    def _payload(
        self,
        plan: TablePlan,
        op: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        source: SourceInfo,
        transaction: TransactionInfo | None,
        now_ns: int,
    ) -> dict[str, Any]:
        """The envelope around rows already converted."""
        if op not in OPS:
            raise SchemaError(f"unknown operation {op!r}; expected one of c, r, u, d, t")
        snapshot = source.snapshot
        if snapshot not in _SNAPSHOT_SET:
            raise SchemaError(f"unknown source.snapshot {snapshot!r}")
        ts_us = source.ts_us
        lsn = source.lsn
        last = source.last_commit_lsn
        txid = source.txid
        tx = None
        if transaction is not None and self._tx_metadata:
            tx = {
                "id": transaction.id,
                "total_order": transaction.total_order,
                "data_collection_order": transaction.data_collection_order,
            }
        table = plan.table
        return {
            "before": before,
            "after": after,
            "source": {
                "version": self.version,
                "connector": CONNECTOR,
                "name": self.server_name,
                "ts_ms": ts_us // 1000,
                "snapshot": snapshot,
                "db": self.database,
                "sequence": (
                    f'["{last}","{lsn}"]'
                    if last is not None and lsn is not None
                    else sequence(last, lsn)
                ),
                "ts_us": ts_us,
                "ts_ns": ts_us * 1000,
                "schema": table.schema,
                "table": table.table,
                "txId": txid,
                "lsn": lsn,
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
        plan = self.plan(table)
        if self._avro:
            payload = self.value_payload(table, op, before, after, source, transaction)
            return self._encode_envelope(plan, payload)
        return self._value_json(
            plan,
            self._payload(
                plan,
                op,
                None if before is None else plan.json_row(before),
                None if after is None else plan.json_row(after),
                source,
                transaction,
                time.time_ns(),
            ),
        )

    def encode_change(
        self,
        table: TableSchema,
        op: str,
        before: Sequence[RawValue] | None,
        after: Sequence[RawValue] | None,
        source: SourceInfo,
        transaction: TransactionInfo | None = None,
    ) -> tuple[bytes | None, bytes]:
        """Key and value of a c/r/u/d event in one go.

        The same bytes as ``encode_key(table, after if after is not None else before)`` and
        ``encode_value(...)``, but the key columns are converted once, for the value, and
        the key reuses them.
        """
        plan = self._plans.get(id(table))
        if plan is None or plan.table is not table:
            plan = self.plan(table)
        if self._avro:
            keyed = after if after is not None else before
            key = None if keyed is None else self.encode_key(table, keyed)
            return key, self.encode_value(table, op, before, after, source, transaction)
        # The steps of json_row/json_key_from_row/_key_json/_value_json, inlined: this is
        # the reader's per-event path. Any failure takes the slow paths that explain it.
        fast = plan._json_row
        before_d = after_d = None
        try:
            if before is not None:
                before_d = fast(before)
            if after is not None:
                after_d = fast(after)
        except (SchemaError, ValueError, TypeError, ArithmeticError, IndexError):
            before_d = None if before is None else plan.json_row(before)
            after_d = None if after is None else plan.json_row(after)
        key = None
        if plan.key_indexes:
            try:
                if after_d is not None:
                    key_d = plan._key_from_row(after_d)
                elif before_d is not None:
                    key_d = plan._key_from_row(before_d)
                else:
                    key_d = plan.key(())  # raises: there is no row to take a key from
            except _KeyNull:
                key_d = plan.key(after if after is not None else before or ())  # raises
            if self._schemas:
                key = orjson.dumps(
                    {"schema": plan.key_schema_fragment, "payload": key_d}, default=json_default
                )
            else:
                key = orjson.dumps(key_d, default=json_default)
        payload = self._payload(plan, op, before_d, after_d, source, transaction, time.time_ns())
        if self._schemas:
            value = orjson.dumps(
                {"schema": plan.envelope_schema_fragment, "payload": payload}, default=json_default
            )
        else:
            value = orjson.dumps(payload, default=json_default)
        return key, value

    def encode_truncate(self, table: TableSchema, source: SourceInfo) -> bytes:
        """The record value of a truncate (``op: "t"``) event; it has no key."""
        payload = self.value_payload(table, "t", None, None, source)
        return self._encode_envelope(self.plan(table), payload)

    def _value_json(self, plan: TablePlan, payload: dict[str, Any]) -> bytes:
        if not self._schemas:
            return _dumps(payload)
        return orjson.dumps(
            {"schema": plan.envelope_schema_fragment, "payload": payload}, default=json_default
        )

    def _encode_envelope(self, plan: TablePlan, payload: dict[str, Any]) -> bytes:
        if self._avro:
            from schemas import avro

            return avro.encode_value(self, plan, payload)
        return self._value_json(plan, payload)
