"""Property tests: random rows of every supported type round-trip through
envelope → JSON → parse and envelope → Avro → envelope."""

from __future__ import annotations

import base64
import struct
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.core.settings import DecimalHandling, SchemaSettings, ValueFormat
from pgcdc.core.values import UNCHANGED_TOAST
from schemas import avro
from schemas.connect import NonFiniteFloat
from schemas.envelope import EventEncoder
from schemas.formats import AvroFormat
from schemas.model import SourceInfo
from tests.unit.schemas.conftest import load_fixture

pytestmark = pytest.mark.unit

TABLE, ROWS = load_fixture()
NAMES = [c.name for c in TABLE.columns]
SOURCE = SourceInfo(1700000000000001, "true", 7, 100, 90)


def _float4_text(x: float) -> str:
    f = struct.unpack("<f", struct.pack("<f", x))[0]
    for digits in range(1, 10):
        try:
            if struct.pack("<f", float(f"{f:.{digits}g}")) == struct.pack("<f", f):
                return f"{f:.{digits}g}"
        except OverflowError:  # near FLT_MAX a short form rounds past it: try more digits
            continue
    return repr(f)


def _array_literal(items: list[str | None]) -> str:
    def q(s: str | None) -> str:
        if s is None:
            return "NULL"
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "{" + ",".join(q(s) for s in items) + "}"


_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30
)
_ts = st.datetimes().map(lambda d: d.isoformat(sep=" "))
SPECIFIC: dict[str, st.SearchStrategy[str]] = {
    "c_bool": st.sampled_from(["t", "f"]),
    "c_int2": st.integers(-(2**15), 2**15 - 1).map(str),
    "c_int4": st.integers(-(2**31), 2**31 - 1).map(str),
    "c_int8": st.integers(-(2**63), 2**63 - 1).map(str),
    "c_float4": st.floats(width=32, allow_nan=False).map(_float4_text),
    "c_float8": st.floats(allow_nan=False).map(repr).map(lambda s: s.replace("inf", "Infinity")),
    "c_numeric": st.integers(-(10**10) + 1, 10**10 - 1).map(
        lambda n: (
            f"{n // 100 if n >= 0 else -(-n // 100)}.{abs(n) % 100:02d}".replace(
                "0.", "0." if n >= 0 else "-0.", 1
            )
            if abs(n) < 100
            else f"{n / 100:.2f}"
            if abs(n) < 10**14
            else str(n)
        )
    ),
    "c_numeric_any": st.decimals(allow_nan=False, allow_infinity=False, places=None).map(
        lambda d: format(d, "f")
    ),
    "c_text": _text,
    "c_bytea": st.binary(max_size=40).map(lambda b: "\\x" + b.hex()),
    "c_ts": _ts,
    "c_tstz": st.datetimes().map(lambda d: d.isoformat(sep=" ") + "+00"),
    "c_date": st.dates().map(lambda d: d.isoformat()),
    "c_int4_arr": st.lists(
        st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1).map(str)), max_size=5
    ).map(_array_literal),
    "c_text_arr": st.lists(st.one_of(st.none(), _text), max_size=5).map(_array_literal),
}


def _column_strategy(i: int, name: str) -> st.SearchStrategy[Any]:
    if i == 0:
        return st.integers(1, 2**31 - 1).map(str)
    seen = sorted(
        {r[i] for r in ROWS if r[i] is not None and not (name == "c_numeric_any" and r[i] == "NaN")}
    )
    base = SPECIFIC.get(name, st.sampled_from(seen))
    return (
        st.one_of(st.none(), base, st.just(UNCHANGED_TOAST))
        if name in ("c_text", "c_bytea")
        else st.one_of(st.none(), base)
    )


ROW = st.tuples(*[_column_strategy(i, n) for i, n in enumerate(NAMES)]).map(list)


def json_form(v: Any) -> Any:
    """What JsonConverter makes of a Connect value."""
    if isinstance(v, dict):
        return {k: json_form(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_form(x) for x in v]
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, NonFiniteFloat):
        return v.json()
    return v


