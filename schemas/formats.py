"""How a table's change events become Kafka record bytes: one strategy per value format.

:class:`JsonFormat` writes Kafka Connect JsonConverter documents (``{"schema", "payload"}``,
or the payload alone when schemas are off); :class:`AvroFormat` writes Avro binary, framed
with the schema id when it is given a schema registry. :func:`format_for` picks one from the
settings; the encoder (:class:`schemas.envelope.EventEncoder`) builds the envelope itself
and hands the rows and the envelope to its format.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Protocol

import fastavro
import orjson

from pgcdc.core.errors import SchemaError
from pgcdc.core.settings import SchemaSettings, ValueFormat
from pgcdc.core.values import RawValue
from schemas.avro import (
    MAGIC_BYTE,
    SINGLE_OBJECT_HEADER,
    SINGLE_OBJECT_MARKER,
    AvroPlan,
    avro_plan,
    decode_key,
    frame,
    serialize,
    single_object,
    write_schema_file,
)
from schemas.connect import NonFiniteFloat
from schemas.plan import FAST_PATH_ERRORS, EncodePlan
from schemas.registry import SchemaRegistryClient
from schemas.rowfuncs import KeyColumnNull

Row = dict[str, Any]
_STRING_KEY_SCHEMA = {"type": "string", "optional": False}
_AVRO_STRING = fastavro.parse_schema("string")


class SchemaRegistry(Protocol):
    """What the Avro format needs from a schema registry (:class:`SchemaRegistryClient`)."""

    def register(self, subject: str, schema: Any) -> int:
        """Register ``schema`` under ``subject``; its id."""
        ...


class EventFormat(Protocol):
    """Turns a table's rows and envelopes into record keys and values."""

    def row(self, plan: EncodePlan, values: Sequence[RawValue]) -> Row:
        """One row's values in the form this format serialises."""
        ...

    def encode_key(self, plan: EncodePlan, values: Sequence[RawValue]) -> bytes:
        """The record key of a row (the table has key columns)."""
        ...

    def encode_value(self, plan: EncodePlan, payload: Row) -> bytes:
        """The record value: an envelope payload whose rows came from :meth:`row`."""
        ...

    def decode_key(self, plan: EncodePlan, key: bytes) -> Row | None:
        """A record key's value (field → value as this format reads it), or None when
        ``key`` is not a key of this table in this format."""
        ...

    def encode_name_key(self, name: str, subject: str) -> bytes:
        """A key that is a string (the truncate topic's ``schema.table``), registered under
        ``subject`` where the format registers schemas."""
        ...

    def key_and_rows(
        self, plan: EncodePlan, before: Sequence[RawValue] | None, after: Sequence[RawValue] | None
    ) -> tuple[bytes | None, Row | None, Row | None]:
        """A change's record key and its rows: the same as :meth:`encode_key` of the keyed
        row (``after``, else ``before``; None when the table has no key) and :meth:`row` of
        each, in one go (the reader's per-event path)."""
        ...


def json_default(obj: Any) -> Any:
    """orjson fallback: bytes as base64 and NaN/±Infinity as strings, like JsonConverter."""
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, NonFiniteFloat):
        return obj.json()
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


