"""The reader's robustness, pure parts: pinned sessions, secrets, dead letters, slot health,
box arrays and the encoder's plan cache."""

from __future__ import annotations

import gc
import logging
import tracemalloc
from dataclasses import replace
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError
from pydantic import SecretStr

from cdc.cli import _ScrubbingFormatter, _secrets
from cdc.connection import (
    SESSION_SETTINGS,
    parse_dsn,
    redact,
    scrub,
    secrets_of,
    session_options,
)
from cdc.dead_letters import (
    LETTER_VALUE_LIMIT,
    RefusedRecord,
    fail_message,
    is_permanent,
    key_text,
    letter,
    table_name,
)
from cdc.publisher import Publisher
from cdc.slots import Action, SlotInfo, plan_start
from cdc.state import Phase, ReaderState
from cdc.status import slot_warnings
from pgcdc.core.contract import table_topic, version_headers
from pgcdc.core.errors import ConfigError, PublishError, SlotError
from pgcdc.core.lsn import Lsn
from pgcdc.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaSettings,
    Settings,
    SnapshotMode,
)
from schemas.envelope import EventEncoder
from schemas.model import Column, PgType, SourceInfo, TableSchema
from schemas.pgtext import parse_array
from schemas.typemap import array_delimiter

pytestmark = pytest.mark.unit

PASSWORD = "p%a'ss \"w rd"


# --- sessions and secrets ----------------------------------------------------------------


