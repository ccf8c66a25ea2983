"""Avro for the same events: schemas derived from the Connect schemas the way Confluent's
AvroConverter does it (``connect.name``, ``connect.version``, ``connect.parameters``, the
``decimal`` logical type), serialised with fastavro.

Two wire forms: schemaless Avro binary, and Confluent's framing (magic byte 0, a 4-byte
big-endian schema id, then the Avro binary) when a schema registry is configured.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import orjson
from fastavro.types import Schema as ParsedSchema

from pgcdc.core.errors import SchemaError
from schemas.connect import DECIMAL_NAME, DOUBLE, FLOAT, ConnectSchema, NonFiniteFloat
from schemas.convert import bytes_to_unscaled, unscaled_bytes
from schemas.plan import EncodePlan

MAGIC_BYTE = 0
_PRIMITIVE = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    FLOAT: "float",
    DOUBLE: "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}
# Confluent's AvroData uses this precision when a Decimal has no connect.decimal.precision.
DEFAULT_DECIMAL_PRECISION = 64


def to_avro(schema: ConnectSchema, defined: set[str] | None = None) -> Any:
    """The Avro schema (JSON-like) of a Connect schema, nullable when it is optional."""
    defined = set() if defined is None else defined
    t = _to_avro_required(schema, defined)
    return ["null", t] if schema.get("optional") else t


def _to_avro_required(schema: ConnectSchema, defined: set[str]) -> Any:
    ctype = schema["type"]
    name = schema.get("name")
    if ctype == "struct":
        if name is None:
            name = "ConnectDefault"
        if name in defined:
            return name  # Avro allows each named type once; later uses refer to it
        defined.add(name)
        namespace, _, simple = name.rpartition(".")
        rec: dict[str, Any] = {"type": "record", "name": simple}
        if namespace:
            rec["namespace"] = namespace
        rec["fields"] = [_field(f, defined) for f in schema["fields"]]
        _connect_props(rec, schema)
        return rec
    if ctype == "array":
        return {"type": "array", "items": to_avro(schema["items"], defined)}
    if ctype == "map":
        # Confluent's AvroData: a map with (required) string keys is an Avro map.
        if schema["keys"].get("type") != "string" or schema["keys"].get("optional"):
            raise SchemaError("no Avro mapping for a Connect map without required string keys")
        out_map: dict[str, Any] = {"type": "map", "values": to_avro(schema["values"], defined)}
        _connect_props(out_map, schema)
        return out_map
    prim = _PRIMITIVE.get(ctype)
    if prim is None:
        raise SchemaError(f"no Avro mapping for Connect type {ctype!r}")
    if name is None and ctype not in ("int8", "int16") and "parameters" not in schema:
        return prim
    out: dict[str, Any] = {"type": prim}
    if ctype in ("int8", "int16"):
        out["connect.type"] = ctype
    _connect_props(out, schema)
    # Avro's decimal has no negative scale (numeric(5,-2)): such values stay plain bytes.
    if name == DECIMAL_NAME and int(schema.get("parameters", {}).get("scale", 0)) >= 0:
        params = schema.get("parameters", {})
        out["logicalType"] = "decimal"
        out["precision"] = int(params.get("connect.decimal.precision", DEFAULT_DECIMAL_PRECISION))
        out["scale"] = int(params["scale"])
    return out


def _connect_props(out: dict[str, Any], schema: ConnectSchema) -> None:
    if "doc" in schema:
        out["connect.doc"] = schema["doc"]
    if "version" in schema:
        out["connect.version"] = schema["version"]
    if "parameters" in schema:
        out["connect.parameters"] = schema["parameters"]
    if "name" in schema:
        out["connect.name"] = schema["name"]


def _field(f: ConnectSchema, defined: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f["field"]}
    t = _to_avro_required(f, defined)
    if f.get("optional"):
        default = f.get("default")
        if default is None:
            out["type"] = ["null", t]
            out["default"] = None
        else:  # a union's default must match its first branch
            out["type"] = [t, "null"]
            out["default"] = default
    else:
        out["type"] = t
        if "default" in f:
            out["default"] = f["default"]
    return out


def _value_fields_nullable(schema: ConnectSchema, key_names: tuple[str, ...]) -> ConnectSchema:
    # A before image under REPLICA IDENTITY DEFAULT carries only the key columns, the others
    # are null even when NOT NULL: in Avro every non-key column must therefore be nullable.
    fields = [f if f["field"] in key_names else {**f, "optional": True} for f in schema["fields"]]
    return {**schema, "fields": fields}


@dataclass(slots=True)
class AvroPlan:
    """A table's Avro schemas, parsed once, and their registry ids once registered."""

    key: dict[str, Any] | None
    envelope: dict[str, Any]
    value: dict[str, Any]
    key_parsed: ParsedSchema | None
    envelope_parsed: ParsedSchema
    key_connect: ConnectSchema | None
    envelope_connect: ConnectSchema
    key_id: int | None = None
    envelope_id: int | None = None
    # The fingerprints of the envelope and key schemas, once written to schema.avro_schema_dir.
    envelope_fp: str | None = None
    key_fp: str | None = None


