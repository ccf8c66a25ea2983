"""Where a snapshot's reading stands in this run (its cursor), the chunk asked for, and the
ports the engine reads chunks and publishes them through."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from cdc.incremental.merge import Window
from cdc.incremental.queue import KeyText, TableSnapshot
from cdc.incremental.worker import ChunkRead, ChunkRequest
from pgcdc.core.lsn import Lsn


class ChunkSource(Protocol):
    def submit(self, request: ChunkRequest) -> Future[ChunkRead]: ...
    def close(self) -> None: ...


class Txn(Protocol):
    closed: bool
    pending: int


class ChunkPublisher(Protocol):
    def begin(self, commit_lsn: Lsn) -> Any: ...
    def send_many(self, txn: Any, topic: str, records: Sequence[Any]) -> None: ...
    def close_txn(self, txn: Any, end_lsn: Lsn) -> None: ...
    def poll(self, timeout_s: float = 0.0) -> None: ...
    def holds(self, txn: Any) -> bool: ...


@dataclass
class Cursor:
    """Where this run's reading of one snapshot stands (ahead of its saved progress)."""

    snap: TableSnapshot
    topic: str
    next_key: KeyText | None
    range_index: int
    chunks: int  # chunks published (acknowledged or not)
    count: bool  # the next chunk also estimates the table's rows
    rows: int  # rows per chunk now (halved by a statement timeout)
    exhausted: bool = False
    attempts: int = 0  # failures in a row
    retry_at: float = 0.0
    fits: int = 0  # chunks in a row that fitted since the last halving


@dataclass
class Chunk:
    """A chunk asked for: the worker reads it while the stream notes its table's keys."""

    snap: TableSnapshot
    cursor: Cursor
    number: int
    low: bytes
    high: bytes
    window: Window
    future: Future[ChunkRead] | None = None
    # Set at the high watermark:
    read: ChunkRead | None = None
    next_key: KeyText | None = None
    range_index: int = 0
    complete: bool = False
    emitted: int = 0
    dropped: int = 0