def test_session_options_pin_every_setting_after_the_dsns_own() -> None:
    opts = session_options("-c search_path=app -c DateStyle=German")
    assert opts.startswith("-c search_path=app -c DateStyle=German ")
    for name, value in SESSION_SETTINGS:
        assert f"-c {name}={value}" in opts
    # Later -c options win: ours come after the DSN's.
    assert opts.rindex("DateStyle=ISO") > opts.index("DateStyle=German")
    assert {n for n, _ in SESSION_SETTINGS} >= {
        "DateStyle",
        "IntervalStyle",
        "extra_float_digits",
        "lc_monetary",
        "TimeZone",
    }


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://cdc:pa%zzword@127.0.0.1:5432/cdc",
        "postgresql://cdc:" + PASSWORD + "@127.0.0.1:5432/cdc",
        "host=127.0.0.1 password='" + PASSWORD,
        "host=127.0.0.1 password=" + PASSWORD,
        'host=127.0.0.1 password=a"b c"d e',
    ],
)
def test_an_unparseable_dsn_is_one_config_error_quoting_none_of_it(dsn: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_dsn(dsn)
    text = str(caught.value)
    assert text.startswith("invalid PostgreSQL DSN (postgres.dsn): ")
    for secret in ("pa%zzword", "zzword", "w rd", "ss ", "b c", "d e"):
        assert secret not in text
    # No cause to show in a traceback: libpq's own message quotes the DSN.
    assert caught.value.__cause__ is None and caught.value.__context__ is None


def test_redact_drops_everything_between_the_outer_quotes() -> None:
    assert redact('missing "=" after "a"b c" in connection info string') == (
        'missing "…" in connection info string'
    )


def test_secrets_are_scrubbed_raw_and_percent_encoded() -> None:
    params = parse_dsn("postgresql://u:p%25a%27ss%20%22w%20rd@h:1/d")
    assert params["password"] == PASSWORD
    secrets = secrets_of(params)
    line = f"x {PASSWORD} y p%25a%27ss%20%22w%20rd z"
    assert scrub(line, secrets) == "x *** y *** z"
    # A placeholder password like the local stack's is too short to scrub.
    assert secrets_of({"password": "cdc"}) == []


def test_the_cli_scrubs_log_lines_and_tracebacks() -> None:
    from cdc import cli

    escaped = PASSWORD.replace("'", "\\'")
    settings = Settings(postgres=PostgresSettings(dsn=SecretStr(f"host=h password='{escaped}'")))
    cli._SECRETS[:] = _secrets(settings)
    try:
        assert PASSWORD in cli._SECRETS
        fmt = _ScrubbingFormatter(logging.Formatter("%(message)s"))
        try:
            raise RuntimeError(f"boom {PASSWORD}")
        except RuntimeError:
            import sys

            record = logging.LogRecord(
                "x", logging.ERROR, "f", 1, "said %s", (PASSWORD,), sys.exc_info()
            )
        out = fmt.format(record)
        assert "boom ***" in out and PASSWORD not in out
    finally:
        cli._SECRETS.clear()


# --- dead letters -------------------------------------------------------------------------

KEY = orjson.dumps({"schema": {"type": "struct"}, "payload": {"id": 7}})


def refused(value: bytes | None = b'{"after": 1}', topic: str | None = None) -> RefusedRecord:
    topic = topic or table_topic("pfx", "public", "docs")
    headers = version_headers(str(2**47 + 5).encode(), 3)
    return RefusedRecord.of(topic, KEY, value, headers, "Broker: Message size too large")


def test_permanent_refusals() -> None:
    assert is_permanent(KafkaError.MSG_SIZE_TOO_LARGE)
    assert is_permanent(KafkaError.INVALID_RECORD)
    assert not is_permanent(KafkaError._MSG_TIMED_OUT)
    assert not is_permanent(KafkaError.TOPIC_AUTHORIZATION_FAILED)


def test_names_and_keys_as_a_person_reads_them() -> None:
    assert table_name("pfx", table_topic("pfx", "My Schema", "order.items")) == (
        "My Schema.order.items"
    )
    assert table_name("pfx", "elsewhere") == "elsewhere"
    assert key_text(KEY) == '{"id":7}'
    assert key_text(b'{"id":1}') == '{"id":1}'
    assert key_text(b"\xff\x00") == "base64:/wA="
    assert key_text(None) == "null"


def test_the_fail_line_names_table_key_reason_lsn_and_setting() -> None:
    line = fail_message(refused(b"x" * 5000), "pfx", "pfx.dlq")
    assert "\n" not in line
    for part in (
        "public.docs",
        '{"id":7}',
        "Message size too large",
        "5000 bytes",
        str(Lsn(2**47 + 5)),
        "kafka.unproducible_records=dead_letter",
        "CDC_KAFKA__UNPRODUCIBLE_RECORDS=dead_letter",
        "pfx.dlq",
        "nothing after it is acknowledged",
    ):
        assert part in line


def test_a_letter_carries_the_value_if_it_fits_else_its_size() -> None:
    small = orjson.loads(letter(refused(), "pfx"))
    assert small["reason"] == "Broker: Message size too large"
    assert small["table"] == "public.docs" and small["topic"] == "pfx.public.docs"
    assert small["key"] == '{"id":7}'
    assert (small["commit_lsn"], small["order"]) == (2**47 + 5, 3)
    assert small["value"] == '{"after": 1}' and small["value_bytes"] == 12
    big = refused(b"y" * (LETTER_VALUE_LIMIT + 1))
    assert big.value is None  # not kept in memory either
    doc = orjson.loads(letter(big, "pfx"))
    assert doc["value"] is None and doc["value_bytes"] == LETTER_VALUE_LIMIT + 1
    binary = orjson.loads(letter(refused(b"\xff\xfe"), "pfx"))
    assert binary["value"] is None and binary["value_base64"] == "//4="


class FakeMessage:
    """What a delivery report gives: no headers."""

    def __init__(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self._t, self._k, self._v = topic, key, value

    def topic(self) -> str:
        return self._t

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> None:
        return None


def publisher(mode: str, **producer: str) -> Publisher:
    # A closed port: nothing is ever delivered, which is what these tests look at.
    settings = KafkaSettings(
        bootstrap_servers="127.0.0.1:9",
        topic_prefix="pfx",
        dead_letter_topic="pfx.dlq",
        unproducible_records=mode,  # type: ignore[arg-type]
        producer={"message.max.bytes": "20000", **producer},
    )
    p = Publisher(settings)
    p._known_topics.add("pfx.dlq")  # no broker to create it on
    return p


def test_fail_mode_stops_on_a_record_too_large_for_the_producer() -> None:
    p = publisher("fail")
    txn = p.begin(Lsn(10))
    topic = table_topic("pfx", "public", "docs")
    with pytest.raises(PublishError) as caught:
        p.send(txn, topic, KEY, b"z" * 50_000, version_headers(b"10", 0))
    assert "public.docs" in str(caught.value) and '{"id":7}' in str(caught.value)
    assert txn.pending == 0
    p.close_txn(txn, Lsn(11))
    assert p.acked_lsn() is None  # nothing acknowledged after the refusal
    with pytest.raises(PublishError):
        p.poll(0)


def test_dead_letter_mode_replaces_the_record_by_its_letter() -> None:
    p = publisher("dead_letter")
    txn = p.begin(Lsn(10))
    topic = table_topic("pfx", "public", "docs")
    p.send(txn, topic, KEY, b"z" * 50_000, version_headers(b"10", 0))
    p.close_txn(txn, Lsn(11))
    # The letter (too large itself with the value: it carries the size only) stands in the record's place: the transaction waits for it.
    assert txn.pending == 1 and p.dead_letters == 1
    assert p.acked_lsn() is None


def test_a_refusal_by_the_broker_is_dead_lettered_outside_the_callback() -> None:
    p = publisher("dead_letter")
    txn = p.begin(Lsn(2**47))
    txn.pending = 1  # as if send() had queued it
    topic = table_topic("pfx", "public", "docs")
    txn.on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), FakeMessage(topic, KEY, b"v"))  # type: ignore[arg-type]
    assert txn.pending == 1 and p.dead_letters == 0  # waiting for its letter
    p.raise_if_failed()
    assert p.dead_letters == 1 and txn.pending == 1