def avro_plan(plan: EncodePlan) -> AvroPlan:
    """Build (once) and return the Avro schemas of a table's events."""
    existing = plan.avro
    if isinstance(existing, AvroPlan):
        return existing
    value_connect = _value_fields_nullable(plan.value_schema, plan.key_names)
    envelope_connect = dict(plan.envelope_schema)
    envelope_connect["fields"] = [
        {**value_connect, "field": f["field"]} if f["field"] in ("before", "after") else f
        for f in plan.envelope_schema["fields"]
    ]
    envelope = to_avro(envelope_connect)
    value = to_avro({**value_connect, "optional": False})
    key = None if plan.key_schema is None else to_avro(plan.key_schema)
    try:
        envelope_parsed = fastavro.parse_schema(envelope)
        fastavro.parse_schema(value)
        key_parsed = None if key is None else fastavro.parse_schema(key)
    except fastavro.schema.SchemaParseException as e:
        raise SchemaError(
            f"table {plan.table.schema}.{plan.table.table}: invalid Avro schema: {e}"
        ) from e
    built = AvroPlan(
        key, envelope, value, key_parsed, envelope_parsed, plan.key_schema, envelope_connect
    )
    plan.avro = built
    return built


def avsc_documents(plan: EncodePlan) -> dict[str, str]:
    """The ``.avsc`` texts of a table's key, value and envelope, by file name."""
    ap = avro_plan(plan)
    docs = {
        f"{plan.value_name}.avsc": ap.value,
        f"{plan.envelope_name}.avsc": ap.envelope,
    }
    if ap.key is not None:
        docs[f"{plan.key_name}.avsc"] = ap.key
    return {
        name: orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
        for name, doc in docs.items()
    }


def write_avsc(plan: EncodePlan, directory: str | Path) -> list[Path]:
    """Write the table's ``.avsc`` files into ``directory``; return their paths."""
    out = []
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in avsc_documents(plan).items():
        p = d / name
        p.write_text(text)
        out.append(p)
    return out


# Avro's single-object encoding: this marker, the writer schema's 8-byte CRC-64-AVRO
# fingerprint (little-endian), then the body: schemaless Avro that names its schema.
SINGLE_OBJECT_MARKER = b"\xc3\x01"
SINGLE_OBJECT_HEADER = len(SINGLE_OBJECT_MARKER) + 8


def schema_fingerprint(schema: Any) -> str:
    """The CRC-64-AVRO fingerprint of ``schema``'s parsing canonical form, as the hex of its
    little-endian bytes (the bytes the single-object encoding carries)."""
    canonical = fastavro.schema.to_parsing_canonical_form(fastavro.parse_schema(schema))
    return str(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))


