"""Records Kafka refuses for good: which they are, the fail-fast line, the dead letter.

A change record can be refused for good: larger than the topic takes (``MSG_SIZE_TOO_LARGE``,
locally or from the broker) or invalid for it (``INVALID_RECORD``). Retrying cannot help, so
``kafka.unproducible_records`` decides: ``fail`` (the default) stops the reader with
:func:`fail_message`, one line naming the table, the key, the reason and the setting, and
nothing after the record is acknowledged, so a restart meets it again; ``dead_letter``
writes :func:`letter` to the dead-letter topic instead (key = the record's key) and the
stream goes on. Pure functions, no Kafka.

A broker refuses a whole batch, not a record. The reader's table topics take 64 MiB records
and the producer closes a batch at 1 MB, so a record too large for the topic travels alone;
on a topic created elsewhere with a limit below the batch size, neighbours of a too-large
record can be refused with it.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from confluent_kafka import KafkaError

from pgcdc.core.contract import (
    HEADER_COMMIT_LSN,
    HEADER_ORDER,
    decode_part,
    table_of_topic,
)
from pgcdc.core.lsn import Lsn

# Kafka's answers that no retry changes: the record itself is the problem.
PERMANENT_REFUSALS: Final = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_TIMESTAMP,
    }
)
SETTING: Final = "kafka.unproducible_records"
SETTING_ENV: Final = "CDC_KAFKA__UNPRODUCIBLE_RECORDS"
# A letter carries the refused value when it is at most this large, else only its size: the
# dead-letter topic keeps Kafka's default 1 MB limit.
LETTER_VALUE_LIMIT: Final = 256 * 1024
KEY_SHOWN_CHARS: Final = 200  # how much of a key the one-line error shows
JOB: Final = "cdc-reader"  # the letter's "job", beside the sync jobs' names

# Headers as the producer takes them and as a delivered message gives them back.
RecordHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


@dataclass(frozen=True)
class RefusedRecord:
    """A record Kafka refused, as the reader produced it."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, str | bytes | None]]
    reason: str  # Kafka's words
    value_size: int = -1  # when the value is not kept (too large for a letter)

    @classmethod
    def of(
        cls,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: RecordHeaders | None,
        reason: str,
    ) -> RefusedRecord:
        """The refused record, keeping its value only if a letter can carry it."""
        size = -1 if value is None else len(value)
        kept = value if value is not None and len(value) <= LETTER_VALUE_LIMIT else None
        pairs = tuple(headers.items() if isinstance(headers, Mapping) else headers or ())
        return cls(topic, key, kept, pairs, reason, size)

    @property
    def size(self) -> int:
        """The value's size in bytes (0 for a tombstone)."""
        return len(self.value) if self.value is not None else max(self.value_size, 0)


def is_permanent(code: int) -> bool:
    """Whether Kafka's error code means the record can never be produced as it is."""
    return code in PERMANENT_REFUSALS


def table_name(prefix: str, topic: str) -> str:
    """``schema.table`` of a table topic (names decoded), else the topic itself."""
    parts = table_of_topic(prefix, topic).split(".")
    if topic.startswith(prefix + ".") and len(parts) == 2:
        try:
            return ".".join(decode_part(p) for p in parts)
        except ValueError:  # a shortened name: the topic says it best
            return topic
    return topic


def _header(headers: Sequence[tuple[str, str | bytes | None]], name: str) -> int | None:
    for k, v in headers:
        if k == name and v is not None:
            try:
                return int(v)
            except ValueError:
                return None
    return None


def key_text(key: bytes | None) -> str:
    """The key as a person reads it: the JSON key's payload, else its text, else base64."""
    if key is None:
        return "null"
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(key).decode()
    try:
        doc = orjson.loads(key)
    except orjson.JSONDecodeError:
        return text
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc:
        doc = doc["payload"]
    return orjson.dumps(doc).decode()


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fail_message(record: RefusedRecord, prefix: str, dead_letter_topic: str) -> str:
    """The one line the reader stops with: table, key, reason, position, the way past it."""
    lsn = _header(record.headers, HEADER_COMMIT_LSN)
    where = f" (commit LSN {Lsn(lsn)})" if lsn is not None else ""
    return (
        f"Kafka refused a record of table {table_name(prefix, record.topic)} with key "
        f"{_shorten(key_text(record.key), KEY_SHOWN_CHARS)} for good: {record.reason} "
        f"({record.size} bytes){where}; nothing after it is acknowledged. To write such "
        f"records to the dead-letter topic {dead_letter_topic} and go on, set "
        f"{SETTING}=dead_letter ({SETTING_ENV}=dead_letter)"
    )


def letter(record: RefusedRecord, prefix: str) -> bytes:
    """The dead letter's value: reason, topic, table, key, commit LSN, order in the
    transaction (when known: a broker's refusal does not tell it), and the value if it fits.

    A UTF-8 value (JSON events) is carried as text, any other (Avro) as base64; a value over
    :data:`LETTER_VALUE_LIMIT` as its size only.
    """
    doc: dict[str, Any] = {
        "job": JOB,
        "reason": record.reason,
        "topic": record.topic,
        "table": table_of_topic(prefix, record.topic),
        "key": None if record.key is None else key_text(record.key),
        "commit_lsn": _header(record.headers, HEADER_COMMIT_LSN),
        "order": _header(record.headers, HEADER_ORDER),
        "value_bytes": record.size,
        "value": None,
        "ts_ms": int(time.time() * 1000),
    }
    value = record.value
    if value is not None and len(value) <= LETTER_VALUE_LIMIT:
        try:
            doc["value"] = value.decode()
        except UnicodeDecodeError:
            doc["value_base64"] = base64.b64encode(value).decode()
    return orjson.dumps(doc)