def test_fail_mode_and_other_errors_stop_the_reader() -> None:
    topic = table_topic("pfx", "public", "docs")
    p = publisher("fail")
    txn = p.begin(Lsn(2**47))
    txn.pending = 1
    txn.on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), FakeMessage(topic, KEY, b"v"))  # type: ignore[arg-type]
    with pytest.raises(PublishError, match=r"public\.docs .*\{\"id\":7\}.*LSN 8000/0"):
        p.raise_if_failed()
    for code, where in (
        (KafkaError._MSG_TIMED_OUT, topic),  # not the record's fault: no letter
        (KafkaError.MSG_SIZE_TOO_LARGE, "pfx.dlq"),  # a letter is never dead-lettered
    ):
        q = publisher("dead_letter")
        t = q.begin(Lsn(1))
        t.pending = 1
        t.on_delivery(KafkaError(code), FakeMessage(where, KEY, b"v"))  # type: ignore[arg-type]
        with pytest.raises(PublishError, match="did not accept"):
            q.raise_if_failed()
        assert q.dead_letters == 0


# --- slot health --------------------------------------------------------------------------

SLOT = "s1"


def lost_slot(wal_status: str = "lost") -> SlotInfo:
    return SlotInfo(SLOT, "pgoutput", "db", False, None, Lsn(100), None, wal_status, None)


def streamed() -> ReaderState:
    return ReaderState(SLOT, "db", Phase.STREAMING, Lsn(50), Lsn(100), 1.0)


@pytest.mark.parametrize("mode", [SnapshotMode.INITIAL, SnapshotMode.NO_DATA])
def test_a_lost_slot_stops_with_the_way_out(mode: SnapshotMode) -> None:
    with pytest.raises(SlotError) as caught:
        plan_start(mode, SLOT, lost_slot(), streamed())
    text = str(caught.value)
    assert "\n" not in text
    for part in ("s1", "lost", "0/64", "when_needed", "cdc reset-state --drop-slot"):
        assert part in text


def test_when_needed_drops_a_lost_slot_and_snapshots_again() -> None:
    plan = plan_start(SnapshotMode.WHEN_NEEDED, SLOT, lost_slot(), streamed())
    assert plan.action is Action.SNAPSHOT and plan.drop_existing_slot and "lost" in plan.reason


