"""Debezium-compatible change events: the envelope around a change, as record key and value.

Everything that depends only on the table is computed once per table (an
:class:`~schemas.plan.EncodePlan`). Building an event is then a loop over the row's values,
the envelope dict, and the format's serialisation (:mod:`schemas.formats`: Connect JSON,
with the schema bytes spliced in pre-serialised, or Avro).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import orjson

import pgcdc
from pgcdc.core.contract import truncate_topic
from pgcdc.core.errors import SchemaError
from pgcdc.core.settings import HeaderFormat, SchemaSettings
from pgcdc.core.values import RawValue
from schemas.debezium import CONNECTOR, OPS, SNAPSHOT_VALUES
from schemas.formats import EventFormat, JsonFormat, Row, format_for, json_default
from schemas.headers import simple_header
from schemas.model import SourceInfo, TableSchema, TransactionInfo
from schemas.plan import FAST_PATH_ERRORS, EncodePlan
from schemas.rowfuncs import KeyColumnNull

_SNAPSHOT_SET = frozenset(SNAPSHOT_VALUES)
# Plans kept at most: far more tables than a database usually captures.
MAX_CACHED_PLANS = 10_000


def sequence(last_commit_lsn: int | None, lsn: int | None) -> str:
    """source.sequence: a JSON array of two strings (or nulls), as Debezium renders it."""
    a = "null" if last_commit_lsn is None else f'"{last_commit_lsn}"'
    b = "null" if lsn is None else f'"{lsn}"'
    return f"[{a},{b}]"


# Stand-ins the JSON templates are written around: orjson escapes a NUL inside a string, so
# these bytes can only come from the Fragments themselves.
_AFTER_MARK = b"\x00after\x00"
_KEY_MARK = b"\x00key\x00"
_TIME_MARKS = (b"\x00ms\x00", b"\x00us\x00", b"\x00ns\x00")
Record = tuple[bytes | None, bytes]


class RowEvents:
    """Key and value of one table's events that differ only in their ``after`` row and the
    time they are written: a snapshot's ``r`` records, a batch at a time.

    The same bytes as :meth:`EventEncoder.encode_change` gives for each row. With the JSON
    format the value is a ``%`` template the format itself wrote once around the row's place
    and the three times, so a row costs its generated row function, one ``orjson.dumps`` of
    the row and one formatting; other formats call ``encode_change`` per row.
    """

    __slots__ = ("_encoder", "_key", "_op", "_plan", "_source", "_table", "_transaction", "_value")

    def __init__(
        self,
        encoder: EventEncoder,
        table: TableSchema,
        op: str,
        source: SourceInfo,
        transaction: TransactionInfo | None,
    ) -> None:
        self._encoder = encoder
        self._table = table
        self._op = op
        self._source = source
        self._transaction = transaction
        self._plan = plan = encoder.plan(table)
        self._value: bytes | None = None
        self._key: bytes | None = None
        fmt = encoder.format
        if not isinstance(fmt, JsonFormat):
            return
        # The row's place: a Fragment where the dict goes (written verbatim by orjson).
        after = cast(Row, orjson.Fragment(_AFTER_MARK))
        payload = encoder._payload(plan, op, None, after, source, transaction, 0)
        for name, mark in zip(("ts_ms", "ts_us", "ts_ns"), _TIME_MARKS, strict=True):
            payload[name] = orjson.Fragment(mark)
        value = fmt.encode_value(plan, payload).replace(b"%", b"%%")
        value = value.replace(_AFTER_MARK, b"%b", 1)
        for mark in _TIME_MARKS:
            value = value.replace(mark, b"%d", 1)
        self._value = value
        if plan.key_indexes:
            self._key = (
                fmt.encode_key_payload(plan, orjson.Fragment(_KEY_MARK))
                .replace(b"%", b"%%")
                .replace(_KEY_MARK, b"%b", 1)
            )

    def encode(self, rows: Sequence[Sequence[RawValue]]) -> list[Record]:
        """Key and value of each row (a row's key is None when the table has no key)."""
        template = self._value
        if template is None:
            change = self._encoder.encode_change
            table, op, source, tx = self._table, self._op, self._source, self._transaction
            return [change(table, op, None, row, source, tx) for row in rows]
        plan = self._plan
        fast_row = plan.fast_json_row
        key_of = plan.fast_key_from_row
        key_template = self._key
        dumps = orjson.dumps
        default = json_default
        clock = time.time_ns
        out: list[Record] = []
        append = out.append
        for values in rows:
            try:
                row = fast_row(values)
            except FAST_PATH_ERRORS:
                row = plan.json_row(values)  # the same dict, or the error naming the column
            key = None
            if key_template is not None:
                try:
                    key = key_template % dumps(key_of(row), default=default)
                except KeyColumnNull:  # as in JsonFormat.key_and_rows
                    key = key_template % dumps(plan.key(values), default=default)  # raises
            ns = clock()
            append((key, template % (dumps(row, default=default), ns // 1_000_000, ns // 1000, ns)))
        return out


class EventEncoder:
    """Builds the Kafka key and value of change events for any number of tables.

    ``event_format`` serialises them; by default the one the settings ask for
    (:func:`schemas.formats.format_for`).
    """

    def __init__(
        self,
        settings: SchemaSettings,
        topic_prefix: str,
        database: str,
        event_format: EventFormat | None = None,
    ) -> None:
        self.settings = settings
        self.topic_prefix = topic_prefix
        self.database = database
        self.server_name = settings.server_name or topic_prefix
        self.version = pgcdc.__version__
        self.format = format_for(settings) if event_format is None else event_format
        # One plan per table, by name: a new description of a table (a Relation message
        # after DDL, sent again and again on a long-running stream) replaces its old plan
        # instead of adding one, so the cache holds as many plans as there are tables.
        self._plans: dict[tuple[str, str], EncodePlan] = {}
        self._tx_metadata = settings.provide_transaction_metadata

    def plan(self, table: TableSchema) -> EncodePlan:
        """The table's precomputed plan, built again when the table's description changes."""
        plan = self._plans.get((table.schema, table.table))
        if plan is not None:
            if plan.table is table:
                return plan
            if plan.table == table:  # the same description, loaded again
                plan.table = table  # so the next lookup is an identity check
                return plan
        plan = EncodePlan(table, self.settings, self.topic_prefix)
        plans = self._plans
        if len(plans) >= MAX_CACHED_PLANS and (table.schema, table.table) not in plans:
            # Tables renamed over and over: forget the oldest (it is rebuilt if needed).
            del plans[next(iter(plans))]
        plans[(table.schema, table.table)] = plan
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

    def key_header(
        self, table: TableSchema, row: Sequence[RawValue], key: bytes | None
    ) -> bytes | None:
        """A key-change header's value (``__debezium.newkey``/``oldkey``) for the key of
        ``row``, whose record key is ``key``, as ``schema.header_format`` says: the text
        Kafka Connect's SimpleHeaderConverter writes, or the record key itself (json)."""
        if key is None or self.settings.header_format is HeaderFormat.JSON:
            return key
        plan = self.plan(table)
        assert plan.key_schema is not None
        return simple_header(plan.key_schema, plan.key(row))

    def encode_key(self, table: TableSchema, row: Sequence[RawValue]) -> bytes | None:
        """The record key; ``row`` is aligned with ``table.columns``."""
        plan = self.plan(table)
        if not plan.key_indexes:
            return None
        return self.format.encode_key(plan, row)

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
        plan: EncodePlan,
        op: str,
        before: Row | None,
        after: Row | None,
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
                "origin": None,
                "origin_lsn": None,
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
        fmt = self.format
        payload = self._payload(
            plan,
            op,
            None if before is None else fmt.row(plan, before),
            None if after is None else fmt.row(plan, after),
            source,
            transaction,
            time.time_ns(),
        )
        return fmt.encode_value(plan, payload)

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
        ``encode_value(...)``; the JSON format converts the key columns once, for the
        value, and the key reuses them.
        """
        plan = self._plans.get((table.schema, table.table))
        if plan is None or plan.table is not table:
            plan = self.plan(table)
        fmt = self.format
        key, before_d, after_d = fmt.key_and_rows(plan, before, after)
        payload = self._payload(plan, op, before_d, after_d, source, transaction, time.time_ns())
        return key, fmt.encode_value(plan, payload)

    def row_events(
        self,
        table: TableSchema,
        op: str,
        source: SourceInfo,
        transaction: TransactionInfo | None = None,
    ) -> RowEvents:
        """Encodes rows of ``table`` as ``op`` events with this source (:class:`RowEvents`):
        build it once, use it for many rows."""
        return RowEvents(self, table, op, source, transaction)

    def key_value(self, table: TableSchema, key: bytes) -> dict[str, Any] | None:
        """What a record key of ``table`` says (field → value), None if it is not one."""
        return self.format.decode_key(self.plan(table), key)

    def key_identity(self, table: TableSchema, key: bytes) -> bytes:
        """A record key by its value, not its bytes: keys written with and without schemas,
        or before and after a key column went from int to bigint, have one identity (the
        key's value as canonical JSON; a key that does not decode is its own bytes)."""
        value = self.key_value(table, key)
        if value is None:
            return b"raw:" + key
        return b"val:" + orjson.dumps(value, default=json_default)

    def encode_delete_of_key(self, table: TableSchema, key: bytes, source: SourceInfo) -> bytes:
        """The value of a delete event for the row ``key`` names (a TRUNCATE's row): before
        holds the key columns when the key says them all, every other column null."""
        plan = self.plan(table)
        value = self.key_value(table, key)
        before = None
        if value is not None and plan.key_names and all(k in value for k in plan.key_names):
            keys = set(plan.key_names)
            before = {n: value[n] if n in keys else None for n in plan.value_names}
        payload = self._payload(plan, "d", before, None, source, None, time.time_ns())
        try:
            return self.format.encode_value(plan, payload)
        except SchemaError:
            # An old key whose values no longer fit the key columns' types: no before.
            payload["before"] = None
            return self.format.encode_value(plan, payload)

    def encode_truncate_key(self, table: TableSchema) -> bytes:
        """The key of a keyed table's ``t`` event in the truncate topic: the string
        ``<schema>.<table>`` as a Connect key (registered as ``<truncate topic>-key``)."""
        subject = f"{truncate_topic(self.topic_prefix)}-key"
        return self.format.encode_name_key(f"{table.schema}.{table.table}", subject)

    def encode_truncate(self, table: TableSchema, source: SourceInfo) -> bytes:
        """The record value of a truncate (``op: "t"``) event; it has no key."""
        payload = self.value_payload(table, "t", None, None, source)
        return self.format.encode_value(self.plan(table), payload)