class JsonFormat:
    """Kafka Connect JsonConverter: the pre-serialised schema spliced before each payload."""

    def __init__(self, schemas_enable: bool = True) -> None:
        self.schemas_enable = schemas_enable

    def row(self, plan: EncodePlan, values: Sequence[RawValue]) -> Row:
        """JSON-ready values (BYTES as base64 text already)."""
        return plan.json_row(values)

    def encode_key(self, plan: EncodePlan, values: Sequence[RawValue]) -> bytes:
        """``{"schema": <key schema>, "payload": {...}}``, or the payload alone."""
        payload = plan.json_key(values)
        if plan.key_schema_fragment is None or not self.schemas_enable:
            return orjson.dumps(payload, default=json_default)
        # One orjson call writes the pre-serialised schema too: no concatenation copies.
        return orjson.dumps(
            {"schema": plan.key_schema_fragment, "payload": payload}, default=json_default
        )

    def encode_key_payload(self, plan: EncodePlan, payload: Any) -> bytes:
        """The record key around a key payload already built (JSON-ready values)."""
        if plan.key_schema_fragment is None or not self.schemas_enable:
            return orjson.dumps(payload, default=json_default)
        return orjson.dumps(
            {"schema": plan.key_schema_fragment, "payload": payload}, default=json_default
        )

    def encode_value(self, plan: EncodePlan, payload: Row) -> bytes:
        """``{"schema": <envelope schema>, "payload": {...}}``, or the payload alone."""
        if not self.schemas_enable:
            return orjson.dumps(payload, default=json_default)
        return orjson.dumps(
            {"schema": plan.envelope_schema_fragment, "payload": payload}, default=json_default
        )

    def encode_name_key(self, name: str, subject: str) -> bytes:
        """A Connect string: ``{"schema": {"type": "string"}, "payload": name}``, or the JSON
        string alone without schemas."""
        if not self.schemas_enable:
            return orjson.dumps(name)
        return orjson.dumps({"schema": _STRING_KEY_SCHEMA, "payload": name})

    def decode_key(self, plan: EncodePlan, key: bytes) -> Row | None:
        """The key's payload, with or without the ``{"schema", "payload"}`` envelope (so
        keys written with and without schemas read the same)."""
        try:
            doc = orjson.loads(key)
        except orjson.JSONDecodeError:
            return None
        if isinstance(doc, dict) and doc.keys() == {"schema", "payload"}:
            doc = doc["payload"]
        return doc if isinstance(doc, dict) else None

    def key_and_rows(
        self, plan: EncodePlan, before: Sequence[RawValue] | None, after: Sequence[RawValue] | None
    ) -> tuple[bytes | None, Row | None, Row | None]:
        """The rows, then the key taken from them: key columns are converted once."""
        # The steps of row/json_key_from_row/encode_key, inlined: this is the reader's
        # per-event path. Any failure takes the slow paths that explain it.
        fast = plan.fast_json_row
        before_d = after_d = None
        try:
            if before is not None:
                before_d = fast(before)
            if after is not None:
                after_d = fast(after)
        except FAST_PATH_ERRORS:
            before_d = None if before is None else plan.json_row(before)
            after_d = None if after is None else plan.json_row(after)
        if not plan.key_indexes:
            return None, before_d, after_d
        try:
            if after_d is not None:
                key_d = plan.fast_key_from_row(after_d)
            elif before_d is not None:
                key_d = plan.fast_key_from_row(before_d)
            else:
                key_d = plan.key(())  # raises: there is no row to take a key from
        except KeyColumnNull:
            key_d = plan.key(after if after is not None else before or ())  # raises
        if self.schemas_enable:
            key = orjson.dumps(
                {"schema": plan.key_schema_fragment, "payload": key_d}, default=json_default
            )
        else:
            key = orjson.dumps(key_d, default=json_default)
        return key, before_d, after_d


