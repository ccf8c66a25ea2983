"""Signed signals: who may make the reader snapshot a table.

``pg_logical_emit_message`` is executable by PUBLIC and the local stack's Kafka has no
authorizer, so a WAL message or a signal-topic record proves nothing about its sender. Both
channels therefore carry signed signals only::

    sig1:<HMAC-SHA256 of the document, 64 hex digits>:<the document's exact JSON bytes>

The document is ``{"id", "type", "data", "ts", "database", "slot"}`` (``ts``: when it was
signed, UNIX seconds; ``database`` and ``slot``: the one reader it is meant for, so a value
signed for one reader is refused by every other reader holding the same key).

The key (:func:`key_of`): ``postgres.signal_secret``; unset, the local stack's generated key
when ``postgres.dsn`` points at the local stack (:mod:`pgcdc.core.local_stack`); else derived
from the password in ``postgres.dsn`` (scrypt, salted with the user name) when that has
:data:`MIN_DERIVED_PASSWORD` characters or more, so ``cdc snapshot``, reading the same settings
as the reader, signs what the reader accepts with nothing more to configure, and whoever can
sign could already log in as the reader. With none of these, WAL and Kafka signals are refused
(the signal table, protected by its grants, still works).

Replays: a signal is carried out once: its id is remembered in the reader's durable state
(:mod:`cdc.incremental.queue`) for as long as its signature is valid, and it is refused once
older than :data:`SIGNAL_MAX_AGE_S`.
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import hmac
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.connection import parse_dsn
from pgcdc.core import local_stack
from pgcdc.core.errors import ConfigError
from pgcdc.core.settings import PostgresSettings

log = logging.getLogger(__name__)

MAGIC = b"sig1:"
SIGNAL_MAX_AGE_S = 7 * 24 * 3600.0  # a signal older than this is refused (and forgotten)
FUTURE_SKEW_S = 300.0  # a signal signed this far in the reader's future is still accepted
# A password shorter than this derives no key: a guessable key signs anything.
MIN_DERIVED_PASSWORD = 16


@dataclass(frozen=True)
class SignalKey:
    """The signing key of some settings and where it came from, or why there is none."""

    key: bytes | None
    source: str  # where the key came from, or why there is none (one clause)


def key_of(pg: PostgresSettings) -> SignalKey:
    """The signing key of these settings (see the module docstring)."""
    if pg.signal_secret is not None:
        # As `openssl dgst -hmac` takes it.
        return SignalKey(pg.signal_secret.get_secret_value().encode(), "postgres.signal_secret")
    params = parse_dsn(pg.dsn.get_secret_value())
    if local_stack.is_local_stack(params.get("host"), params.get("port")):
        path = local_stack.signal_secret_path()
        secret = local_stack.read_secret(path)
        if secret is not None:
            return SignalKey(secret.encode(), f"the local stack's key ({path})")
    password = str(params.get("password") or "")
    if len(password) >= MIN_DERIVED_PASSWORD:
        derived = _derived(str(params.get("user") or ""), password)
        return SignalKey(derived, "derived from the password in postgres.dsn")
    why = (
        f"the password in postgres.dsn has {len(password)} characters, too few to derive a "
        f"key from ({MIN_DERIVED_PASSWORD} or more)"
        if password
        else "postgres.dsn holds no password to derive a key from"
    )
    return SignalKey(None, f"there is no signal key ({why})")


# How to give a reader and its senders a key (the way past every "no key" line).
SET_A_KEY = (
    "set postgres.signal_secret (16 characters or more, e.g. "
    "CDC_POSTGRES__SIGNAL_SECRET=$(openssl rand -base64 32)) on the reader and the sender"
)


def signal_key(pg: PostgresSettings) -> bytes | None:
    """The signing key of these settings, or None (:func:`key_of` says why)."""
    return key_of(pg).key


def dsn_database(pg: PostgresSettings) -> str:
    """The database ``postgres.dsn`` connects to, as libpq picks it: its dbname, else
    PGDATABASE, else the user name (its user, PGUSER, else the login name)."""
    params = parse_dsn(pg.dsn.get_secret_value())
    user = params.get("user") or os.environ.get("PGUSER") or getpass.getuser()
    return str(params.get("dbname") or os.environ.get("PGDATABASE") or user)


@functools.lru_cache(maxsize=8)
def _derived(user: str, password: str) -> bytes:
    salt = b"pgcdc-signal\0" + user.encode()
    return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)


def sign(
    key: bytes, document: dict[str, Any], *, database: str, slot: str, now: float | None = None
) -> bytes:
    """The signed form of ``document`` for the reader of ``database`` and ``slot`` (``ts``
    added when missing)."""
    doc = {**document, "database": database, "slot": slot}
    doc.setdefault("ts", time.time() if now is None else now)
    payload = orjson.dumps(doc)
    digest = hmac.new(key, payload, hashlib.sha256).hexdigest().encode()
    return MAGIC + digest + b":" + payload


def sign_value(pg: PostgresSettings, body: bytes) -> bytes:
    """``body`` (a JSON signal) signed with the key of ``pg`` for its reader (the database of
    ``postgres.dsn`` and ``postgres.slot_name``), an id added when it has none (``cdc topic
    send --sign``); ConfigError without a key or a JSON object."""
    found = key_of(pg)
    if found.key is None:
        raise ConfigError(f"--sign needs a signal key, and {found.source}: {SET_A_KEY}")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"--sign needs a JSON object as the value: {e}") from e
    if not isinstance(document, dict):
        raise ConfigError("--sign needs a JSON object as the value")
    document.setdefault("id", uuid.uuid4().hex)
    return sign(found.key, document, database=dsn_database(pg), slot=pg.slot_name)


@dataclass(frozen=True)
class Verified:
    """A signal whose signature holds: its document, id and signing time."""

    document: dict[str, Any]
    id: str
    ts: float


class Verifier:
    """Checks signed signals; every refusal is one warning line naming the source."""

    def __init__(
        self,
        key: bytes | None,
        database: str,
        slot: str,
        clock: Callable[[], float] = time.time,
        *,
        missing: str = "there is no signal key",
    ) -> None:
        self._key = key
        self._database, self._slot = database, slot
        self._clock = clock
        self._missing = missing

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
            return f"signed signals are refused: {self._missing}; {SET_A_KEY}"
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
        meant = (doc.get("database"), doc.get("slot"))
        if meant != (self._database, self._slot):
            if meant == (None, None):
                return (
                    f"signal {doc['id']} names no database and slot (signed by a cdc from "
                    "before signals were bound to one reader): sign it again"
                )
            return (
                f"signal {doc['id']} is signed for database {meant[0]!r}, slot {meant[1]!r}, "
                f"not for this reader (database {self._database!r}, slot {self._slot!r})"
            )
        now = self._clock()
        if ts < now - SIGNAL_MAX_AGE_S:
            return f"signal {doc['id']} was signed {(now - ts) / 3600:.0f} h ago (too old)"
        if ts > now + FUTURE_SKEW_S:
            return f"signal {doc['id']} is signed in the future ({ts - now:.0f} s ahead)"
        return Verified(doc, doc["id"], float(ts))