def single_object(fingerprint: str, body: bytes) -> bytes:
    """``body`` in Avro's single-object encoding, for the schema of ``fingerprint``."""
    return SINGLE_OBJECT_MARKER + bytes.fromhex(fingerprint) + body


def write_schema_file(directory: str | Path, subject: str, schema: Any) -> str:
    """Write a subject's Avro schema as ``<subject>.<fingerprint>.avsc`` (what a record in
    the single-object encoding names) and as ``<subject>.avsc`` (the current one, for
    people and tools); return the fingerprint. Each file is written whole or not at all (a
    reader never sees half a file); a file already holding the same text is left alone."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fingerprint = schema_fingerprint(schema)
    text = orjson.dumps(schema, option=orjson.OPT_INDENT_2) + b"\n"
    for name in (f"{subject}.{fingerprint}.avsc", f"{subject}.avsc"):
        target = d / name
        with contextlib.suppress(OSError):
            if target.read_bytes() == text:
                continue
        tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_bytes(text)
        os.replace(tmp, target)
    return fingerprint


def serialize(parsed: ParsedSchema, datum: Any) -> bytes:
    """Schemaless Avro binary of one datum."""
    buf = io.BytesIO()
    try:
        fastavro.schemaless_writer(buf, parsed, datum)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise SchemaError(f"value does not fit its Avro schema: {e}") from e
    return buf.getvalue()


def deserialize(parsed: ParsedSchema, data: bytes) -> Any:
    """Read one schemaless Avro datum."""
    try:
        return fastavro.schemaless_reader(io.BytesIO(data), parsed, None)
    except (EOFError, ValueError, TypeError, struct.error) as e:
        raise SchemaError(f"not a valid Avro datum for this schema: {e}") from e


def frame(schema_id: int, body: bytes) -> bytes:
    """Confluent wire format: magic byte 0, 4-byte big-endian schema id, Avro binary."""
    if not 0 <= schema_id < 2**31:
        raise SchemaError(f"schema id {schema_id} out of range")
    return struct.pack(">bI", MAGIC_BYTE, schema_id) + body


def unframe(data: bytes) -> tuple[int, bytes]:
    """Split Confluent wire format into (schema id, Avro binary)."""
    if len(data) < 5 or data[0] != MAGIC_BYTE:
        raise SchemaError(
            "not Confluent wire format (magic byte 0 and a 4-byte schema id expected)"
        )
    (schema_id,) = struct.unpack_from(">I", data, 1)
    return schema_id, data[5:]


def decode_value(plan: EncodePlan, data: bytes, framed: bool = False) -> dict[str, Any]:
    """Avro envelope bytes → the envelope as Connect values (bytes for decimals)."""
    ap = avro_plan(plan)
    if framed:
        _, data = unframe(data)
    result: dict[str, Any] = from_avro_value(
        ap.envelope_connect, deserialize(ap.envelope_parsed, data)
    )
    return result


def decode_key(plan: EncodePlan, data: bytes, framed: bool = False) -> dict[str, Any]:
    """Avro key bytes → the key as Connect values."""
    ap = avro_plan(plan)
    if ap.key_parsed is None or ap.key_connect is None:
        raise SchemaError(f"table {plan.table.schema}.{plan.table.table} has no key")
    if framed:
        _, data = unframe(data)
    result: dict[str, Any] = from_avro_value(ap.key_connect, deserialize(ap.key_parsed, data))
    return result


def shortest_float32(x: float) -> float:
    """The float32 ``x`` as the shortest decimal that reads back to it (Java Float.toString)."""
    if x != x or x in (float("inf"), float("-inf")):
        return NonFiniteFloat(x)
    target = struct.pack("<f", x)
    for digits in range(1, 10):
        candidate = float(f"{x:.{digits}g}")
        try:
            if struct.pack("<f", candidate) == target:
                return candidate
        except OverflowError:  # near FLT_MAX a short form rounds past it: try more digits
            continue
    return x


def from_avro_value(schema: ConnectSchema, value: Any) -> Any:
    """Undo fastavro's logical-type decoding so values equal the Connect values we wrote."""
    if value is None:
        return None
    t = schema["type"]
    if t == "struct":
        return {f["field"]: from_avro_value(f, value.get(f["field"])) for f in schema["fields"]}
    if t == "array":
        return [from_avro_value(schema["items"], v) for v in value]
    if t == "map":
        return {k: from_avro_value(schema["values"], v) for k, v in value.items()}
    if isinstance(value, Decimal):
        scale = int(schema.get("parameters", {}).get("scale", 0))
        return unscaled_bytes(int(value.scaleb(scale)))
    if t == FLOAT:
        return shortest_float32(value)
    if (t == DOUBLE and value != value) or value in (float("inf"), float("-inf")):
        return NonFiniteFloat(value)
    return value


