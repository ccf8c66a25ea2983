"""The direct read's records taken to changes natively (``spark.apply = "native"``).

A range's records usually share one shape: the events of one table, each key and value
enveloped with the same schema, with the reader's version headers and no unchanged column.
``pgcdc_native.FastChanges`` takes such a range in one call from the records' bytes to each
key's newest change, converted as :class:`spark_jobs.convert.RowConverter` converts it, with
no Python object made per record before the change itself. The rules are those of
:mod:`spark_jobs.parse` (the envelope, the key, the version headers), of
:func:`spark_jobs.reduce.latest_per_key` (the newest by commit LSN, order and offset) and of
:mod:`spark_jobs.changes`; ``tests/unit/test_fast_changes.py`` holds the two paths to the same
changes.

A range with any record off that shape (a heartbeat, a dead letter, a truncate, a keyless
table, unchanged columns, a second schema, a value outside the converters' plain cases, a
nested value) gives None, and the Python path takes the whole range: what a record means is
decided in one place only. So does a range when the native module is missing. A task takes
a range a part at a time (:class:`NativeParts`, :func:`spark_jobs.apply_loop.apply_parts`):
there, the Python path takes the range from the first record after what was taken.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

import orjson

from pgcdc.core import native
from pgcdc.core.contract import (
    HEADER_COMMIT_LSN,
    HEADER_ORDER,
    HEADER_UNCHANGED,
    PLACEHOLDER_TEXTS,
)
from pgcdc.core.settings import Settings, ValueFormat
from pgcdc.core.spark_settings import ApplyPath, ReadPath
from sinks.base import Change, WholeDocument
from spark_jobs.convert import after_schema, native_kinds
from spark_jobs.parse import CHANGE, KafkaRecord, RecordParser, key_prefix

log = logging.getLogger(__name__)

_HEADERS = (HEADER_COMMIT_LSN, HEADER_ORDER, HEADER_UNCHANGED)
_NEW = object.__new__  # what the native module makes each Change with (its take)
_NO_COLUMNS = frozenset[str]()  # a whole document's unchanged columns
_PLACEHOLDERS = sorted(PLACEHOLDER_TEXTS)
# Records handed to the native module at a time: the range's records are not all held at
# once (a 4 kB record each), only each key's newest change.
_PART = 4096
# What reading an odd value schema raises (spark_jobs.changes says the same of its decoding).
_SCHEMA_ERRORS = (ValueError, TypeError, AttributeError, KeyError, OverflowError)


@dataclass
class NativeRange:
    """One range's changes as :func:`native_range` builds them: each key's newest change,
    the Kafka position of its record, the range's table and value schema, and the newest
    commit time among them (what the Python path's rows carry for the same changes)."""

    table: str
    schema: Mapping[str, Any]
    changes: list[Change]
    where: list[tuple[str, int, int]]
    newest_commit_ms: int


class NativeParts:
    """One range's records taken natively a part (:data:`_PART` records) at a time: what the
    parts added so far reduce to can be taken whenever the caller likes (:meth:`take`), and
    the parts after it reduce anew, so that a range's first changes can be applied while its
    later records are still being read. Made by :func:`native_parts`."""

    def __init__(
        self,
        make: Callable[[], Any],
        table: str,
        schema: Mapping[str, Any],
        part: list[KafkaRecord],
        records: Iterator[KafkaRecord],
    ) -> None:
        """``make`` makes the native reducer; ``part`` is the range's first part (read
        already), ``records`` the rest of it."""
        self._fast = make()
        self._part = part  # the next part, read already
        self._records = records
        self.table, self.schema = table, schema
        self.topic, self.partition = part[0].topic, part[0].partition
        # The offset after the last record added, and after the last one taken.
        self._added_to = self.taken_to = part[0].offset
        self.taken = 0  # changes taken so far
        self.whole = False  # every record added: none was off this path

    def add_next(self) -> bool | None:
        """Add the next part: True; None when no record is left; False when a record of it
        is off this path (what was added since the last :meth:`take` is then of no use: the
        Python path takes the range from :attr:`taken_to`)."""
        part = self._part or list(islice(self._records, _PART))
        self._part = []
        if not part:
            self.whole = True
            return None
        if not self._fast.add(part):
            return False
        self._added_to = part[-1].offset + 1
        return True

    def take(self) -> tuple[list[Change], list[tuple[str, int, int]], int]:
        """Each key's newest change of the parts added since the last take, the Kafka
        position of its record, and the newest commit time among them (0 for none)."""
        changes, where, newest = self._fast.take(
            _NEW,
            Change,
            WholeDocument,
            self.table,
            self.schema,
            _NO_COLUMNS,
            self.topic,
            self.partition,
        )
        self.taken_to = self._added_to
        self.taken += len(changes)
        return changes, where, newest


def native_parts(
    parser: RecordParser, records: Iterable[KafkaRecord], heartbeat_topic: str | None
) -> NativeParts | None:
    """The range of ``records`` (one topic partition) to take natively a part at a time
    (its first part read already), or None when the range is not for this path (the
    module's docstring) or the native module is missing. ``parser`` is the range's own (it
    learns the schema from the first value)."""
    mod = native.module()
    if mod is None:
        return None
    it = iter(records)
    part = list(islice(it, _PART))
    first = next((r for r in part if r.value is not None), None)
    if first is None or first.topic == heartbeat_topic:
        return None
    row = parser(first)
    known = parser.known_schema(first.topic)
    keys = key_prefix(first.key)
    if row["kind"] != CHANGE or known is None or keys is None:
        return None
    prefix, schema_json = known
    try:
        schema = orjson.loads(schema_json)
        kinds = native_kinds(after_schema(schema))
        if kinds is None:
            return None
        make = functools.partial(mod.FastChanges, prefix, keys, kinds, _PLACEHOLDERS, _HEADERS)
        parts = NativeParts(make, row["table"], schema, part, it)
    except _SCHEMA_ERRORS:
        # A schema the converters cannot read (a Decimal's scale that is no integer, a field
        # without a name): the Python path dead-letters its changes with the reason.
        return None
    return parts


def native_range(
    parser: RecordParser, records: Iterable[KafkaRecord], heartbeat_topic: str | None
) -> NativeRange | None:
    """Each key's newest change of one range's ``records`` (one topic partition, read in
    parts of :data:`_PART` records), built already; None when the range is not for this
    path (the module's docstring), or the native module is missing. ``parser`` is the
    range's own (it learns the schema from the first value)."""
    parts = native_parts(parser, records, heartbeat_topic)
    if parts is None:
        return None
    while added := parts.add_next():
        pass
    if added is False:
        return None
    changes, where, newest = parts.take()
    return NativeRange(parts.table, parts.schema, changes, where, newest)


def apply_said(settings: Settings) -> str:
    """What a job's start line says of ``spark.apply`` (the direct read's only): `` apply=…``,
    and when ``native`` cannot be taken here, why (the tasks then take the Python path: on a
    cluster each executor decides for itself, and each batch line counts its native
    changes)."""
    if settings.spark.read is not ReadPath.DIRECT:
        return ""
    said = f" apply={settings.spark.apply}"
    if settings.spark.apply is not ApplyPath.NATIVE:
        return said
    if settings.schema_.value_format is ValueFormat.AVRO:
        return f"{said} (Avro values: the python way)"
    if not hasattr(native.module(), "FastChanges"):
        return f"{said} (no native module here, make install builds it: the python way)"
    return said
