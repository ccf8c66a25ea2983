"""Keys without servers: message_key_columns parsing, the key rule, keys compared by value,
the on-disk live-key map, and the cdc.unchanged header."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

import fastavro
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.keys import KeyFacts, check_key_columns, key_columns, matching_rule
from cdc.live_keys import LiveKeys
from pgcdc.core.contract import decode_unchanged_header, encode_unchanged_header
from pgcdc.core.errors import ConfigError
from pgcdc.core.key_columns import KeyColumns, parse_message_key_columns
from pgcdc.core.settings import PostgresSettings, SchemaSettings, ValueFormat, load_settings
from schemas.envelope import EventEncoder
from schemas.model import Column, PgType, SourceInfo, TableSchema

pytestmark = pytest.mark.unit

INT4 = PgType(23, "int4", "b")
INT8 = PgType(20, "int8", "b")
TEXT = PgType(25, "text", "b")

# --- message_key_columns and skipped_operations ----------------------------------------------


def test_message_key_columns_take_debeziums_syntax() -> None:
    rules = parse_message_key_columns(" public.logs : id ; inventory\\..*:tenant, id;")
    assert rules == (
        KeyColumns("public.logs", ("id",)),
        KeyColumns("inventory\\..*", ("tenant", "id")),
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("public.logs", "is not <schema>.<table>:<column>"),
        ("public.logs:", "is not <schema>.<table>:<column>"),
        (":id", "is not <schema>.<table>:<column>"),
        ("public.(logs:id", "is not a regular expression"),
    ],
)
def test_a_bad_entry_is_one_clear_line(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"entry|pattern") as e:
        parse_message_key_columns(text)
    assert says in str(e.value)


def test_settings_read_both_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_POSTGRES__MESSAGE_KEY_COLUMNS", "public.a:x,y")
    monkeypatch.setenv("CDC_POSTGRES__SKIPPED_OPERATIONS", "none")
    pg = load_settings().postgres
    assert pg.message_key_columns == (KeyColumns("public.a", ("x", "y")),)
    assert pg.skipped_operations == ()
    monkeypatch.setenv("CDC_POSTGRES__MESSAGE_KEY_COLUMNS", "public.a")
    with pytest.raises(ConfigError, match=r"postgres\.message_key_columns"):
        load_settings()


def test_skipped_operations_default_to_debeziums_t() -> None:
    assert PostgresSettings().skipped_operations == ("t",)
    assert PostgresSettings(skipped_operations="c, u").skipped_operations == ("c", "u")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown operations"):
        PostgresSettings(skipped_operations="t,x")  # type: ignore[arg-type]


# --- the key rule ------------------------------------------------------------------------------


def facts(
    ri: str,
    primary: tuple[str, ...] = (),
    index: tuple[str, ...] = (),
    columns: tuple[str, ...] = ("id", "email", "note"),
    not_null: frozenset[str] = frozenset({"id", "email"}),
) -> KeyFacts:
    identity = {"d": primary, "i": index, "f": columns}.get(ri, ())
    return KeyFacts("public", "t", ri, primary, identity, columns, not_null)


@pytest.mark.parametrize(
    ("table", "key"),
    [
        (facts("d", primary=("id",)), ("id",)),
        (facts("f", primary=("id",)), ("id",)),
        (facts("i", primary=("id",), index=("email",)), ("email",)),  # deletes carry the index
        (facts("d"), ()),
        (facts("f"), ()),  # FULL without a primary key: keyless
        (facts("n", primary=("id",)), ()),
    ],
)
def test_the_key_follows_the_replica_identity(table: KeyFacts, key: tuple[str, ...]) -> None:
    assert key_columns(table) == key


def test_an_entry_keys_its_table_when_the_old_row_carries_it() -> None:
    rules = [KeyColumns("other\\..*", ("note",)), KeyColumns("public\\.t", ("email", "id"))]
    assert key_columns(facts("d"), rules) == ("email", "id")  # never an old row: any columns
    assert key_columns(facts("f"), rules) == ("email", "id")  # the old row is whole
    assert key_columns(facts("d", primary=("email", "id")), rules) == ("email", "id")
    assert matching_rule(rules, "public", "tt") is None  # the whole name must match


@pytest.mark.parametrize(
    ("table", "columns", "says"),
    [
        (facts("d"), ("nope",), "nope, not a column of public.t"),
        (facts("f"), ("note",), "keys public.t by note, which may be NULL"),
        (facts("d", primary=("id",)), ("email",), "carry only id (the replica identity)"),
        (facts("i", index=("email",)), ("id",), "REPLICA IDENTITY FULL"),
    ],
)
def test_an_entry_that_cannot_key_its_table_is_refused(
    table: KeyFacts, columns: tuple[str, ...], says: str
) -> None:
    with pytest.raises(ConfigError) as e:
        check_key_columns(table, columns)
    assert says in str(e.value) and "CDC_POSTGRES__MESSAGE_KEY_COLUMNS" in str(e.value)
    assert "\n" not in str(e.value)


# --- keys compared by value --------------------------------------------------------------------


def table(key_type: PgType) -> TableSchema:
    return TableSchema(
        "public",
        "t",
        (Column("id", key_type, -1, False, True), Column("v", TEXT, -1, True, False)),
        ("id",),
        "d",
    )


def encoder(**kw: object) -> EventEncoder:
    return EventEncoder(SchemaSettings(**kw), "cdc", "db")  # type: ignore[arg-type]


def test_a_key_has_one_identity_with_or_without_schemas_and_as_int_or_bigint() -> None:
    forms = [
        encoder(schemas_enable=s).encode_key(table(t), ("7", "x"))
        for s in (True, False)
        for t in (INT4, INT8)
    ]
    assert len(set(forms)) == 3  # int4 and int8 keys differ only in their schema
    enc = encoder()
    identities = {enc.key_identity(table(INT8), k) for k in forms if k is not None}
    assert identities == {b'val:{"id":7}'}
    assert enc.key_identity(table(INT8), b'{"id":8}') != enc.key_identity(
        table(INT8), forms[0] or b""
    )


def test_avro_keys_read_alike_as_int_or_long_and_anything_else_is_its_bytes() -> None:
    enc = encoder(value_format=ValueFormat.AVRO)
    as_int = enc.encode_key(table(INT4), ("7", None)) or b""
    assert as_int == enc.encode_key(table(INT8), ("7", None))  # Avro writes values, not types
    assert enc.key_identity(table(INT8), as_int) == b'val:{"id":7}'
    assert enc.key_identity(table(INT8), b"\xff\xff") == b"raw:\xff\xff"
    assert encoder().key_identity(table(INT4), b"not json") == b"raw:not json"


def test_a_delete_of_a_key_names_the_key_columns_in_before() -> None:
    enc = encoder()
    key = enc.encode_key(table(INT4), ("7", "x")) or b""
    value = orjson.loads(
        enc.encode_delete_of_key(table(INT8), key, SourceInfo(0, "false", 1, 2, 3))
    )
    assert value["payload"]["op"] == "d" and value["payload"]["after"] is None
    assert value["payload"]["before"] == {"id": 7, "v": None}
    alien = orjson.loads(
        enc.encode_delete_of_key(table(INT8), b'{"x":1}', SourceInfo(0, "false", 1, 2, 3))
    )
    assert alien["payload"]["before"] is None


def test_the_truncate_topics_key_is_a_connect_string_in_every_format() -> None:
    t = table(INT4)
    assert orjson.loads(encoder().encode_truncate_key(t)) == {
        "schema": {"type": "string", "optional": False},
        "payload": "public.t",
    }
    assert encoder(schemas_enable=False).encode_truncate_key(t) == b'"public.t"'
    avro = encoder(value_format=ValueFormat.AVRO).encode_truncate_key(t)
    assert fastavro.schemaless_reader(BytesIO(avro), "string", None) == "public.t"


# --- the live-key map --------------------------------------------------------------------------


def test_the_newest_record_of_each_key_decides(tmp_path: Path) -> None:
    with LiveKeys(tmp_path) as live:
        live.load(
            [(b"a", True), (b"b", True), (b"a", False), (None, True), (b"c", False), (b"b", True)]
        )
        assert len(live) == 1 and list(live) == [b"b"]
        live.load([(b"a", True), (b"b", False)])  # loading more goes on where it was
        assert list(live) == [b"a"]
    assert not list(tmp_path.iterdir()), "the file outlives its map"


def test_a_claim_returns_the_same_keys_under_other_bytes(tmp_path: Path) -> None:
    ident = {b"k1-old": b"1", b"k1": b"1", b"k2": b"2", b"k3-old": b"3"}
    with LiveKeys(tmp_path) as live:
        live.load([(k, True) for k in (b"k1-old", b"k1", b"k2", b"k3-old")], ident.__getitem__)
        # The snapshot writes k1 and k2: k1's old bytes need a tombstone before it; k1 and k2
        # themselves are simply overwritten.
        assert live.claim([(b"k1", b"1"), (b"k2", b"2")]) == [b"k1-old"]
        assert list(live) == [b"k3-old"] and len(live) == 1  # gone: tombstones after
        assert live.claim([(b"k9", b"9")]) == []


def test_a_million_keys_stay_out_of_memory(tmp_path: Path) -> None:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with LiveKeys(tmp_path) as live:
        live.load((b'{"id":%d}' % i, True) for i in range(1_000_000))
        assert len(live) == 1_000_000
        assert sum(1 for _ in live) == 1_000_000
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    # A Python set of these keys alone takes about 70 MiB; the map's page cache is 8 MiB.
    assert grown_kib < 40 * 1024, f"the map grew the process by {grown_kib} KiB"


# --- the cdc.unchanged header ------------------------------------------------------------------


@given(st.sets(st.text(alphabet=st.characters(min_codepoint=1, max_codepoint=0xD7FF), min_size=1)))
def test_the_unchanged_header_names_any_columns(columns: set[str]) -> None:
    assert decode_unchanged_header(encode_unchanged_header(sorted(columns))) == columns


def test_the_unchanged_header_escapes_commas_and_percents() -> None:
    value = encode_unchanged_header(["a,b", "50%", "%2C"])
    assert value == b"a%2Cb,50%25,%252C"
    assert decode_unchanged_header(value) == {"a,b", "50%", "%2C"}
    assert decode_unchanged_header(None) == frozenset() == decode_unchanged_header(b"")
