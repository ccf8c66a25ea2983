"""`cdc topic send --sign`: a signal-topic value the reader's verifier accepts."""

from __future__ import annotations

import orjson
import pytest
from pydantic import SecretStr

from cdc.incremental.auth import Verifier, sign_value, signal_key
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import PostgresSettings

pytestmark = pytest.mark.unit

DOC = b'{"type":"execute-snapshot","data":{"data-collections":["public.orders"]}}'


def test_a_signed_value_is_verified_with_the_same_settings_and_gets_an_id() -> None:
    pg = PostgresSettings(signal_secret=SecretStr("a-secret-of-16-chars-or-more"))
    key = signal_key(pg)
    signed = sign_value(pg, DOC)
    verified = Verifier(key, "cdc", "cdc_slot").verify(signed, "test")
    assert verified is not None
    assert verified.document["type"] == "execute-snapshot" and verified.id
    other = PostgresSettings(signal_secret=SecretStr("another-secret-of-16-chars"))
    assert Verifier(signal_key(other), "cdc", "cdc_slot").verify(signed, "test") is None
    # An id the sender gave is kept.
    given = sign_value(pg, orjson.dumps({**orjson.loads(DOC), "id": "mine"}))
    assert Verifier(key, "cdc", "cdc_slot").verify(given, "test").id == "mine"  # type: ignore[union-attr]


def test_sign_refuses_what_it_cannot_sign() -> None:
    pg = PostgresSettings(signal_secret=SecretStr("a-secret-of-16-chars-or-more"))
    for body in (b"not json", b"[1, 2]"):
        with pytest.raises(ConfigError, match="JSON object"):
            sign_value(pg, body)
    keyless = PostgresSettings(dsn=SecretStr("postgresql://cdc@db.example:5432/cdc"))
    with pytest.raises(ConfigError, match="signal key"):
        sign_value(keyless, DOC)
