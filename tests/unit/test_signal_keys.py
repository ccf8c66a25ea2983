"""Signal keys bound to one reader (issue 34, finding 4): where the key comes from, which
reader a signed value is for, and how long a carried-out signal is remembered."""

from __future__ import annotations

import hashlib
import hmac
import logging
from pathlib import Path

import orjson
import pytest
from pydantic import SecretStr

from cdc.incremental import queue
from cdc.incremental.auth import (
    MAGIC,
    MIN_DERIVED_PASSWORD,
    SIGNAL_MAX_AGE_S,
    Verifier,
    key_of,
    sign,
    sign_value,
)
from cdc.incremental.channels import SignalIntake
from cdc.incremental.queue import SnapshotsState
from cdc.incremental.signals import execute_document
from pgcdc.core import local_stack
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import PostgresSettings

pytestmark = pytest.mark.unit

KEY = b"k" * 32
NOW = 1_000_000.0


def _verifier(database: str = "shop", slot: str = "cdc_slot") -> Verifier:
    return Verifier(KEY, database, slot, clock=lambda: NOW)


def _signed(doc: dict[str, object], database: str = "shop", slot: str = "cdc_slot") -> bytes:
    return sign(KEY, doc, database=database, slot=slot, now=NOW)


@pytest.fixture
def stack_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STACK_DIR", str(tmp_path))
    return tmp_path


# --- which reader a signed value is for ------------------------------------------------


@pytest.mark.parametrize(
    ("database", "slot", "reason"),
    [
        ("shop", "other_slot", "signed for database 'shop', slot 'other_slot', not for this"),
        ("billing", "cdc_slot", "signed for database 'billing', slot 'cdc_slot', not for this"),
    ],
)
def test_a_value_signed_for_another_reader_is_refused(
    database: str, slot: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    doc = execute_document([("public", "t")])
    assert _verifier().verify(_signed(doc), "kafka") is not None  # for this reader: runs
    with caplog.at_level(logging.WARNING):
        assert _verifier().verify(_signed(doc, database, slot), "kafka") is None
    assert reason in caplog.text


def test_a_value_signed_before_signals_named_their_reader_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    payload = orjson.dumps({**execute_document([("public", "t")]), "ts": NOW})
    digest = hmac.new(KEY, payload, hashlib.sha256).hexdigest().encode()
    with caplog.at_level(logging.WARNING):
        assert _verifier().verify(MAGIC + digest + b":" + payload, "wal@0/1") is None
    assert "names no database and slot" in caplog.text and "sign it again" in caplog.text


def test_sign_value_signs_for_the_database_and_slot_of_the_settings() -> None:
    pg = PostgresSettings(
        dsn=SecretStr("postgresql://app@db.example:5432/shop"),
        slot_name="orders_slot",
        signal_secret=SecretStr("a-secret-of-16-chars-or-more"),
    )
    signed = sign_value(pg, b'{"type":"execute-snapshot","data":{}}')
    key = key_of(pg).key
    assert Verifier(key, "shop", "orders_slot").verify(signed, "t") is not None
    assert Verifier(key, "shop", "cdc_slot").verify(signed, "t") is None
    assert Verifier(key, "app", "orders_slot").verify(signed, "t") is None


# --- where the key comes from ----------------------------------------------------------


def test_a_short_dsn_password_derives_no_key(stack_dir: Path) -> None:
    short = PostgresSettings(dsn=SecretStr("postgresql://cdc:cdc@db.example/cdc"))
    found = key_of(short)
    assert found.key is None
    assert "3 characters, too few to derive a key from (16 or more)" in found.source
    with pytest.raises(ConfigError, match=r"too few to derive a key.*set postgres\.signal_secret"):
        sign_value(short, b"{}")
    password = "p" * MIN_DERIVED_PASSWORD
    long = PostgresSettings(dsn=SecretStr(f"postgresql://cdc:{password}@db.example/cdc"))
    assert key_of(long).key is not None
    assert key_of(long).source == "derived from the password in postgres.dsn"
    other_user = PostgresSettings(dsn=SecretStr(f"postgresql://app:{password}@db.example/cdc"))
    assert key_of(other_user).key != key_of(long).key  # salted with the user


def test_the_local_stack_key_serves_a_dsn_at_the_local_stack_only(stack_dir: Path) -> None:
    at_stack = PostgresSettings()  # the default DSN: the local stack, password cdc
    assert key_of(at_stack).key is None  # no key written yet, and "cdc" is too short
    written = local_stack.ensure_secret(local_stack.signal_secret_path())
    assert len(written) >= 40 and (stack_dir / "signal-secret").stat().st_mode & 0o777 == 0o600
    assert key_of(at_stack).key == written.encode()
    assert "the local stack's key" in key_of(at_stack).source
    other_db = PostgresSettings(dsn=SecretStr("postgresql://cdc:cdc@localhost:55432/t_1"))
    assert key_of(other_db).key == written.encode()  # any database of the stack's server
    elsewhere = PostgresSettings(dsn=SecretStr("postgresql://cdc:cdc@127.0.0.1:5432/cdc"))
    assert key_of(elsewhere).key is None
    given = PostgresSettings(signal_secret=SecretStr("a-secret-of-16-chars-or-more"))
    assert key_of(given).key == b"a-secret-of-16-chars-or-more"  # a key given wins
    assert local_stack.ensure_secret(local_stack.signal_secret_path()) == written  # once


def test_an_empty_secret_from_the_environment_is_no_secret() -> None:
    assert PostgresSettings(signal_secret="").signal_secret is None  # type: ignore[arg-type]


# --- how long a signal is remembered ---------------------------------------------------


def _intake(state: SnapshotsState) -> SignalIntake:
    return SignalIntake(_verifier(), state, clock=lambda: NOW)


def test_a_replay_after_10001_later_signals_is_still_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = SnapshotsState()
    intake = _intake(state)
    first = _signed({**execute_document([("public", "t")]), "id": "first"})
    accepted = intake.wal(first, "0/1")
    assert accepted is not None
    intake.remember(accepted)
    for i in range(10_001):
        later = intake.wal(_signed({**execute_document([("public", "t")]), "id": f"s{i}"}), "0/2")
        assert later is not None
        intake.remember(later)
    with caplog.at_level(logging.INFO):
        assert intake.wal(first, "0/3") is None
    assert "signal first from wal@0/3 already carried out" in caplog.text
    # Forgotten only once too old to run anyway.
    state.remember("late", NOW + SIGNAL_MAX_AGE_S, oldest=NOW + 1)
    assert "first" not in state.seen


def test_past_the_remembered_maximum_new_signals_are_refused_not_old_ones_forgotten(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(queue, "SEEN_SIGNALS_MAX", 3)
    state = SnapshotsState()
    intake = _intake(state)
    for i in range(3):
        accepted = intake.wal(_signed({**execute_document([("public", "t")]), "id": f"{i}"}), "x")
        assert accepted is not None
        intake.remember(accepted)
    with caplog.at_level(logging.WARNING):
        assert intake.wal(_signed({**execute_document([("public", "t")]), "id": "3"}), "x") is None
        assert (
            intake.table_row({"id": "r", "type": "execute-snapshot", "data": "{}"}, "0/9") is None
        )
    assert caplog.text.count("takes no more until the oldest expire") == 2
    assert set(state.seen) == {"0", "1", "2"}
