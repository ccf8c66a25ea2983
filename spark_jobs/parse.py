"""The parse in the Python task: a Kafka record's raw key, value and header bytes → the
classified row the reduction reads, with one orjson parse per record and none in the JVM.

``spark.parse = "python"`` gives the apply tasks the Kafka source's own columns over Arrow
(:func:`spark_jobs.transfer.records_from_arrow`) and this module turns each record into the
row :func:`spark_jobs.transforms.classify` gives on the ``"jvm"`` path (Spark SQL's
``from_json``): ``kind, topic, table, partition, offset, key_json, is_delete, op,
after_json, unchanged, schema_id, value_schema_json, commit_lsn, tx_order, source_ts_ms,
heartbeat_lsn, parse_error, raw_value``, plus ``after``, the image already parsed. Both
paths enforce the same rules (tests/unit/test_spark_parse.py proves each here, and
tests/unit/test_spark_transforms.py runs the parse tests on both paths and compares their
rows record for record):

1. **Table.** ``table`` is the topic without ``<topic_prefix>.``: the table id the
   contract encodes in the name; another topic keeps its whole name.
2. **Text.** A key, value or header that is not UTF-8 is read with U+FFFD for each bad
   sequence, as Spark's cast to a string did: never a failed task.
3. **Heartbeats.** Every record of the heartbeat topic is a ``heartbeat``, whatever it
   holds; ``heartbeat_lsn`` is its value's ``lsn`` (a decimal string too) when that is a
   long, else None. Nothing else is read from it: the watermark rule is
   :mod:`spark_jobs.watermark`'s.
4. **Envelope.** A value that is a JSON object with a non-null ``payload`` is Connect
   JsonConverter's ``{"schema", "payload"}`` (schemas on): the payload is the event and
   ``schema`` its value schema. Any other JSON object is the bare event (schemas off), with
   no schema.
5. **Key.** A key that is a JSON object with a non-null ``payload`` gives that payload's
   JSON as ``key_json``; any other key gives its text unchanged (the change builder
   dead-letters one that is no JSON object of key columns, :mod:`spark_jobs.changes`); a
   null key stays null.
6. **Version.** ``commit_lsn`` is the first ``cdc.commit_lsn`` header, ``tx_order`` the
   first ``cdc.order`` header. A header that is absent (or null) gives the event's
   ``source.lsn`` (0 without one) and order 0. A decimal beyond 2**63-1 gives a null
   ``commit_lsn`` (the change builder stops the job: no later change could be ordered) and
   order 0.
7. **Dead letters.** The first that applies is the record's ``parse_error``: an Avro record
   that could not be read (its reason); a version header that is not ASCII decimal digits
   (:data:`BAD_COMMIT_LSN`, :data:`BAD_ORDER`); a value (not a tombstone) that is no JSON
   object, or whose event has no string ``op`` (:data:`NOT_DEBEZIUM`). A dead record keeps
   its value's text in ``raw_value`` for the letter; no other row carries it.
8. **Kinds**, first match: ``heartbeat``; ``dead``; ``truncate`` (``op`` ``t``: skipped and
   counted, the reader also wrote a delete per row); ``keyless`` (a null key: a table
   without a key, skipped and counted); ``change``.
9. **Deletes.** A tombstone (null value) or an ``op`` ``d`` event is a delete
   (``is_delete``).
10. **Row image and TOAST.** ``after`` is the ``after`` image, parsed once, when it is a
    JSON object (the change builder reads it as it is); another non-null image is
    ``after_json``, its text, as the JVM gives every image;
    ``unchanged`` the first ``cdc.unchanged`` header's text (the columns it left out).
11. **Schemas.** ``schema_id`` names the event's value schema inside the task (equal
    schemas, equal ids; None without one); its JSON, ``value_schema_json``, is carried on
    the first row of each (topic, ``schema_id``) and on every dead row only
    (:func:`carries_schema`, shared with the ``jvm`` path's Arrow transfer), so each
    distinct schema reaches the sinks' type conversion (:mod:`spark_jobs.convert`) once.
12. **Size.** No limit of its own: orjson reads a 60 MB value whole (the JVM's JSON reader
    refused strings of tens of MB; :func:`spark_jobs.reduce.reparse` read those again).
13. **Avro.** With ``schema.value_format = avro`` each key and value is first read into
    JsonConverter JSON by :mod:`spark_jobs.avro_input` (the ``transcode`` argument, in the
    same task: no UDF); records already JSON pass unchanged, and one that cannot be read is
    dead with ``Avro: <why>``.
14. **One parse.** A value is parsed once. A table's events repeat its schema: once the
    task has parsed one, a value starting with that schema's exact bytes has it, and only
    its payload is parsed (anything else is parsed whole, so the result is the same).

Stricter than Spark's reader, on purpose (nothing a Debezium writer emits): trailing bytes
after the JSON, single quotes and NaN literals make a value :data:`NOT_DEBEZIUM`; an ``op``
that is not a string does too; a ``source.lsn`` or ``source.ts_ms`` that is not an integer
counts as absent.

Pure code: no Spark, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple

import orjson

from pgcdc.core.contract import (
    HEADER_COMMIT_LSN,
    HEADER_ORDER,
    HEADER_UNCHANGED,
    HEARTBEAT_LSN_FIELD,
)

CHANGE, DEAD, HEARTBEAT, TRUNCATE, SCHEMA = "change", "dead", "heartbeat", "truncate", "schema"
# Records with a null key on a table topic: a keyless table's events (its topic is not
# compacted). No follower can tell its rows apart, so they are skipped and counted.
KEYLESS = "keyless"

NOT_DEBEZIUM: Final = "value is not a Debezium event"
BAD_COMMIT_LSN: Final = f"the {HEADER_COMMIT_LSN} header is no LSN"
BAD_ORDER: Final = f"the {HEADER_ORDER} header is no number"

_LONG_MAX = (1 << 63) - 1
_SCHEMA_OPEN = b'{"schema":'
_PAYLOAD_OPEN = b',"payload":'

# (topic, key, value) → (key, value, why it could not be read): spark_jobs.avro_input.
Transcode = Callable[
    [str, bytes | None, bytes | None], tuple[bytes | None, bytes | None, str | None]
]


class KafkaRecord(NamedTuple):
    """One record as the Kafka source gives it (headers as (name, value) pairs)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] | None