@settings(max_examples=150, deadline=None)
@given(ROW, ROW)
def test_envelope_json_roundtrip(before: list[Any], after: list[Any]) -> None:
    enc = EventEncoder(SchemaSettings(), "rt", "db")
    payload = enc.value_payload(TABLE, "u", before, after, SOURCE, now_ns=1)
    doc = orjson.loads(enc.encode_value(TABLE, "u", before, after, SOURCE))
    parsed = doc["payload"]
    parsed["ts_ms"] = payload["ts_ms"]
    parsed["ts_us"] = payload["ts_us"]
    parsed["ts_ns"] = payload["ts_ns"]
    assert parsed == json_form(payload)
    assert [f["field"] for f in doc["schema"]["fields"][1]["fields"]] == NAMES


@settings(max_examples=150, deadline=None)
@given(ROW, ROW, st.sampled_from(list(DecimalHandling)))
def test_envelope_avro_roundtrip(
    before: list[Any], after: list[Any], mode: DecimalHandling
) -> None:
    enc = EventEncoder(
        SchemaSettings(value_format=ValueFormat.AVRO, decimal_handling_mode=mode), "rt", "db"
    )
    payload = enc.value_payload(TABLE, "u", before, after, SOURCE)
    plan = enc.plan(TABLE)
    data = avro.serialize(avro.avro_plan(plan).envelope_parsed, payload)
    back = avro.decode_value(plan, data)
    assert json_form(back) == json_form(payload)
    key = enc.encode_key(TABLE, after)
    assert key is not None and avro.decode_key(plan, key) == enc.key_payload(TABLE, after)


def test_confluent_framing() -> None:
    body = b"\x02\x04abc"
    framed = avro.frame(42, body)
    assert framed[:5] == b"\x00\x00\x00\x00\x2a"
    assert avro.unframe(framed) == (42, body)


def test_unframe_rejects_other_bytes() -> None:
    import pytest

    from pgcdc.core.errors import SchemaError

    with pytest.raises(SchemaError, match="magic byte"):
        avro.unframe(b"\x01\x00\x00\x00\x01x")


def test_avsc_documents_parse_with_fastavro(tmp_path: Any) -> None:
    import fastavro

    enc = EventEncoder(SchemaSettings(value_format=ValueFormat.AVRO), "srv", "db")
    paths = avro.write_avsc(enc.plan(TABLE), tmp_path)
    names = sorted(p.name for p in paths)
    assert names == [
        "srv.public.all_types.Envelope.avsc",
        "srv.public.all_types.Key.avsc",
        "srv.public.all_types.Value.avsc",
    ]
    for p in paths:
        parsed = fastavro.parse_schema(orjson.loads(p.read_bytes()))
        assert parsed["name"] == p.name.removesuffix(".avsc")
    env = orjson.loads((tmp_path / "srv.public.all_types.Envelope.avsc").read_bytes())
    assert env["connect.name"] == "srv.public.all_types.Envelope"
    dec = next(f for f in env["fields"][0]["type"][1]["fields"] if f["name"] == "c_numeric")
    assert dec["type"][1]["logicalType"] == "decimal" and dec["type"][1]["scale"] == 2


def test_registry_framing_with_injected_registry() -> None:
    # The registry itself is not available here: a registry object that hands out ids
    # stands in for the HTTP client, to check that values are framed with its ids.
    class Ids:
        def __init__(self) -> None:
            self.subjects: list[str] = []

        def register(self, subject: str, schema: Any) -> int:
            self.subjects.append(subject)
            return 7

    ids = Ids()
    enc = EventEncoder(
        SchemaSettings(value_format=ValueFormat.AVRO), "srv", "db", event_format=AvroFormat(ids)
    )
    row = ROWS[0]
    value = enc.encode_value(TABLE, "c", None, row, SOURCE)
    assert avro.unframe(value)[0] == 7
    assert avro.decode_value(enc.plan(TABLE), value, framed=True)["after"]["id"] == 1
    enc.encode_key(TABLE, row)
    assert ids.subjects == ["srv.public.all_types-value", "srv.public.all_types-key"]
