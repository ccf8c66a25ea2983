"""Signed signals: who may make the reader snapshot a table.

``pg_logical_emit_message`` is executable by PUBLIC and the local stack's Kafka has no
authorizer, so a WAL message or a signal-topic record proves nothing about its sender. Both
channels therefore carry signed signals only::

    sig1:<HMAC-SHA256 of the document, 64 hex digits>:<the document's exact JSON bytes>

The document is ``{"id", "type", "data", "ts"}`` (``ts``: when it was signed, UNIX seconds).
The key is ``postgres.signal_secret``; unset, it is derived from the password in
``postgres.dsn`` (scrypt, salted with the user name), so ``cdc snapshot``, reading the same
settings as the reader, signs what the reader accepts with nothing more to configure, and
whoever can sign could already log in as the reader. With neither, WAL and Kafka signals are
refused (the signal table, protected by its grants, still works).

Replays: a signal is carried out once (its id is remembered in the reader's durable state,
:mod:`cdc.incremental.queue`) and refused once older than :data:`SIGNAL_MAX_AGE_S`.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.connection import parse_dsn
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import PostgresSettings

log = logging.getLogger(__name__)

MAGIC = b"sig1:"
SIGNAL_MAX_AGE_S = 7 * 24 * 3600.0  # a signal older than this is refused (and forgotten)
FUTURE_SKEW_S = 300.0  # a signal signed this far in the reader's future is still accepted


class SignalKeyMissing(Exception):
    """Neither ``postgres.signal_secret`` nor a password in ``postgres.dsn``."""


def signal_key(pg: PostgresSettings) -> bytes | None:
    """The signing key of these settings (see the module docstring), or None."""
    if pg.signal_secret is not None:
        return pg.signal_secret.get_secret_value().encode()  # as `openssl dgst -hmac` takes it
    params = parse_dsn(pg.dsn.get_secret_value())
    password = params.get("password")
    if not password:
        return None
    return _derived(str(params.get("user") or ""), str(password))


@functools.lru_cache(maxsize=8)
def _derived(user: str, password: str) -> bytes:
    salt = b"pgcdc-signal\0" + user.encode()
    return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)


def sign(key: bytes, document: dict[str, Any], now: float | None = None) -> bytes:
    """The signed form of ``document`` (``ts`` added when missing)."""
    doc = dict(document)
    doc.setdefault("ts", time.time() if now is None else now)
    payload = orjson.dumps(doc)
    digest = hmac.new(key, payload, hashlib.sha256).hexdigest().encode()
    return MAGIC + digest + b":" + payload


def sign_value(pg: PostgresSettings, body: bytes) -> bytes:
    """``body`` (a JSON signal) signed with the key of ``pg``, an id added when it has none
    (``cdc topic send --sign``); ConfigError without a key or a JSON object."""
    key = signal_key(pg)
    if key is None:
        raise ConfigError(
            "--sign needs a signal key: set postgres.signal_secret (or a password in postgres.dsn)"
        )
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"--sign needs a JSON object as the value: {e}") from e
    if not isinstance(document, dict):
        raise ConfigError("--sign needs a JSON object as the value")
    document.setdefault("id", uuid.uuid4().hex)
    return sign(key, document)


@dataclass(frozen=True)
class Verified:
    """A signal whose signature holds: its document, id and signing time."""

    document: dict[str, Any]
    id: str
    ts: float


class Verifier:
    """Checks signed signals; every refusal is one warning line naming the source."""

    def __init__(self, key: bytes | None, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def verify(self, content: bytes, source: str) -> Verified | None:
        """The signal in ``content`` if it is signed with our key and fresh, else None."""
        reason = self._check(content)
        if isinstance(reason, Verified):
            return reason
        log.warning("signal from %s ignored: %s", source, reason, extra={"signal_source": source})
        return None

    def _check(self, content: bytes) -> Verified | str:
        if self._key is None:
            return (
                "signed signals are refused: set postgres.signal_secret (or a password in "
                "postgres.dsn) on the reader and the sender"
            )
        if not content.startswith(MAGIC) or len(content) < len(MAGIC) + 65:
            return "not signed (expected sig1:<hmac>:<document>; see docs/incremental-snapshots.md)"
        digest, sep, payload = content[len(MAGIC) :].partition(b":")
        expected = hmac.new(self._key, payload, hashlib.sha256).hexdigest().encode()
        if not sep or not hmac.compare_digest(digest, expected):
            return "bad signature (signed with another key)"
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError as e:
            return f"signed document is not JSON: {e}"
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
            return "signed document has no id"
        ts = doc.get("ts")
        if not isinstance(ts, int | float):
            return "signed document has no ts (when it was signed)"
        now = self._clock()
        if ts < now - SIGNAL_MAX_AGE_S:
            return f"signal {doc['id']} was signed {(now - ts) / 3600:.0f} h ago (too old)"
        if ts > now + FUTURE_SKEW_S:
            return f"signal {doc['id']} is signed in the future ({ts - now:.0f} s ahead)"
        return Verified(doc, doc["id"], float(ts))