def carries_schema(seen: set[tuple[Any, Any]], kind: str, topic: str, schema_id: Any) -> bool:
    """Whether this row carries its schema's JSON (rule 11): the first of its (topic,
    ``schema_id``), or a dead one (the task may read it again and give it a schema of its
    own, so it cannot stand for the others of its id)."""
    if kind == DEAD:
        return True
    sid = (topic, schema_id)
    if sid in seen:
        return False
    seen.add(sid)
    return True


def parsed_after(row: Any) -> dict[str, Any] | None:
    """The ``after`` image this parse kept parsed in ``row`` (rule 10), if any: rows of the
    ``jvm`` path (dicts without it, or Spark's ``Row``) carry ``after_json`` only."""
    return row.get("after") if isinstance(row, Mapping) else None


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")


def _json(raw: bytes) -> Any:
    """The JSON value of ``raw`` (text that is not UTF-8 read with U+FFFD), else None."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return orjson.loads(raw.decode("utf-8", "replace"))
    except orjson.JSONDecodeError:
        return None


def _as_json_text(value: Any) -> str:
    """A JSON value as Spark's reader gives a string field: a string as it is, anything
    else as its JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _long(value: Any) -> int | None:
    """An integer that fits a long (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if -_LONG_MAX - 1 <= value <= _LONG_MAX else None


def _decimal(text: str | None) -> tuple[bool, int | None]:
    """(is a decimal, its value as a long or None beyond 2**63-1) of a header's text."""
    if text is None or not (text.isascii() and text.isdigit()):
        return False, None
    n = int(text)
    return True, n if n <= _LONG_MAX else None