class AvroFormat:
    """Avro binary through fastavro; Confluent-framed with registry ids when given a registry.

    ``registry`` None writes schemaless Avro (no framing, nothing registered). A reader of
    schemaless Avro needs the writer's schema: with ``schema_dir`` (and no registry) every
    key and value is written in Avro's single-object encoding (a marker, then the writer
    schema's fingerprint, then the body) and each schema as ``<subject>.<fingerprint>.avsc``
    in that folder (plus ``<subject>.avsc``, the current one), subjects being the registry's
    ``<topic>-key`` and ``<topic>-value``. A record so names its exact schema, also after a
    table's columns change; the sync jobs read the folder given by the same setting
    (``schema.avro_schema_dir``).
    """

    def __init__(self, registry: SchemaRegistry | None, schema_dir: str | None = None) -> None:
        self.registry = registry
        self.schema_dir = None if registry is not None else schema_dir
        self._string_ids: dict[str, int] = {}

    def _fingerprints(self, plan: EncodePlan) -> AvroPlan:
        """The plan's Avro schemas, their files written (once per plan: a table whose
        columns change gets a new plan)."""
        ap = avro_plan(plan)
        if self.schema_dir is not None and ap.envelope_fp is None:
            if ap.key is not None:
                ap.key_fp = write_schema_file(self.schema_dir, f"{plan.topic}-key", ap.key)
            ap.envelope_fp = write_schema_file(self.schema_dir, f"{plan.topic}-value", ap.envelope)
        return ap

    def encode_name_key(self, name: str, subject: str) -> bytes:
        """An Avro string (framed with the id of ``"string"`` under ``subject``)."""
        body = serialize(_AVRO_STRING, name)
        if self.registry is None:
            return body
        schema_id = self._string_ids.get(subject)
        if schema_id is None:
            schema_id = self._string_ids[subject] = self.registry.register(subject, "string")
        return frame(schema_id, body)

    def row(self, plan: EncodePlan, values: Sequence[RawValue]) -> Row:
        """Connect values (bytes for BYTES, as fastavro takes them)."""
        return plan.row(values)

    def encode_key(self, plan: EncodePlan, values: Sequence[RawValue]) -> bytes:
        """Avro key bytes (framed when a registry is configured)."""
        payload = plan.key(values)
        ap = self._fingerprints(plan)
        assert ap.key_parsed is not None
        body = serialize(ap.key_parsed, payload)
        if ap.key_fp is not None:
            return single_object(ap.key_fp, body)
        if self.registry is None:
            return body
        if ap.key_id is None:
            ap.key_id = self.registry.register(f"{plan.topic}-key", ap.key)
        return frame(ap.key_id, body)

    def encode_value(self, plan: EncodePlan, payload: Row) -> bytes:
        """Avro envelope bytes (framed when a registry is configured)."""
        ap = self._fingerprints(plan)
        body = serialize(ap.envelope_parsed, payload)
        if ap.envelope_fp is not None:
            return single_object(ap.envelope_fp, body)
        if self.registry is None:
            return body
        if ap.envelope_id is None:
            ap.envelope_id = self.registry.register(f"{plan.topic}-value", ap.envelope)
        return frame(ap.envelope_id, body)

    def decode_key(self, plan: EncodePlan, key: bytes) -> Row | None:
        """The key read with the table's key schema (framed or not, whatever the schema id:
        Avro binary carries values, not types, so int and long keys read alike)."""
        if plan.key_schema is None:
            return None
        framed = len(key) >= 5 and key[0] == MAGIC_BYTE and self.registry is not None
        if self.schema_dir is not None and key[:2] == SINGLE_OBJECT_MARKER:
            key = key[SINGLE_OBJECT_HEADER:]
        try:
            return decode_key(plan, key, framed=framed)
        # fastavro reading bytes that are not such a key fails in any of these ways.
        except (SchemaError, IndexError, ValueError, TypeError, OverflowError, EOFError):
            return None

    def key_and_rows(
        self, plan: EncodePlan, before: Sequence[RawValue] | None, after: Sequence[RawValue] | None
    ) -> tuple[bytes | None, Row | None, Row | None]:
        """The key (as :meth:`encode_key`), then the rows' Connect values."""
        keyed = after if after is not None else before
        key = None if keyed is None or not plan.key_indexes else self.encode_key(plan, keyed)
        return (
            key,
            None if before is None else plan.row(before),
            None if after is None else plan.row(after),
        )


def format_for(settings: SchemaSettings) -> EventFormat:
    """The format the settings ask for; Avro gets a registry client when a URL is set
    (with the settings' basic auth and TLS)."""
    if settings.value_format is ValueFormat.AVRO:
        return AvroFormat(
            SchemaRegistryClient(settings) if settings.registry_url else None,
            settings.avro_schema_dir,
        )
    return JsonFormat(settings.schemas_enable)
