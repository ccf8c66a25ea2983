"""Avro input for the sync jobs: each Avro record is read into the JSON event it stands for.

With ``schema.value_format = avro`` the reader writes Avro, either framed in Confluent's wire
format (a magic byte 0 and a 4-byte schema id, the schema in the registry at
``schema.registry_url``) or, with ``schema.avro_schema_dir``, in Avro's single-object
encoding (the marker C3 01 and the writer schema's CRC-64-AVRO fingerprint before the body),
each schema in that folder as ``<topic>-key.<fingerprint>.avsc`` /
``<topic>-value.<fingerprint>.avsc``. Plain schemaless records (no marker, written by others)
read with the folder's current ``<topic>-value.avsc``. The jobs read the same settings.

:class:`AvroTranscoder` turns an Avro key and value into the bytes Kafka Connect's
JsonConverter writes for the same event (``{"schema", "payload"}``, the Connect schema read
back from the Avro schema's ``connect.*`` properties, bytes as base64), so everything after
it (parsing, the change builder, both sinks) is the JSON path unchanged and a follower holds
the same values whichever format the topics carry. A record that cannot be read is not
guessed at: :func:`avro_as_json` gives it a ``decode_error`` that dead-letters it.

Records already JSON (the reader's heartbeats, a value starting with ``{``) pass unchanged:
no Avro record starts with that byte (a plain envelope starts with the union index of
``before``, 0x00 or 0x02; a framed one with the magic byte 0; a single-object one with C3).
"""

from __future__ import annotations

import io
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import orjson
from fastavro.types import Schema as ParsedSchema

from pgcdc.core.errors import SchemaError
from pgcdc.core.settings import SchemaSettings, Settings, ValueFormat
from schemas.avro import (
    MAGIC_BYTE,
    SINGLE_OBJECT_HEADER,
    SINGLE_OBJECT_MARKER,
    connect_from_avro,
    from_avro_value,
)
from schemas.connect import ConnectSchema
from schemas.formats import json_default

# How often a schema file is looked at again for a newer writer schema (the reader rewrites
# it when a table's columns change).
RECHECK_S = 1.0


@dataclass(slots=True)
class WriterSchema:
    parsed: ParsedSchema
    connect: ConnectSchema
    connect_json: bytes  # the Connect schema, pre-serialised for the JSON event


def _writer_schema(avro_schema: Any) -> WriterSchema:
    try:
        parsed = fastavro.parse_schema(avro_schema)
    except fastavro.schema.SchemaParseException as e:
        raise SchemaError(f"not a valid Avro schema: {e}") from e
    connect = connect_from_avro(avro_schema)
    return WriterSchema(parsed, connect, orjson.dumps(connect))


