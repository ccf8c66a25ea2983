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

import collections
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
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
from spark_jobs.kafka_direct import RangeMessages, range_end
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
    later records are still being read. Made by :func:`native_parts` (from records) and
    :func:`native_message_parts` (from a range's consumed messages)."""

    def __init__(
        self,
        make: Callable[[], Any],
        table: str,
        schema: Mapping[str, Any],
        topic: str,
        partition: int,
        start: int,
        feed: Callable[[Any], tuple[bool | None, int]],
    ) -> None:
        """``make`` makes the native reducer; ``feed`` adds the next part to it: (True, the
        offset after its last record), (None, -1) when no record is left, (False, -1) when
        a record of it is off this path; ``start``: the range's first offset."""
        self._fast = make()
        self._feed = feed
        self.table, self.schema = table, schema
        self.topic, self.partition = topic, partition
        # The offset after the last record added, and after the last one taken.
        self._added_to = self.taken_to = start
        self.taken = 0  # changes taken so far
        self.whole = False  # every record added: none was off this path

    def add_next(self) -> bool | None:
        """Add the next part: True; None when no record is left; False when a record of it
        is off this path (what was added since the last :meth:`take` is then of no use: the
        Python path takes the range from :attr:`taken_to`)."""
        added, added_to = self._feed(self._fast)
        if added is None:
            self.whole = True
        elif added and added_to >= 0:  # a part may hold no record of the range
            self._added_to = added_to
        return added

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


def _native_maker(
    parser: RecordParser, first: KafkaRecord | None, heartbeat_topic: str | None
) -> tuple[Callable[[], Any], str, Mapping[str, Any]] | None:
    """(what makes the native reducer, the table, its value schema) of the range whose first
    record with a value is ``first``, learnt by ``parser`` (the range's own); None when the
    range is not for this path (the module's docstring) or the native module is missing."""
    mod = native.module()
    if mod is None or first is None or first.topic == heartbeat_topic:
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
    except _SCHEMA_ERRORS:
        # A schema the converters cannot read (a Decimal's scale that is no integer, a field
        # without a name): the Python path dead-letters its changes with the reason.
        return None
    return make, row["table"], schema


def native_parts(
    parser: RecordParser, records: Iterable[KafkaRecord], heartbeat_topic: str | None
) -> NativeParts | None:
    """The range of ``records`` (one topic partition) to take natively a part at a time
    (its first part read already), or None when the range is not for this path (the
    module's docstring) or the native module is missing. ``parser`` is the range's own (it
    learns the schema from the first value)."""
    if native.module() is None:
        return None
    it = iter(records)
    part = list(islice(it, _PART))
    made = _native_maker(parser, next((r for r in part if r.value is not None), None),
                         heartbeat_topic)  # fmt: skip
    if made is None:
        return None
    pending = [part]

    def feed(fast: Any) -> tuple[bool | None, int]:
        records = pending.pop() if pending else list(islice(it, _PART))
        if not records:
            return None, -1
        if not fast.add(records):
            return False, -1
        return True, records[-1].offset + 1

    first = part[0]
    return NativeParts(*made, first.topic, first.partition, first.offset, feed)


def native_message_parts(
    parser: RecordParser, messages: RangeMessages, heartbeat_topic: str | None
) -> NativeParts | None:
    """The range that ``messages`` reads, to take natively a part at a time, its messages
    handed to the native module as consumed (``FastChanges.add_messages``: no Python object
    made a record but confluent-kafka's own); None as :func:`native_parts` gives it, or when
    the range's first :data:`_PART` records hold no value, or its partition ends first (the
    Python path then reads the range)."""
    if native.module() is None:
        return None
    r = messages.range
    held: list[list[Any]] = []  # the messages read to find the first value, added first
    first = None
    seen = 0
    expect = r.start
    while first is None and seen < _PART:
        msgs = messages.next(expect)
        held.append(msgs)
        for m in msgs:
            if m.error() is not None:
                if range_end(messages, m):
                    return None
                continue
            offset = m.offset()
            if offset is None or m.topic() != r.topic or m.partition() != r.partition:
                continue
            if offset >= r.end:
                return None
            expect = offset + 1
            seen += 1
            if m.value() is not None:
                first = KafkaRecord(r.topic, r.partition, offset, m.key(), m.value(), m.headers())
                break
            if offset == r.end - 1:
                return None  # read to its end, no record with a value: the Python path's
    made = _native_maker(parser, first, heartbeat_topic)
    if made is None:
        return None
    feed = _MessageFeed(messages, held)
    return NativeParts(*made, r.topic, r.partition, r.start, feed)


class _MessageFeed:
    """What adds a range's consumed messages to the native reducer a part (at least
    :data:`_PART` messages, or the rest of the range) at a time (:class:`NativeParts`)."""

    def __init__(self, messages: RangeMessages, held: list[list[Any]]) -> None:
        self._messages = messages
        self._held = collections.deque(held)
        self._at = 0  # the next message of the first held list
        self._expect = messages.range.start
        self._ended = False

    def __call__(self, fast: Any) -> tuple[bool | None, int]:
        r = self._messages.range
        read = 0
        added_to = -1
        while read < _PART and not self._ended:
            if not self._held:
                self._held.append(self._messages.next(self._expect))
                self._at = 0
            msgs = self._held[0]
            at, stop, to = fast.add_messages(msgs, self._at, r.topic, r.partition, r.end)
            read += at - self._at
            if to >= 0:
                added_to = self._expect = to
            if stop == _READ_ALL:
                self._held.popleft()
                self._at = 0
            elif stop == _RANGE_END:
                self._ended = True
            elif stop == _OFF_PATH:
                return False, -1
            else:  # _ERROR: a partition's end, else a failure raised
                self._ended = range_end(self._messages, msgs[at])
                self._at = at + 1
        if added_to < 0 and self._ended:
            return None, -1
        return True, added_to


# What stopped FastChanges.add_messages.
_READ_ALL, _RANGE_END, _OFF_PATH, _ERROR = 0, 1, 2, 3


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
