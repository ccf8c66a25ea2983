"""OpenSearch index layout: index names, index settings, and mappings from Connect schemas.

Pure code, no I/O. One index per table, named by the contract's
:func:`~pgcdc.core.contract.table_index`: ``<index_prefix>-<schema>.<table>`` with each part
encoded for index names (plain lower-case names unchanged; upper case, dots, spaces, quotes
and unicode escaped as ``-hh``, so ``Orders`` and ``orders`` get indices of their own), and
one index for the followers' watermarks.

Every table index keeps each row's digest (:mod:`pgcdc.core.row_digest`) beside it in
:data:`~pgcdc.core.row_digest.FIELD`, mapped for aggregations and left out of ``_source``, so
``cdc verify`` folds a range of rows inside OpenSearch while ``_source`` stays exactly the
row. That field is never a column (its name is longer than any PostgreSQL identifier): what
compares an index's mapping with a table's columns looks at the columns alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from pgcdc.core import row_digest
from pgcdc.core.contract import table_index
from pgcdc.core.errors import ConfigError, SinkError

# OpenSearch's rules for index names: lower case, at most 255 bytes, not "." or "..",
# not starting with "-", "_" or "+", and none of these characters.
_FORBIDDEN_CHARS: Final = frozenset('\\/*?"<>| ,#:')
_MAX_INDEX_NAME_BYTES: Final = 255

# Delete tombstones keep their external version for index.gc_deletes. Within that window a
# late, older index request for a deleted document is rejected as stale; after it, the
# older write would resurrect the document. The default (60s) is shorter than a Spark job's
# restart-and-replay, so our indices keep tombstones for a day (Kafka's default
# delete.retention.ms), at the price of a little heap per recent delete.
DEFAULT_GC_DELETES: Final = "24h"

# The index of the followers' watermarks: one document per job (search_watermark_index).
WATERMARK_MAPPING: Final[dict[str, Any]] = {
    "dynamic": False,
    "properties": {
        "job": {"type": "keyword"},
        "lsn": {"type": "long"},
        "updated_at_ms": {"type": "date", "format": "epoch_millis"},
    },
}

# What a field's ``meta`` records of a column mapped when a schema first had it: the commit
# LSN of a change in that shape (new_columns). OpenSearch takes keys of at most 20
# characters, values as strings.
SHAPE_LSN_META: Final = "pgcdc_shape_lsn"

_KEYWORD_IGNORE_ABOVE: Final = 256
_TEXT: Final[dict[str, Any]] = {
    "type": "text",
    "fields": {"keyword": {"type": "keyword", "ignore_above": _KEYWORD_IGNORE_ABOVE}},
}

# Connect schema types without a semantic name.
_PLAIN_TYPES: Final[dict[str, dict[str, Any]]] = {
    "int8": {"type": "byte"},
    "int16": {"type": "short"},
    "int32": {"type": "integer"},
    "int64": {"type": "long"},
    # JsonConverter's schema names for FLOAT32/FLOAT64 (what the reader writes), and the
    # Connect type names some other producers write.
    "float": {"type": "float"},
    "double": {"type": "double"},
    "float32": {"type": "float"},
    "float64": {"type": "double"},
    "boolean": {"type": "boolean"},
    "string": _TEXT,
    # JsonConverter writes bytes as base64, which is what OpenSearch's binary type takes.
    "bytes": {"type": "binary"},
}

# ISO-8601 strings with any fraction: "date" keeps milliseconds for range queries, and the
# exact text stays in _source. A value that is not a date (PostgreSQL's 'infinity') is kept
# in _source and left out of the index instead of failing the whole document.
_ISO_DATE: Final[dict[str, Any]] = {
    "type": "date",
    "format": "strict_date_optional_time",
    "ignore_malformed": True,
}
# Dates, and timestamps with a zone (always one: ZonedTimestamp is UTC with "Z"), read by
# OpenSearch's hand-written RFC 3339 parser (2.12+): java.time's strict_date_optional_time
# cost OpenSearch 6 us of its 37-43 a document of the benchmarks' rows (two such columns;
# 50,000 documents, medians of 5 rounds; 8 % of its CPU profile). It indexes every value
# of these types as strict_date_optional_time does, to the millisecond, but a zoned year
# before 1 or beyond 9999 ("-0914-07-02T21:41:18Z", "+10000-01-01T00:00:00Z"; PostgreSQL
# goes from 4713 BC to 294276): like 'infinity' and BC dates, that stays in _source and out
# of the index (tests/integration/test_search_dates.py, docs/production.md). Timestamps
# without a zone, which it refuses, keep _ISO_DATE. Not both: with
# "rfc3339_lenient||strict_date_optional_time" OpenSearch parses through java.time as slowly.
RFC3339_FORMAT: Final = "rfc3339_lenient"
_RFC3339_DATE: Final[dict[str, Any]] = {
    "type": "date",
    "format": RFC3339_FORMAT,
    "ignore_malformed": True,
}

# Debezium and Connect semantic types (the field's "name"). The sync jobs hand the sinks
# natural values (spark_jobs/convert.py), not Debezium's compact encodings: dates and
# timestamps as ISO-8601 text, times of day as "HH:MM:SS.ffffff", decimals as exact text.
_NUMBER_FROM_TEXT: Final[dict[str, Any]] = {"type": "double", "ignore_malformed": True}
_SEMANTIC_TYPES: Final[dict[str, dict[str, Any]]] = {
    "io.debezium.time.Date": _RFC3339_DATE,
    "org.apache.kafka.connect.data.Date": _RFC3339_DATE,
    "io.debezium.time.Timestamp": _ISO_DATE,
    "org.apache.kafka.connect.data.Timestamp": _ISO_DATE,
    "io.debezium.time.MicroTimestamp": _ISO_DATE,
    "io.debezium.time.NanoTimestamp": _ISO_DATE,
    "io.debezium.time.ZonedTimestamp": _RFC3339_DATE,
    "io.debezium.time.IsoTimestamp": _ISO_DATE,
    "io.debezium.time.Time": {"type": "keyword"},
    "org.apache.kafka.connect.data.Time": {"type": "keyword"},
    "io.debezium.time.MicroTime": {"type": "keyword"},
    "io.debezium.time.NanoTime": {"type": "keyword"},
    "io.debezium.time.MicroDuration": {"type": "long"},
    # Times of day with a zone, intervals as ISO durations: exact terms.
    "io.debezium.time.ZonedTime": {"type": "keyword"},
    "io.debezium.time.IsoTime": {"type": "keyword"},
    "io.debezium.time.IsoDate": {"type": "keyword"},
    "io.debezium.time.Interval": {"type": "keyword"},
    # Decimals arrive as exact text: _source keeps it exact, the index holds a double for
    # range queries and sorting ("NaN" and other non-numbers stay out of the index).
    "org.apache.kafka.connect.data.Decimal": _NUMBER_FROM_TEXT,
    "io.debezium.data.VariableScaleDecimal": _NUMBER_FROM_TEXT,
    # JSON documents arrive as text: full-text searchable, no mapping explosion from their
    # keys, and any shape is accepted.
    "io.debezium.data.Json": {"type": "text"},
    "io.debezium.data.Xml": {"type": "text"},
    "io.debezium.data.Uuid": {"type": "keyword"},
    "io.debezium.data.Enum": {"type": "keyword"},
    "io.debezium.data.EnumSet": {"type": "keyword"},
    "io.debezium.data.Ltree": {"type": "keyword"},
    "io.debezium.data.Bits": {"type": "binary"},
}


def index_name(index_prefix: str, table: str) -> str:
    """The index of ``table``, a table id as the jobs take it from the topic
    (``<schema>.<table>``, parts encoded as in topic names: :func:`~pgcdc.core.contract.table_id`).

    Injective: two tables never share an index. SinkError if ``table`` is no table id or
    OpenSearch would refuse the name (an unusable prefix).
    """
    try:
        name = table_index(index_prefix, table)
    except ValueError as e:
        raise SinkError(f"table {table!r} is not a table id <schema>.<table>: {e}") from e
    problem = _index_name_problem(name)
    if problem:
        raise SinkError(f"table {table!r} gives index name {name!r}, which {problem}")
    return name


def check_index_prefix(index_prefix: str) -> None:
    """ConfigError unless ``index_prefix`` can start valid index names."""
    problem = _index_name_problem(f"{index_prefix}-x".lower())
    if not index_prefix or problem:
        raise ConfigError(f"search index prefix {index_prefix!r} is not usable: {problem}")


def _index_name_problem(name: str) -> str | None:
    if name in {".", ".."}:
        return "is reserved"
    if name[0] in "-_+":
        return "starts with '-', '_' or '+'"
    bad = sorted(set(name) & _FORBIDDEN_CHARS)
    if bad:
        return f"contains forbidden characters {''.join(bad)!r}"
    if len(name.encode()) > _MAX_INDEX_NAME_BYTES:
        return f"is longer than {_MAX_INDEX_NAME_BYTES} bytes"
    return None


def index_settings(
    gc_deletes: str = DEFAULT_GC_DELETES,
    *,
    shards: int = 1,
    replicas: int = 0,
    refresh_interval: str = "1s",
) -> dict[str, Any]:
    """Settings for our indices (``search.number_of_shards``, ``number_of_replicas``,
    ``refresh_interval``; the defaults suit a single node)."""
    return {
        "index": {
            "number_of_shards": shards,
            "number_of_replicas": replicas,
            "refresh_interval": refresh_interval,
            "gc_deletes": gc_deletes,
        }
    }


def dynamic_mapping(*, digest: bool = True) -> dict[str, Any]:
    """Mapping for a table whose schema is unknown: fields are typed by their first value.

    Date detection is off, so a string column whose first value looks like a date stays a
    string and later values cannot fail to parse. With ``digest`` (a table's index) the row
    digest's field is mapped and left out of ``_source`` (:func:`keeps_digest` holds for it);
    the joined documents' indices keep none.
    """
    if not digest:
        return {"dynamic": True, "date_detection": False}
    return {
        "dynamic": True,
        "date_detection": False,
        "_source": {"excludes": [row_digest.FIELD]},
        "properties": row_digest.mapping_properties(),
    }


def keeps_digest(mapping: Mapping[str, Any]) -> bool:
    """Whether an index of ``mapping`` (its ``mappings`` as OpenSearch answers them) leaves
    the row digest's field out of ``_source``: only then may a document carry it, unseen."""
    source = mapping.get("_source") or {}
    return row_digest.FIELD in (source.get("excludes") or ())


def mapping_from_connect_schema(
    fields: Sequence[Mapping[str, Any]], *, digest: bool = True
) -> dict[str, Any]:
    """An OpenSearch mapping for a row from its Connect schema fields.

    ``fields`` is the ``fields`` list of the row struct (the envelope's ``after``), each a
    Connect schema with ``field``, ``type`` and optionally ``name`` and ``items``. Columns
    added later are mapped when a schema with them is met (:func:`new_columns`); a value
    of a column no schema told is mapped dynamically. Unknown semantic names fall back to
    the plain Connect type. The row digest's field is mapped as in :func:`dynamic_mapping`
    (with ``digest``).
    """
    mapping = dynamic_mapping(digest=digest)
    mapping["properties"] = {**_properties(fields), **mapping.get("properties", {})}
    return mapping


def row_fields(value_schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The row struct's fields from a Debezium envelope schema (its ``after`` field)."""
    for f in value_schema.get("fields", []):
        if f.get("field") == "after":
            return list(f.get("fields", []))
    raise SinkError("the value schema has no 'after' field: not a Debezium envelope")


def _properties(fields: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for f in fields:
        name = f.get("field")
        if not isinstance(name, str) or not name:
            raise SinkError(f"a Connect schema field has no name: {dict(f)!r}")
        props[name] = field_mapping(f)
    return props


def field_mapping(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenSearch mapping of one Connect schema."""
    semantic = schema.get("name")
    if isinstance(semantic, str) and semantic in _SEMANTIC_TYPES:
        return dict(_SEMANTIC_TYPES[semantic])
    kind = schema.get("type")
    if kind == "array":
        # OpenSearch fields hold arrays of their type.
        items = schema.get("items")
        return field_mapping(items) if isinstance(items, Mapping) else dict(_TEXT)
    if kind == "struct":
        # Geometry values and other structs keep their shape.
        return {"type": "object", "properties": _properties(schema.get("fields", []))}
    if kind == "map":
        # Arbitrary keys would grow the mapping without bound.
        return {"type": "object", "enabled": False}
    if isinstance(kind, str) and kind in _PLAIN_TYPES:
        return dict(_PLAIN_TYPES[kind])
    # Unknown types are passed through as strings (design guarantee 6).
    return dict(_TEXT)


# Which values a mapped field takes: a string field takes any scalar as text; a whole-number
# field takes narrower whole numbers; a floating one any number no wider than itself.
_STRING_TYPES: Final = frozenset({"text", "keyword", "match_only_text", "wildcard"})
_WHOLE: Final = ("byte", "short", "integer", "long")
_FLOATING: Final = ("half_float", "float", "double")


def _opensearch_at_least(info: Mapping[str, Any], release: tuple[int, int]) -> bool:
    """Whether the server that answered ``info`` (its ``GET /``) is OpenSearch ``release``
    (major, minor) or later: False for Elasticsearch and for a version not read."""
    version = info.get("version") or {}
    if version.get("distribution") != "opensearch":
        return False
    try:
        major, minor = (int(x) for x in str(version.get("number", "")).split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= release


def reads_rfc3339(info: Mapping[str, Any]) -> bool:
    """Whether the server that answered ``info`` (its ``GET /``) has the ``rfc3339_lenient``
    date format: OpenSearch 2.12 or later (Elasticsearch and older OpenSearch refuse a
    mapping that names it)."""
    return _opensearch_at_least(info, (2, 12))


def drops_recovery_source(info: Mapping[str, Any]) -> bool:
    """Whether the server that answered ``info`` takes ``_source.recovery_source_enabled``
    (:func:`without_recovery_source`): OpenSearch 2.15 or later (Elasticsearch and older
    OpenSearch refuse a mapping that names it)."""
    return _opensearch_at_least(info, (2, 15))


# The _source mapping parameter that keeps no _recovery_source (OpenSearch 2.15+).
RECOVERY_SOURCE_FLAG = "recovery_source_enabled"


def without_recovery_source(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` (an index's) that keeps no ``_recovery_source`` beside a ``_source`` it
    filters, for a server that takes it (:func:`drops_recovery_source`); any other mapping as
    it is.

    OpenSearch stores a second copy of each document, the one sent, whenever ``_source``
    leaves something out (the row digest here), so that a replica recovered from the
    primary's operations gets it whole. Measured with the benchmark's rows
    (``python -m benchmarks.search_mapping_cost``): the copy took 40 % of the index's store
    (21.3 against 12.6 MB a 100,000 documents) and about 1.7 µs of OpenSearch's CPU a
    document. Without it, a replica recovered that way holds those documents without their
    digest: what they hold otherwise is the same, and ``cdc verify`` reads each of them back
    (as it reads a document another writer rewrote)."""
    source = mapping.get("_source")
    if not isinstance(source, Mapping) or not (source.get("excludes") or source.get("includes")):
        return dict(mapping)
    return {**mapping, "_source": {**source, RECOVERY_SOURCE_FLAG: False}}


def with_recovery_source(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` without :data:`RECOVERY_SOURCE_FLAG`: what a server that refuses it takes
    (a cluster whose manager is older than the node that answered for its version, in a
    rolling upgrade)."""
    source = mapping.get("_source")
    if not isinstance(source, Mapping) or RECOVERY_SOURCE_FLAG not in source:
        return dict(mapping)
    return {
        **mapping,
        "_source": {k: v for k, v in source.items() if k != RECOVERY_SOURCE_FLAG},
    }


def strict_dates(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` (an index's or a field's) with each field of the ``rfc3339_lenient``
    format, nested ones too, read as strict_date_optional_time instead, for a server without
    that format (:func:`reads_rfc3339`)."""
    out = dict(mapping)
    if out.get("type") == "date" and out.get("format") == RFC3339_FORMAT:
        out["format"] = _ISO_DATE["format"]
    if isinstance(out.get("properties"), Mapping):
        out["properties"] = strict_properties(out["properties"])
    return out


def strict_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`strict_dates` of each field of ``properties``."""
    return {k: strict_dates(v) if isinstance(v, Mapping) else v for k, v in properties.items()}


def takes(held: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether an index field mapped as ``held`` takes every value of a column that would now
    be mapped as ``wanted`` (:func:`field_mapping`): False means OpenSearch refuses some (a
    text column into an ``integer`` field, ``'many-3'``)."""
    a, b = str(held.get("type", "object")), str(wanted.get("type", "object"))
    if a == b:
        if a == "date" and held.get("format") == RFC3339_FORMAT:
            # A timestamp without a zone is no RFC 3339 date: it would be left out of the
            # index (ignore_malformed), every one of them.
            return wanted.get("format") == RFC3339_FORMAT
        if a == "object":
            inner = held.get("properties") or {}
            return all(
                takes(inner[k], v)
                for k, v in (wanted.get("properties") or {}).items()
                if k in inner
            )
        return True
    if a in _STRING_TYPES:
        return b != "object"
    if a in _WHOLE and b in _WHOLE:
        return _WHOLE.index(b) <= _WHOLE.index(a)
    if a in _FLOATING:
        return b in _WHOLE or (b in _FLOATING and _FLOATING.index(b) <= _FLOATING.index(a))
    return False


def new_columns(
    live: Mapping[str, Any], fields: Sequence[Mapping[str, Any]], shape_lsn: int | None
) -> dict[str, Any]:
    """The mappings of the columns of ``fields`` that the index's ``live`` properties do not
    map yet, each (but an object, which takes no ``meta``) recording ``shape_lsn``, the commit
    LSN of a change in the shape they are mapped from (:func:`mapped_after`)."""
    out = {}
    for column, mapping in _properties(fields).items():
        if column in live or column == row_digest.FIELD:
            continue
        if shape_lsn is not None and mapping.get("type", "object") != "object":
            mapping["meta"] = {SHAPE_LSN_META: str(shape_lsn)}
        out[column] = mapping
    return out


def mapped_after(held: Mapping[str, Any], lsn: int) -> bool:
    """Whether the index field mapped as ``held`` was mapped from the shape of a change
    committed after ``lsn`` (:func:`new_columns`)."""
    got = (held.get("meta") or {}).get(SHAPE_LSN_META)
    return isinstance(got, str) and got.isdigit() and int(got) > lsn


def newer_columns(
    live: Mapping[str, Any], fields: Sequence[Mapping[str, Any]], lsn: int
) -> list[str]:
    """The columns of ``fields`` (the shape of a change committed at ``lsn``) that the index
    maps so that it refuses some of their values, as a column of another shape mapped from a
    change committed after ``lsn``: the table's shape changed after that change, so the
    reader's snapshot of the table after the change of shape brings its row again."""
    return [
        column for column, _, _ in refused_columns(live, fields) if mapped_after(live[column], lsn)
    ]


def refused_columns(
    live: Mapping[str, Any], fields: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """(column, type in the index, type it would take now) for each column of ``fields`` (a
    row struct's Connect schema) that the index's ``live`` properties map so that some of
    its values are refused. Columns the index does not map yet are not compared
    (:func:`new_columns` maps them); the row digest's field is no column, never compared."""
    out = []
    for column, wanted in _properties(fields).items():
        held = live.get(column) if column != row_digest.FIELD else None
        if held is not None and not takes(held, wanted):
            out.append((column, str(held.get("type", "object")), str(wanted.get("type", "object"))))
    return out
