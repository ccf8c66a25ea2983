"""The JSON fast paths (generated row/key functions, encode_change) give byte for byte what
the plain construction gives: the Connect payload of ``value_payload``/``key_payload``
serialised with ``json_default`` behind the schema. Rows are the all-types fixture captured
from a real server, plus unchanged-TOAST, binary-format and malformed values."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Sequence
from functools import partial
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.core.errors import SchemaError
from pgcdc.core.settings import BinaryHandling, DecimalHandling, IntervalHandling, SchemaSettings
from pgcdc.core.values import UNCHANGED_TOAST, RawValue
from schemas import envelope
from schemas.envelope import EventEncoder
from schemas.formats import json_default
from schemas.model import Column, PgType, SourceInfo, TableSchema, TransactionInfo
from tests.unit.schemas.test_roundtrip import ROW, TABLE

pytestmark = pytest.mark.unit

NOW_NS = 1_716_000_000_123_456_789
SOURCE = SourceInfo(1559033904863123, "false", 555, 24023128, 24023119)
TXN = TransactionInfo("555:24023128", 3, 2)

VARIANTS: list[dict[str, Any]] = [
    {},
    {"schemas_enable": False},
    {"decimal_handling_mode": DecimalHandling.STRING},
    {"decimal_handling_mode": DecimalHandling.DOUBLE},
    {"binary_handling_mode": BinaryHandling.BASE64},
    {"binary_handling_mode": BinaryHandling.HEX},
    {"interval_handling_mode": IntervalHandling.STRING},
    {"provide_transaction_metadata": True},
]


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envelope, "time", types.SimpleNamespace(time_ns=lambda: NOW_NS))


def expected_value(
    enc: EventEncoder,
    table: TableSchema,
    op: str,
    before: Sequence[RawValue] | None,
    after: Sequence[RawValue] | None,
    tx: TransactionInfo | None,
) -> bytes:
    payload = enc.value_payload(table, op, before, after, SOURCE, tx, now_ns=NOW_NS)
    body = orjson.dumps(payload, default=json_default)
    if not enc.settings.schemas_enable:
        return body
    return b'{"schema":' + enc.plan(table).envelope_schema_json + b',"payload":' + body + b"}"


def expected_key(enc: EventEncoder, table: TableSchema, row: Sequence[RawValue]) -> bytes | None:
    payload = enc.key_payload(table, row)
    if payload is None:
        return None
    body = orjson.dumps(payload, default=json_default)
    if not enc.settings.schemas_enable:
        return body
    schema = enc.plan(table).key_schema_json
    assert schema is not None
    return b'{"schema":' + schema + b',"payload":' + body + b"}"


def same_outcome(expected: Any, *calls: Any) -> None:
    """Each call returns what ``expected()`` returns, or raises the same SchemaError."""
    try:
        want = expected()
    except SchemaError as e:
        for call in calls:
            with pytest.raises(SchemaError) as got:
                call()
            assert str(got.value) == str(e)
        return
    for call in calls:
        assert call() == want


def check_all_ops(
    enc: EventEncoder,
    table: TableSchema,
    before: Sequence[RawValue],
    after: Sequence[RawValue],
    tx: TransactionInfo | None = None,
) -> None:
    for op, b, a in (("c", None, after), ("u", before, after), ("d", before, None)):
        keyed = a if a is not None else b
        assert keyed is not None
        same_outcome(
            partial(expected_value, enc, table, op, b, a, tx),
            partial(enc.encode_value, table, op, b, a, SOURCE, tx),
        )
        same_outcome(
            partial(expected_key, enc, table, keyed), partial(enc.encode_key, table, keyed)
        )
        same_outcome(
            partial(expected_change, enc, table, op, b, a, tx),
            partial(enc.encode_change, table, op, b, a, SOURCE, tx),
        )


def expected_change(
    enc: EventEncoder,
    table: TableSchema,
    op: str,
    before: Sequence[RawValue] | None,
    after: Sequence[RawValue] | None,
    tx: TransactionInfo | None,
) -> tuple[bytes | None, bytes]:
    keyed = after if after is not None else before
    assert keyed is not None
    return expected_key(enc, table, keyed), expected_value(enc, table, op, before, after, tx)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(map(str, v.values())))
def test_fixture_rows_byte_for_byte(
    all_types: tuple[TableSchema, list[list[str | None]]], variant: dict[str, Any]
) -> None:
    table, rows = all_types
    enc = EventEncoder(SchemaSettings(**variant), "PostgreSQL_server", "postgres")
    for before, after in zip(rows, rows[1:] + rows[:1], strict=True):
        check_all_ops(enc, table, before, after, TXN)


def test_unchanged_toast_and_binary_values(
    all_types: tuple[TableSchema, list[list[str | None]]],
) -> None:
    table, rows = all_types
    names = [c.name for c in table.columns]
    for mode in BinaryHandling:
        enc = EventEncoder(SchemaSettings(binary_handling_mode=mode), "p", "db")
        for row in rows:
            after: list[RawValue] = list(row)
            after[names.index("c_text")] = UNCHANGED_TOAST
            after[names.index("c_bytea")] = b"\x00\xffraw"  # a binary-format tuple value
            check_all_ops(enc, table, row, after)
            after[names.index("c_bytea")] = UNCHANGED_TOAST
            check_all_ops(enc, table, row, after)


def test_errors_name_the_column_on_every_path(
    all_types: tuple[TableSchema, list[list[str | None]]],
) -> None:
    table, rows = all_types
    names = [c.name for c in table.columns]
    enc = EventEncoder(SchemaSettings(), "p", "db")
    for column, bad in (("c_int4", "12x"), ("c_bool", "maybe"), ("c_date", "2024-13-45x")):
        row: list[RawValue] = list(rows[0])
        row[names.index(column)] = bad
        with pytest.raises(SchemaError) as slow:
            enc.value_payload(table, "c", None, row, SOURCE)
        assert f"column {column} " in str(slow.value)
        with pytest.raises(SchemaError) as fast:
            enc.encode_change(table, "c", None, row, SOURCE)
        assert str(fast.value) == str(slow.value)
    for bad_key in (None, "not a number"):
        row = list(rows[0])
        row[0] = bad_key
        with pytest.raises(SchemaError) as slow:
            enc.key_payload(table, row)
        for call in (
            partial(enc.encode_key, table, row),
            partial(enc.encode_change, table, "c", None, row, SOURCE),
        ):
            with pytest.raises(SchemaError) as fast:
                call()
            assert str(fast.value) == str(slow.value)


def test_row_width_is_checked(all_types: tuple[TableSchema, list[list[str | None]]]) -> None:
    table, rows = all_types
    enc = EventEncoder(SchemaSettings(), "p", "db")
    with pytest.raises(SchemaError, match="row has"):
        enc.encode_change(table, "c", None, rows[0][:-1], SOURCE)


@settings(max_examples=150, deadline=None)
@given(ROW, ROW, st.sampled_from(VARIANTS))
def test_random_rows_byte_for_byte(
    before: list[Any], after: list[Any], variant: dict[str, Any]
) -> None:
    enc = EventEncoder(SchemaSettings(**variant), "rt", "db")
    # The autouse clock fixture is function-scoped; hypothesis reruns need it per example.
    saved = envelope.time
    envelope.time = types.SimpleNamespace(time_ns=lambda: NOW_NS)  # type: ignore[assignment]
    try:
        check_all_ops(enc, TABLE, before, after, TXN)
    finally:
        envelope.time = saved


MARKERS = ("first", "true", "first_in_data_collection", "last_in_data_collection", "last")


def check_row_events(
    enc: EventEncoder, table: TableSchema, rows: Sequence[Sequence[RawValue]]
) -> list[int]:
    """RowEvents (the snapshot's batch path) gives what encode_change gives, row by row;
    returns how many rows encoded per marker (the others raised the same error both ways)."""
    counts = []
    for marker in MARKERS:
        source = SourceInfo(1716000000123456, marker, 771, 24023128, None)
        events = enc.row_events(table, "r", source)
        good = []
        for row in rows:
            same_outcome(
                partial(enc.encode_change, table, "r", None, row, source),
                lambda row=row, events=events: events.encode([row])[0],
            )
            with contextlib.suppress(SchemaError):
                good.append((row, enc.encode_change(table, "r", None, row, source)))
        # Many rows in one call (the snapshot's way), each as encode_change gives it.
        assert events.encode([row for row, _ in good]) == [want for _, want in good]
        counts.append(len(good))
    return counts


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(map(str, v.values())))
def test_row_events_byte_for_byte(
    all_types: tuple[TableSchema, list[list[str | None]]], variant: dict[str, Any]
) -> None:
    table, rows = all_types
    enc = EventEncoder(SchemaSettings(**variant), "PostgreSQL_server", "postgres")
    # Only the NaN/Infinity rows fail (in precise mode).
    assert min(check_row_events(enc, table, rows)) >= len(rows) - 3
    # Bad values and a null key: the same SchemaError as encode_change.
    names = [c.name for c in table.columns]
    bad: list[list[RawValue]] = []
    for column, value in (("c_int4", "12x"), ("c_bool", "maybe"), ("id", None), ("id", "x")):
        row: list[RawValue] = list(rows[0])
        row[names.index(column)] = value
        bad.append(row)
    bad.append(list(rows[0])[:-1])  # a row too short
    # Every bad row raised, on both paths.
    assert check_row_events(enc, table, bad) == [0] * len(MARKERS)


def test_row_events_without_key_and_with_percent_names() -> None:
    """Templates survive ``%`` in names (they are ``%``-formatted) and keyless tables."""
    text = PgType(25, "text", "b")
    cols = (Column("a%s", text, -1, False, True), Column("b%%d", text, -1, True, False))
    for keys in (("a%s",), ()):
        table = TableSchema("s%b", "t%d", cols, keys, "d")
        for variant in VARIANTS:
            enc = EventEncoder(SchemaSettings(**variant), "p%", "db%")
            counts = check_row_events(enc, table, [["x%sy", None], ["%", "%d%%"]])
            assert counts == [2] * len(MARKERS)