def _version_headers(
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> tuple[str | None, str | None, str | None]:
    """The first commit LSN, order and unchanged-columns headers, as text: one pass over
    the headers (a scan per header was a tenth of the parse)."""
    commit = order = unchanged = None
    seen = 0
    for key, value in headers or ():
        if key == HEADER_COMMIT_LSN:
            if not seen & 1:
                commit, seen = _text(value), seen | 1
        elif key == HEADER_ORDER:
            if not seen & 2:
                order, seen = _text(value), seen | 2
        elif key == HEADER_UNCHANGED and not seen & 4:
            unchanged, seen = _text(value), seen | 4
    return commit, order, unchanged


def _heartbeat_lsn(value: bytes | None) -> int | None:
    beat = _json(value) if value is not None else None
    if not isinstance(beat, dict):
        return None
    lsn = beat.get(HEARTBEAT_LSN_FIELD)
    if isinstance(lsn, str):
        is_decimal, n = _decimal(lsn)
        return n if is_decimal else None
    return _long(lsn)


def key_prefix(key: bytes | None) -> bytes | None:
    """What a key of JsonConverter's envelope (schemas on) starts with up to its payload:
    ``{"schema":`` + its schema's JSON as orjson writes it + ``,"payload":``, when ``key``
    starts with exactly that (rule 5's keys of one table share it), else None."""
    if key is None:
        return None
    parsed = _json(key)
    if not isinstance(parsed, dict) or parsed.get("payload") is None:
        return None
    schema = parsed.get("schema")
    if not isinstance(schema, dict):
        return None
    prefix = _SCHEMA_OPEN + _as_json_text(schema).encode() + _PAYLOAD_OPEN
    return prefix if key.startswith(prefix) else None


class RecordParser:
    """Parses the records of one task (rules in the module's docstring); keeps the ids of
    the schemas it met, so equal schemas get one id and their JSON is carried once."""

    def __init__(
        self,
        topic_prefix: str,
        heartbeat_topic: str | None = None,
        transcode: Transcode | None = None,
    ) -> None:
        self._prefix = topic_prefix + "."
        self._heartbeat_topic = heartbeat_topic
        self._transcode = transcode
        self._schema_ids: dict[str, int] = {}
        self._carried: set[tuple[Any, Any]] = set()
        # topic → the bytes its values start with up to the payload, and that schema's JSON.
        self._known: dict[str, tuple[bytes, str]] = {}

    def known_schema(self, topic: str) -> tuple[bytes, str] | None:
        """What the values of ``topic`` start with up to their payload, and that schema's
        JSON, once a value with a schema was parsed whole (rule 14), else None."""
        return self._known.get(topic)

    def rows(self, records: Iterable[KafkaRecord]) -> Iterator[dict[str, Any]]:
        """The classified row of each record, in order."""
        for record in records:
            yield self(record)

    def __call__(self, rec: KafkaRecord) -> dict[str, Any]:
        """The classified row of one record."""
        topic, key, value = rec.topic, rec.key, rec.value
        commit, order, unchanged = _version_headers(rec.headers)
        row: dict[str, Any] = {
            "kind": CHANGE,
            "topic": topic,
            "table": topic.removeprefix(self._prefix),
            "partition": rec.partition,
            "offset": rec.offset,
            "key_json": None,
            "is_delete": value is None,
            "op": None,
            "after_json": None,
            "after": None,
            "unchanged": unchanged,
            "schema_id": None,
            "value_schema_json": None,
            "commit_lsn": 0,
            "tx_order": 0,
            "source_ts_ms": None,
            "heartbeat_lsn": None,
            "parse_error": None,
            "raw_value": None,
        }
        if topic == self._heartbeat_topic:
            key_json = self._key_json(key)
            row.update(kind=HEARTBEAT, key_json=key_json, heartbeat_lsn=_heartbeat_lsn(value))
            return row
        decode_error = None
        if self._transcode is not None:
            key, value, decode_error = self._transcode(topic, key, value)
        row["key_json"] = self._key_json(key)
        event = self._event(row, value)
        self._version(row, commit, order, event)
        error = decode_error or self._header_error(commit, order)
        if error is None and value is not None and event is None:
            error = NOT_DEBEZIUM
        if error is not None:
            row.update(kind=DEAD, parse_error=error, raw_value=_text(value))
        elif row["op"] == "t":
            row["kind"] = TRUNCATE
        elif row["key_json"] is None:
            row["kind"] = KEYLESS
        sid = row["schema_id"]
        if sid is not None and not carries_schema(self._carried, row["kind"], topic, sid):
            row["value_schema_json"] = None
        return row

    @staticmethod
    def _key_json(key: bytes | None) -> str | None:
        if key is None:
            return None
        parsed = _json(key)
        if isinstance(parsed, dict) and parsed.get("payload") is not None:
            return _as_json_text(parsed["payload"])
        return _text(key)

    def _envelope(self, topic: str, value: bytes) -> tuple[Any, str | None]:
        """The value's event (rule 4; anything if it holds none) and its schema's JSON.

        Each event of a table repeats its schema, most of its bytes: a value that starts
        with the exact bytes of the schema last met on the topic (``{"schema":`` + that
        schema's JSON + ``,"payload":``) and ends with ``}`` has that schema, and only its
        payload is parsed (rule 14); anything else is parsed whole."""
        known = self._known.get(topic)
        if known is not None and value.startswith(known[0]) and value.endswith(b"}"):
            prefix, text = known
            try:
                payload = orjson.loads(memoryview(value)[len(prefix) : -1])
            except orjson.JSONDecodeError:
                payload = None
            if isinstance(payload, dict):
                return payload, text
        env = _json(value)
        if not isinstance(env, dict) or env.get("payload") is None:
            return env, None
        schema = env.get("schema")
        if schema is None:
            return env["payload"], None
        text = _as_json_text(schema)
        prefix = _SCHEMA_OPEN + text.encode() + _PAYLOAD_OPEN
        if isinstance(schema, dict) and value.startswith(prefix):
            self._known[topic] = (prefix, text)
        return env["payload"], text

    def _event(self, row: dict[str, Any], value: bytes | None) -> dict[str, Any] | None:
        """Fill ``row`` from the value's event; the event, or None if it holds none."""
        if value is None:
            return None
        env, schema = self._envelope(row["topic"], value)
        if not isinstance(env, dict):
            return None
        op = env.get("op")
        if not isinstance(op, str):
            return None
        after = env.get("after")
        source = env.get("source")
        source = source if isinstance(source, dict) else {}
        row.update(
            op=op,
            is_delete=op == "d",
            # An object stays parsed, for the change builder (anything else: its text, which
            # the change builder refuses as the JVM path's).
            after=after if isinstance(after, dict) else None,
            after_json=None if after is None or isinstance(after, dict) else _as_json_text(after),
            source_ts_ms=_long(source.get("ts_ms")),
        )
        if schema is not None:
            sid = self._schema_ids.setdefault(schema, len(self._schema_ids))
            row.update(schema_id=sid, value_schema_json=schema)
        return env

    @staticmethod
    def _version(
        row: dict[str, Any], commit: str | None, order: str | None, event: dict[str, Any] | None
    ) -> None:
        if commit is None:
            source = event.get("source") if event is not None else None
            lsn = _long(source.get("lsn")) if isinstance(source, dict) else None
            row["commit_lsn"] = lsn if lsn is not None else 0
        else:
            row["commit_lsn"] = _decimal(commit)[1]
        n = _decimal(order)[1]
        row["tx_order"] = n if n is not None else 0

    @staticmethod
    def _header_error(commit: str | None, order: str | None) -> str | None:
        for text, reason in ((commit, BAD_COMMIT_LSN), (order, BAD_ORDER)):
            if text is not None and not _decimal(text)[0]:
                return reason
        return None