class AvroTranscoder:
    """Avro key and value bytes → JsonConverter JSON bytes (see the module's note).

    One per Python worker (:func:`transcoder_for`): it keeps the registry's schemas by id
    and the schema files by path.
    """

    def __init__(self, settings: SchemaSettings) -> None:
        self.settings = settings
        self.framed = settings.registry_url is not None
        self._by_id: dict[int, WriterSchema] = {}
        self._by_fingerprint: dict[tuple[str, str], WriterSchema] = {}
        self._current: dict[str, tuple[float, WriterSchema]] = {}
        self._texts: dict[bytes, WriterSchema] = {}
        self._registry: Any = None

    # --- where writer schemas come from -------------------------------------------------

    def _registry_schema(self, schema_id: int) -> WriterSchema:
        found = self._by_id.get(schema_id)
        if found is None:
            if self._registry is None:
                from schemas.registry import SchemaRegistryClient

                self._registry = SchemaRegistryClient(self.settings)
            found = self._by_id[schema_id] = _writer_schema(self._registry.schema_by_id(schema_id))
        return found

    def _folder(self) -> Path:
        folder = self.settings.avro_schema_dir
        if folder is None:
            raise SchemaError(
                "schemaless Avro needs the writer's schema: set schema.avro_schema_dir (the "
                "reader writes each topic's schemas there) or schema.registry_url"
            )
        return Path(folder)

    def _load(self, path: Path, what: str) -> WriterSchema:
        try:
            text = path.read_bytes()
        except OSError as e:
            raise SchemaError(f"no writer schema for {what}: {path}: {e.strerror}") from e
        schema = self._texts.get(text)
        if schema is None:
            try:
                schema = self._texts[text] = _writer_schema(orjson.loads(text))
            except orjson.JSONDecodeError as e:
                raise SchemaError(f"cannot read the writer schema {path}: {e}") from e
        return schema

    def _fingerprint_schema(self, subject: str, fingerprint: str) -> WriterSchema:
        """The schema a single-object record names (its file never changes)."""
        found = self._by_fingerprint.get((subject, fingerprint))
        if found is None:
            path = self._folder() / f"{subject}.{fingerprint}.avsc"
            found = self._load(path, f"{subject} fingerprint {fingerprint}")
            self._by_fingerprint[(subject, fingerprint)] = found
        return found

    def _current_schema(self, subject: str) -> WriterSchema:
        """``<subject>.avsc``, for plain schemaless records (read again at most every
        RECHECK_S: the reader rewrites it when the table's columns change)."""
        now = time.monotonic()
        cached = self._current.get(subject)
        if cached is not None and now - cached[0] < RECHECK_S:
            return cached[1]
        found = self._load(self._folder() / f"{subject}.avsc", subject)
        self._current[subject] = (now, found)
        return found

    # --- decoding --------------------------------------------------------------------------

    def _read(self, topic: str, part: str, data: bytes) -> tuple[WriterSchema, Any]:
        subject = f"{topic}-{part}"
        if self.framed:
            if len(data) < 5 or data[0] != MAGIC_BYTE:
                raise SchemaError(
                    f"the {part} is not Confluent wire format (magic byte 0 and a schema id)"
                )
            (schema_id,) = struct.unpack_from(">I", data, 1)
            writer = self._registry_schema(schema_id)
            return writer, _decode(writer, part, memoryview(data)[5:])
        if data[:2] == SINGLE_OBJECT_MARKER and len(data) >= SINGLE_OBJECT_HEADER:
            writer = self._fingerprint_schema(subject, data[2:SINGLE_OBJECT_HEADER].hex())
            return writer, _decode(writer, part, memoryview(data)[SINGLE_OBJECT_HEADER:])
        writer = self._current_schema(subject)
        return writer, _decode(writer, part, memoryview(data))

    def _json(self, topic: str, part: str, data: bytes | None) -> bytes | None:
        if data is None or data[:1] == b"{":
            return data
        writer, values = self._read(topic, part, data)
        payload = orjson.dumps(values, default=json_default)
        return b'{"schema":' + writer.connect_json + b',"payload":' + payload + b"}"

    def transcode(
        self, topic: str, key: bytes | None, value: bytes | None
    ) -> tuple[bytes | None, bytes | None, str | None]:
        """(key JSON, value JSON, None), or the record unchanged and why it cannot be read."""
        try:
            return self._json(topic, "key", key), self._json(topic, "value", value), None
        except SchemaError as e:
            return key, value, f"Avro: {e}"


def _decode(writer: WriterSchema, part: str, body: memoryview) -> Any:
    """One Avro datum that must take exactly ``body``, as Connect values."""
    buf = io.BytesIO(body)
    try:
        datum = fastavro.schemaless_reader(buf, writer.parsed, None)
    except (EOFError, ValueError, TypeError, IndexError, KeyError, struct.error) as e:
        raise SchemaError(f"the {part} does not read with its writer schema: {e}") from e
    if buf.tell() != len(body):
        # Bytes longer than the schema reads: written with another schema (e.g. before a
        # column was dropped); never take a part of them.
        raise SchemaError(
            f"the {part} has {len(body) - buf.tell()} bytes more than its writer schema reads"
        )
    return from_avro_value(writer.connect, datum)


_kept: list[AvroTranscoder] = []  # this worker's one
_lock = threading.Lock()


def transcoder_for(settings: SchemaSettings) -> AvroTranscoder:
    """This worker's transcoder for ``settings``, kept across batches and tasks and shared by
    the threads of a task's ranges (``spark.ranges_at_once``: new threads each task, so a
    transcoder a thread would fetch its schemas again each task)."""
    with _lock:
        if not _kept or _kept[0].settings != settings:
            _kept[:] = [AvroTranscoder(settings)]
        return _kept[0]


def avro_as_json(df: Any, settings: Settings) -> Any:
    """The Kafka source's frame with Avro keys and values read into JSON (see module note),
    plus ``decode_error``; unchanged when the settings say JSON."""
    if settings.schema_.value_format is not ValueFormat.AVRO:
        return df
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    schema_settings = settings.schema_
    out = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("error", StringType()),
        ]
    )

    def read(topic: str, key: bytes | None, value: bytes | None) -> tuple[Any, Any, Any]:
        return transcoder_for(schema_settings).transcode(
            topic,
            None if key is None else bytes(key),
            None if value is None else bytes(value),
        )

    # Row at a time, as it was written and tested: PySpark 4.2 makes plain UDFs Arrow ones
    # by default (spark.sql.execution.pythonUDF.arrow.enabled) once pyarrow and pandas are
    # installed, which the jobs need for mapInArrow, and Arrow coerces return values its
    # own way.
    read_udf = F.udf(read, out, useArrow=False)
    others = [c for c in df.columns if c not in ("key", "value")]
    return df.withColumn("_avro", read_udf("topic", "key", "value")).select(
        *others,
        F.col("_avro.key").alias("key"),
        F.col("_avro.value").alias("value"),
        F.col("_avro.error").alias("decode_error"),
    )
