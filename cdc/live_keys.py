"""The keys live in a table topic, kept on disk: what a TRUNCATE deletes, what a re-snapshot
tombstones.

A key is live when its newest record in the topic is not a tombstone: that is what log
compaction keeps, so it is what a follower rebuilt from the topic would hold. Keys are
compared by their bytes here (compaction does), and each live key may carry an *identity*,
its value (:meth:`schemas.envelope.EventEncoder.key_identity`), for the snapshot, which asks
"is this row's key live under other bytes?" (a key written with schemas and now without, or
as int and now as bigint).

A TRUNCATE's scan takes the truncate's version (:func:`keys_live_before`): a key with a
record newer than the truncate, from a later transaction (a change streamed after it, or an
incremental snapshot row versioned at its high watermark, already in the topic when the
truncate is replayed after a restart), is left alone. Tombstoning it would let compaction
remove the newer record for good. Records of the truncate's own transaction (its deletes
and inserts written by the run before) do not count as newer.

The map lives in a SQLite file in a temporary folder, not in a Python set: a topic of a
million keys costs a few dozen megabytes of disk and a bounded page cache, not hundreds of
megabytes of memory.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import Message

from cdc.kafka_clients import read_topic
from pgcdc.core.contract import HEADER_COMMIT_LSN, HEADER_ORDER
from pgcdc.core.settings import KafkaSettings

# A record's key and whether its value is not null (a tombstone has a null value).
KeyRecord = tuple[bytes | None, bool]
# The same with the record's version (commit LSN, order), None when it carries none.
Version = tuple[int, int]
VersionedRecord = tuple[bytes | None, bool, Version | None]
Identity = Callable[[bytes], bytes]

PAGE_CACHE_KIB = 8 * 1024  # SQLite's page cache, the store's memory bound
SCAN_TIMEOUT_S = 1800.0  # reading a whole topic; a million records take well under a minute


class LiveKeys:
    """Keys whose newest record is not a tombstone, with their identity, in a SQLite file."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="cdc-live-keys-", dir=directory))
        self._db = sqlite3.connect(self._dir / "keys.sqlite", isolation_level=None)
        for pragma in (
            "journal_mode = OFF",
            "synchronous = OFF",
            "temp_store = FILE",
            f"cache_size = -{PAGE_CACHE_KIB}",
        ):
            self._db.execute(f"PRAGMA {pragma}")
        self._db.execute("CREATE TABLE live (key BLOB PRIMARY KEY, ident BLOB) WITHOUT ROWID")
        self._db.execute("CREATE TEMP TABLE claimed (key BLOB, ident BLOB)")
        self._count = 0

    def load(self, records: Iterable[KeyRecord], identity: Identity | None = None) -> None:
        """Take ``records`` in topic order (per key): a tombstone removes its key, any other
        record makes it live. ``identity`` gives each live key its identity (default: its
        bytes). Records without a key are ignored."""
        self.load_versioned(((k, live, None) for k, live in records), identity)

    def load_versioned(
        self,
        records: Iterable[VersionedRecord],
        identity: Identity | None = None,
        before: Version | None = None,
    ) -> None:
        """:meth:`load`; with ``before`` (a truncate's version), a key with a record newer
        than it from another transaction is not live here (see the module docstring)."""
        db = self._db
        db.execute("BEGIN")  # one transaction: no journal, no sync, a plain bulk load
        if before is not None:
            db.execute("CREATE TEMP TABLE IF NOT EXISTS newer (key BLOB PRIMARY KEY)")
        for key, live, version in records:
            if key is None:
                continue
            newer = before is not None and version is not None and version > before
            if newer and version is not None and before is not None and version[0] != before[0]:
                db.execute("INSERT OR IGNORE INTO newer VALUES (?)", (key,))
            if live:
                ident = identity(key) if identity is not None else key
                db.execute("INSERT OR REPLACE INTO live VALUES (?, ?)", (key, ident))
            else:
                db.execute("DELETE FROM live WHERE key = ?", (key,))
        if before is not None:
            db.execute("DELETE FROM live WHERE key IN (SELECT key FROM newer)")
        db.execute("COMMIT")
        db.execute("CREATE INDEX IF NOT EXISTS live_ident ON live (ident)")
        row = db.execute("SELECT count(*) FROM live").fetchone()
        self._count = int(row[0])

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[bytes]:
        """Every live key, in byte order."""
        for (key,) in self._db.execute("SELECT key FROM live ORDER BY key"):
            yield bytes(key)

    def claim(self, rows: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
        """Rows (key, identity) the snapshot is about to write: their identities stop being
        live here. Returns the live keys that share an identity with a row but not its bytes:
        the same key under old bytes, which need a tombstone ordered before the row."""
        if not self._count or not rows:
            return []
        db = self._db
        db.execute("BEGIN")
        db.execute("DELETE FROM claimed")
        db.executemany("INSERT INTO claimed VALUES (?, ?)", rows)
        other_bytes = [
            bytes(k)
            for (k,) in db.execute(
                "SELECT key FROM live WHERE ident IN (SELECT ident FROM claimed) "
                "AND key NOT IN (SELECT key FROM claimed)"
            )
        ]
        gone = db.execute("DELETE FROM live WHERE ident IN (SELECT ident FROM claimed)").rowcount
        db.execute("COMMIT")
        self._count -= gone
        return other_bytes

    def close(self) -> None:
        """Delete the file."""
        self._db.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LiveKeys:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def record_version(headers: Any) -> Version | None:
    """A record's (commit LSN, order) from its headers (as confluent_kafka gives them),
    None without them."""
    lsn = order = None
    items = headers.items() if isinstance(headers, dict) else headers or ()
    for name, value in items:
        if name == HEADER_COMMIT_LSN and value:
            lsn = int(value)
        elif name == HEADER_ORDER and value:
            order = int(value)
    return None if lsn is None else (lsn, order or 0)


def _messages(
    kafka: KafkaSettings, topic: str, tick: Callable[[], None] | None
) -> Iterator[Message]:
    """Every record of ``topic`` up to its current end; ``tick`` is called every few
    thousand records (a long scan keeps other sessions alive)."""
    records = read_topic(
        kafka,
        topic,
        "cdc-live-keys",
        SCAN_TIMEOUT_S,
        **{
            "fetch.max.bytes": 16 * 1024 * 1024,
            "queued.max.messages.kbytes": 32 * 1024,
            # A transactional reader's records before the truncate, in the Kafka
            # transaction still open, count too (a record of an aborted one names a key
            # at most once more: its delete is a tombstone of nothing).
            "isolation.level": "read_uncommitted",
        },
    )
    for n, msg in enumerate(records):
        if tick is not None and not n & 0xFFF:
            tick()
        yield msg


def versioned_records(
    kafka: KafkaSettings, topic: str, tick: Callable[[], None] | None = None
) -> Iterator[VersionedRecord]:
    """(key, value is not null, version) of every record of ``topic`` up to its end."""
    for msg in _messages(kafka, topic, tick):
        try:
            version = record_version(msg.headers())
        except ValueError:
            version = None  # not our reader's headers: an older record
        yield msg.key(), msg.value() is not None, version


def keys_live_before(
    kafka: KafkaSettings,
    topic: str,
    before: Version,
    tick: Callable[[], None] | None = None,
) -> LiveKeys:
    """The keys a truncate at version ``before`` deletes: live in ``topic`` with no record
    newer than it from another transaction (see the module docstring); close it after."""
    store = LiveKeys()
    try:
        store.load_versioned(versioned_records(kafka, topic, tick), before=before)
    except BaseException:
        store.close()
        raise
    return store


def topic_records(
    kafka: KafkaSettings, topic: str, tick: Callable[[], None] | None = None
) -> Iterator[KeyRecord]:
    """(key, value is not null) of every record of ``topic`` up to its current end;
    ``tick`` is called every few thousand records (a long scan keeps other sessions alive)."""
    for msg in _messages(kafka, topic, tick):
        yield msg.key(), msg.value() is not None


def scan_live_keys(
    kafka: KafkaSettings,
    topic: str,
    identity: Identity | None = None,
    tick: Callable[[], None] | None = None,
) -> LiveKeys:
    """The live keys of ``topic`` (read from its start to its current end); close it after."""
    store = LiveKeys()
    try:
        store.load(topic_records(kafka, topic, tick), identity)
    except BaseException:
        store.close()
        raise
    return store


def scan_many(
    kafka: KafkaSettings,
    scans: Sequence[tuple[str, Identity] | None],
    tick: Callable[[], None] | None = None,
) -> list[LiveKeys | None]:
    """:func:`scan_live_keys` of each (topic, identity), None where a scan is None; all
    closed again if one fails."""
    stores: list[LiveKeys | None] = []
    try:
        for scan in scans:
            stores.append(None if scan is None else scan_live_keys(kafka, *scan, tick))
    except BaseException:
        for store in stores:
            if store is not None:
                store.close()
        raise
    return stores