def test_a_slot_that_is_not_lost_resumes() -> None:
    for status in ("reserved", "extended", "unreserved", None):
        plan = plan_start(SnapshotMode.INITIAL, SLOT, lost_slot(status), streamed())  # type: ignore[arg-type]
        assert plan.action is Action.STREAM


def test_status_warns_about_retained_wal_and_lost_slots() -> None:
    base: dict[str, Any] = {"slot": SLOT, "exists": True, "wal_status": "reserved"}
    assert slot_warnings({**base, "retained_wal_bytes": 1000}, 2000) == []
    (warning,) = slot_warnings({**base, "retained_wal_bytes": 3 * 1024**3}, 1024**3)
    assert "3.0 GiB" in warning and "postgres.retained_wal_warn_bytes" in warning
    lost = slot_warnings({**base, "wal_status": "lost", "retained_wal_bytes": None}, 1)
    assert len(lost) == 1 and "when_needed" in lost[0]
    assert slot_warnings({"slot": SLOT, "exists": False}, 1) == []


# --- box arrays ---------------------------------------------------------------------------


def test_arrays_of_box_split_on_semicolons() -> None:
    text = "{(1,1),(0,0);NULL;(2.5,3),(-1,0)}"
    assert parse_array(text, ";") == ["(1,1),(0,0)", None, "(2.5,3),(-1,0)"]
    assert parse_array("{{(1,1),(0,0)};{(2,2),(1,1)}}", ";") == [
        ["(1,1),(0,0)"],
        ["(2,2),(1,1)"],
    ]
    assert parse_array('{"a,b",c}') == ["a,b", "c"]  # other types keep the comma
    box = PgType(603, "box", "b")
    assert array_delimiter(box) == ";"
    assert array_delimiter(PgType(9, "my_box", "d", base=box)) == ";"
    assert array_delimiter(PgType(23, "int4", "b")) == ","


# --- the encoder's plan cache -------------------------------------------------------------


def _table(version: int) -> TableSchema:
    text = PgType(25, "text", "b")
    key = Column("id", PgType(23, "int4", "b"), -1, False, True)
    cols = (key, *(Column(f"c{i}", text, -1, True, False) for i in range(19)))
    if version % 2:  # every other description differs (a column added and dropped)
        cols = (*cols, Column(f"x{version}", text, -1, True, False))
    return TableSchema("public", "wide", cols, ("id",), "d")


def _live_plans() -> int:
    from schemas.plan import EncodePlan

    return sum(isinstance(o, EncodePlan) for o in gc.get_objects())


def test_a_new_description_of_a_table_replaces_its_plan() -> None:
    enc = EventEncoder(SchemaSettings(), "pfx", "db")
    source = SourceInfo(0, "false", 1, 1, 1)

    def encode(version: int) -> None:
        table = _table(version)
        row = (str(version), *["v"] * (len(table.columns) - 1))
        enc.encode_change(table, "c", None, row, source)

    for v in range(200):  # warm up (code objects, interned names)
        encode(v)
    gc.collect()
    plans_before = _live_plans()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    for v in range(200, 2200):
        encode(v)
    gc.collect()  # a plan and its generated functions form a cycle: the cyclic GC frees it
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(enc._plans) == 1
    # Every replaced plan is gone (the leak this guards against kept each one).
    assert _live_plans() - plans_before <= 1
    # Before: about 42 KiB per Relation message, i.e. ~80 MiB here. tracemalloc counts every
    # thread's allocations, and threads left by earlier tests of a full run added ~4 MiB in
    # this window in some runs: the bound leaves room for that, ten times under the leak.
    assert after - before < 8 * 1024 * 1024, f"{(after - before) / 2000:.0f} bytes per description"


def test_an_equal_description_reuses_the_plan() -> None:
    enc = EventEncoder(SchemaSettings(), "pfx", "db")
    a = _table(0)
    b = replace(a)  # equal, not identical (loaded again)
    plan = enc.plan(a)
    assert enc.plan(b) is plan and plan.table is b
