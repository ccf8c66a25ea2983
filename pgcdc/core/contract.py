"""What crosses Kafka between the reader and the sync jobs: the one definition.

The reader (``cdc``) writes records by these rules and the jobs (``spark_jobs``, ``sinks``)
read them by the same rules; both import this module, so the two sides cannot drift apart.
Standard library only.

- **Topics.** Every captured table has ``<prefix>.<schema>.<table>`` (compacted, keyed by
  primary key); the reader's heartbeats go to ``__cdc-heartbeat.<prefix>``, its durable state
  to ``<prefix>.__cdc_state``; records a follower cannot apply go to the dead-letter topic.
- **Headers.** Every change record carries its transaction's commit LSN and its position in
  the transaction (:data:`HEADER_COMMIT_LSN`, :data:`HEADER_ORDER`), as decimal ASCII. The
  pair is the record's :class:`VersionOrder`: followers apply a change only when its version
  is newer than the one they hold.
- **Heartbeats.** Key ``{"serverName": <prefix>}``, value ``{"ts_ms": …, "lsn": …}``: every
  change committed before ``lsn`` is already in its topic (the followers' watermark).
- **Unchanged TOAST values** that an event could not carry are Debezium's placeholder
  :data:`UNAVAILABLE_VALUE_PLACEHOLDER`, typed per column (text; the placeholder's bytes, or
  their base64 or hex text, in binary columns; a one-element array in arrays of text; null
  where the type has no room for it), and the record's :data:`HEADER_UNCHANGED` header names
  those columns, so a follower knows them whatever their type.
- **Truncates.** A TRUNCATE becomes a delete and a tombstone for every key live in the table's
  topic; Debezium's ``t`` event (unless ``postgres.skipped_operations`` skips it) goes to the
  table topic of a keyless table and to :func:`truncate_topic` for the others.
- **Keyless tables** (no primary key, replica identity index or ``message_key_columns``) have
  a table topic with ``cleanup.policy=delete`` and records with a null key.
- **Followers** record their watermark per job (:data:`JOBS`) under
  :func:`redis_watermark_key` and in the index :func:`search_watermark_index`, with the time
  it last advanced (:func:`redis_watermark_time_key`, the document's ``updated_at_ms``).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from typing import Final, NamedTuple, Protocol, TypeAlias

# -- headers -------------------------------------------------------------------------------

HEADER_COMMIT_LSN: Final = "cdc.commit_lsn"
HEADER_ORDER: Final = "cdc.order"
# Columns whose value an event left out (unchanged TOAST): comma-separated names, each
# percent-encoded for "%" and "," (see encode_unchanged_header).
HEADER_UNCHANGED: Final = "cdc.unchanged"

# Record headers as confluent-kafka takes them.
Headers: TypeAlias = list[tuple[str, str | bytes | None]]


class VersionOrder(NamedTuple):
    """Where a change stands in the log: its transaction's commit LSN, then its position in
    that transaction. Tuples compare in that order, which is commit order per key."""

    commit_lsn: int
    order: int

    def headers(self) -> Headers:
        """The record headers that carry this version."""
        return version_headers(str(self.commit_lsn).encode(), self.order)


def version_headers(commit_lsn: bytes, order: int) -> Headers:
    """Headers for a change at ``order`` in the transaction committed at ``commit_lsn``
    (decimal ASCII, precomputed once per transaction by the reader's hot path)."""
    return [(HEADER_COMMIT_LSN, commit_lsn), (HEADER_ORDER, str(order).encode())]


def encode_unchanged_header(columns: Iterable[str]) -> bytes:
    """The :data:`HEADER_UNCHANGED` value naming ``columns``: comma-separated, with ``%`` and
    ``,`` in a name written ``%25`` and ``%2C`` (UTF-8)."""
    return ",".join(c.replace("%", "%25").replace(",", "%2C") for c in columns).encode()


_UNCHANGED_ESCAPE: Final = re.compile("%(25|2C)")


def _unescape(m: re.Match[str]) -> str:
    return "%" if m.group(1) == "25" else ","


def decode_unchanged_header(value: bytes | str | None) -> frozenset[str]:
    """The column names a :data:`HEADER_UNCHANGED` value lists (empty for None or empty)."""
    if not value:
        return frozenset()
    text = value.decode() if isinstance(value, bytes) else value
    return frozenset(_UNCHANGED_ESCAPE.sub(_unescape, c) for c in text.split(","))


# -- names ---------------------------------------------------------------------------------
#
# PostgreSQL allows any character in a schema or table name (dots, quotes, spaces, upper case,
# unicode). Topic names, index names and Redis keys are built from them by encodings that are
# injective (two tables never share a topic, an index or a key) and leave plain lower-case
# names ([a-z0-9_]) unchanged:
#
# - a *topic part* keeps [A-Za-z0-9_] and writes every other character as ``-HH`` per UTF-8
#   byte (upper-case hex): ``order.items`` → ``order-2Eitems``, ``Café`` → ``Caf-C3-A9``;
# - an *index part* (OpenSearch names are lower case) keeps [a-z0-9_] and writes every other
#   character, upper-case letters included, as ``-hh`` (lower-case hex): ``Orders`` → ``-4frders``.
#
# ``-`` always starts an escape, so decoding is unambiguous. ``.`` appears only between the
# prefix, the schema and the table. A name too long for Kafka (249) or OpenSearch (255 bytes)
# is cut and ends in ``--`` and 16 hex digits of its SHA-256 (``--`` never occurs otherwise).

_TOPIC_KEEP: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_INDEX_KEEP: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
_ESCAPE: Final = re.compile(r"-([0-9A-Fa-f]{2})")
MAX_TOPIC_LENGTH: Final = 249
MAX_INDEX_NAME_BYTES: Final = 255

DEFAULT_DEAD_LETTER_TOPIC: Final = "cdc.dlq"


def _encode(name: str, keep: frozenset[str], hex_format: str) -> str:
    out = []
    for c in name:
        if c in keep:
            out.append(c)
        else:
            out.extend("-" + format(b, hex_format) for b in c.encode())
    return "".join(out)


def encode_topic_part(name: str) -> str:
    """A schema or table name as it stands in a topic name (see the names note above)."""
    return _encode(name, _TOPIC_KEEP, "02X")


def encode_index_part(name: str) -> str:
    """A schema or table name as it stands in an OpenSearch index name (lower case)."""
    return _encode(name, _INDEX_KEEP, "02x")


def decode_part(part: str) -> str:
    """The name a topic or index part encodes (hashed long names cannot be decoded)."""
    if "--" in part:
        raise ValueError(f"{part!r} is a shortened name and cannot be decoded")
    raw = bytearray()
    i = 0
    while i < len(part):
        m = _ESCAPE.match(part, i)
        if m:
            raw.append(int(m.group(1), 16))
            i = m.end()
        else:
            raw.extend(part[i].encode())
            i += 1
    return raw.decode()


def fit_name(name: str, limit: int) -> str:
    """``name`` if it fits ``limit`` bytes, else a cut of it plus ``--`` and a hash."""
    if len(name.encode()) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return name[: limit - 18].rstrip("-") + "--" + digest


def table_id(schema: str, table: str) -> str:
    """``<schema>.<table>`` with each part encoded as in topic names: how the followers name
    a table (Redis keys, dead letters), recovered from a topic by :func:`table_of_topic`."""
    return f"{encode_topic_part(schema)}.{encode_topic_part(table)}"


def table_topic(prefix: str, schema: str, table: str) -> str:
    """``<prefix>.<schema>.<table>`` with the parts encoded (see the names note above)."""
    return fit_name(f"{prefix}.{table_id(schema, table)}", MAX_TOPIC_LENGTH)


def table_of_topic(prefix: str, topic: str) -> str:
    """The table id (``<schema>.<table>``, encoded) of a table topic of ``prefix``."""
    head = prefix + "."
    return topic[len(head) :] if topic.startswith(head) else topic


def table_index(index_prefix: str, table_id_: str) -> str:
    """The OpenSearch index of a table id: ``<index_prefix>-<schema>.<table>`` with the parts
    re-encoded for index names (lower case), e.g. ``cdc-public.orders``."""
    parts = table_id_.split(".")
    if len(parts) != 2:
        raise ValueError(f"table id {table_id_!r} is not <schema>.<table>")
    encoded = ".".join(
        encode_index_part(decode_part(p)) if "--" not in p else p.lower() for p in parts
    )
    return fit_name(f"{index_prefix.lower()}-{encoded}", MAX_INDEX_NAME_BYTES)


def document_index(index_prefix: str, name: str) -> str:
    """The OpenSearch index of the declared document ``name`` (``[[search.documents]]``):
    ``<index_prefix>-<name>``, e.g. ``cdc-products``. A document's name is lower-case
    letters, digits and ``_`` (checked by the settings), so it never holds the dot of every
    table's index (``cdc-public.products``) nor the ``-`` of the watermark index or of an
    index's next version (``-v2``): the names cannot meet."""
    return fit_name(f"{index_prefix.lower()}-{name}", MAX_INDEX_NAME_BYTES)


def table_topic_pattern(prefix: str) -> str:
    """A regular expression (Java's, matched against the whole name) for every table topic
    of ``prefix``: ``<prefix>.<schema>.<table>``, nothing else."""
    return rf"{re.escape(prefix)}\.[^.]+\.[^.]+"


def truncate_topic(prefix: str) -> str:
    """The topic (``cleanup.policy=delete``) holding Debezium's ``t`` events of keyed tables,
    keyed by ``<schema>.<table>``: a compacted table topic refuses their null key."""
    return f"{prefix}.__cdc_truncates"


def state_topic(prefix: str) -> str:
    """The compacted topic holding the reader's durable state."""
    return f"{prefix}.__cdc_state"


class HeartbeatConfig(Protocol):
    """The Kafka settings that decide the heartbeat topic."""

    @property
    def topic_prefix(self) -> str: ...
    @property
    def heartbeat_topic(self) -> str | None: ...
    @property
    def heartbeat_enabled(self) -> bool: ...


def heartbeat_topic(kafka: HeartbeatConfig) -> str | None:
    """The heartbeat topic, None when heartbeats are off: ``__cdc-heartbeat.<prefix>`` unless
    set, after Debezium's ``__debezium-heartbeat.<prefix>``."""
    if not kafka.heartbeat_enabled:
        return None
    return kafka.heartbeat_topic or f"__cdc-heartbeat.{kafka.topic_prefix}"


HEARTBEAT_SERVER_FIELD: Final = "serverName"
HEARTBEAT_LSN_FIELD: Final = "lsn"

# -- values --------------------------------------------------------------------------------

# Debezium's placeholder for unchanged TOAST values (unavailable.value.placeholder).
UNAVAILABLE_VALUE_PLACEHOLDER: Final = "__debezium_unavailable_value"
UNAVAILABLE_VALUE_PLACEHOLDER_B64: Final = base64.b64encode(
    UNAVAILABLE_VALUE_PLACEHOLDER.encode()
).decode()
UNAVAILABLE_VALUE_PLACEHOLDER_HEX: Final = UNAVAILABLE_VALUE_PLACEHOLDER.encode().hex()
UNAVAILABLE_VALUE_PLACEHOLDERS: Final = (
    UNAVAILABLE_VALUE_PLACEHOLDER,
    UNAVAILABLE_VALUE_PLACEHOLDER_B64,
)
# Every text a follower takes for the placeholder: Debezium writes it as text, as
# one-element arrays for array columns, and as the placeholder's bytes for binary columns:
# base64 or hex text, by binary.handling.mode.
PLACEHOLDER_TEXTS: Final = frozenset(
    (
        *UNAVAILABLE_VALUE_PLACEHOLDERS,
        UNAVAILABLE_VALUE_PLACEHOLDER_HEX,
        UNAVAILABLE_VALUE_PLACEHOLDER_HEX.upper(),
    )
)

# -- followers -----------------------------------------------------------------------------

CACHE_JOB: Final = "cache_sync"
SEARCH_JOB: Final = "search_sync"
JOBS: Final = (CACHE_JOB, SEARCH_JOB)
SYNC_JOB: Final = "sync"  # spark_jobs/sync.py: one job keeping several followers
# spark_jobs/documents_sync.py: the joined documents ([[search.documents]]); not a follower of
# tables, so not among JOBS.
DOCUMENTS_JOB: Final = "documents_sync"

SEARCH_WATERMARK_SUFFIX: Final = "cdc-watermarks"


def redis_watermark_key(key_prefix: str, job: str) -> str:
    """The Redis key holding ``job``'s watermark LSN (20 decimal digits, only increasing)."""
    return f"{key_prefix}:__watermark__:{job}"


def redis_watermark_time_key(key_prefix: str, job: str) -> str:
    """The Redis key holding when ``job``'s watermark last advanced (Unix milliseconds)."""
    return f"{key_prefix}:__watermark_at__:{job}"


def search_watermark_index(index_prefix: str) -> str:
    """The OpenSearch index holding one document per job with its watermark LSN."""
    return f"{index_prefix}-{SEARCH_WATERMARK_SUFFIX}".lower()