def decimal_from_bytes(data: bytes, scale: int) -> Decimal:
    """A Connect Decimal's bytes and scale → the number."""
    return Decimal(bytes_to_unscaled(data)).scaleb(-scale)


_CONNECT_OF_AVRO = {
    "int": "int32",
    "long": "int64",
    "float": FLOAT,
    "double": DOUBLE,
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}


def connect_from_avro(schema: Any) -> ConnectSchema:
    """The Connect schema an Avro schema written by :func:`to_avro` came from.

    The inverse of :func:`to_avro` for what it writes (records, arrays, string-keyed maps,
    primitives, nullable unions, ``connect.*`` properties, named references), so a reader of
    Avro events (the sync jobs) gets the same schema a JSON event carries, and converts the
    values the same way.
    """
    return _connect_of(schema, {}, "")


def _connect_of(schema: Any, named: dict[str, ConnectSchema], namespace: str) -> ConnectSchema:
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise SchemaError(f"no Connect mapping for the Avro union {schema!r}")
        return {**_connect_of(branches[0], named, namespace), "optional": True}
    if isinstance(schema, str):
        if schema in _CONNECT_OF_AVRO:
            return {"type": _CONNECT_OF_AVRO[schema], "optional": False}
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        found = named.get(full) or named.get(schema)
        if found is None:
            raise SchemaError(f"the Avro schema refers to {schema!r} before defining it")
        return found
    avro_type = schema["type"]
    out: ConnectSchema
    if avro_type == "record":
        ns = schema.get("namespace", namespace)
        full = schema["name"] if "." in schema["name"] or not ns else f"{ns}.{schema['name']}"
        out = {"type": "struct", "optional": False, "fields": []}
        named[full] = out  # before the fields: a field may refer to its own record
        for f in schema["fields"]:
            field = dict(_connect_of(f["type"], named, ns))
            if "default" in f and f["default"] is not None:
                field["default"] = f["default"]
            field["field"] = f["name"]
            out["fields"].append(field)
        out["name"] = schema.get("connect.name", full)
    elif avro_type == "array":
        out = {"type": "array", "items": _connect_of(schema["items"], named, namespace)}
        out["optional"] = False
    elif avro_type == "map":
        out = {
            "type": "map",
            "keys": {"type": "string", "optional": False},
            "values": _connect_of(schema["values"], named, namespace),
            "optional": False,
        }
    elif avro_type in _CONNECT_OF_AVRO:
        out = {"type": schema.get("connect.type", _CONNECT_OF_AVRO[avro_type]), "optional": False}
    elif isinstance(avro_type, dict | list):
        return _connect_of(avro_type, named, namespace)
    else:
        raise SchemaError(f"no Connect mapping for the Avro type {avro_type!r}")
    for prop, key in (
        ("connect.name", "name"),
        ("connect.version", "version"),
        ("connect.parameters", "parameters"),
        ("connect.doc", "doc"),
    ):
        if prop in schema:
            out[key] = schema[prop]
    return out
