"""The three ways a signal reaches the reader, and what each must prove before it counts.

- **WAL** (``cdc snapshot``): a logical message with prefix ``pgcdc-signal``, signed
  (:mod:`cdc.incremental.auth`): anyone who can connect may write one, so the signature is
  the proof.
- **Kafka** (``kafka.signal_topic``): a record keyed by the topic prefix whose value is
  signed the same way (a Kafka without an authorizer lets anyone produce).
- **Signal table** (``postgres.signal_data_collection``): Debezium's rows, unsigned; the
  table's grants are the proof (:mod:`cdc.incremental.signal_table`).

Whatever fails its proof is logged once, with its source, and ignored. A signal that passed
is carried out once: its id (a table row: its position in the WAL) is remembered in the
durable state, so a replay of the WAL or of the topic does not run it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cdc.incremental.auth import SIGNAL_MAX_AGE_S, Verifier
from cdc.incremental.queue import SEEN_SIGNALS_MAX, SnapshotsState
from cdc.incremental.signals import Signal, parse_document, parse_signal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Accepted:
    """A signal that passed its channel's proof and was not carried out before."""

    signal: Signal
    via: str  # wal | kafka | table
    source: str  # where it came from, for the log
    key: str  # what replay protection remembers
    ts: float  # when it was signed (or received)


class TopicLike(Protocol):
    def poll(self) -> list[tuple[str, bytes]]: ...
    def commit(self) -> None: ...
    def close(self) -> None: ...


class SignalIntake:
    """Turns what each channel delivers into :class:`Accepted` signals (or one log line)."""

    def __init__(
        self,
        verifier: Verifier,
        state: SnapshotsState,
        *,
        topic: TopicLike | None = None,
        table_check: Callable[[], str | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._verifier = verifier
        self.state = state
        self._topic = topic
        self._table_check = table_check
        self._clock = clock
        self._table_refusal: str | None = None

    def wal(self, content: bytes, position: str) -> Accepted | None:
        """A ``pgcdc-signal`` logical message at ``position``."""
        return self._signed(content, "wal", f"wal@{position}")

    def table_row(self, values: dict[str, Any], position: str) -> Accepted | None:
        """A row inserted into the signal table, in the transaction ending at ``position``."""
        source = f"signal table row {values.get('id')!r} at {position}"
        if self._table_refusal is not None:
            log.warning("signal from %s ignored: %s", source, self._table_refusal)
            return None
        key = f"table:{position}:{values.get('id')}"
        if key in self.state.seen:
            log.info("signal from %s already carried out; ignored", source)
            return None
        if self._full(source):
            return None
        signal = parse_signal(values.get("id"), values.get("type"), values.get("data"))
        return None if signal is None else Accepted(signal, "table", source, key, self._clock())

    def poll_topic(self) -> list[Accepted]:
        """Signals that arrived on the signal topic since the last call."""
        if self._topic is None:
            return []
        out = []
        for source, value in self._topic.poll():
            accepted = self._signed(value, "kafka", source)
            if accepted is not None:
                out.append(accepted)
        return out

    def commit_topic(self) -> None:
        if self._topic is not None:
            self._topic.commit()

    def recheck_table(self) -> None:
        """Look at the signal table's grants again (see :mod:`cdc.incremental.signal_table`)."""
        if self._table_check is None:
            return
        reason = self._table_check()
        if reason != self._table_refusal:
            if reason is not None:
                log.error("signal table rows are ignored from now on: %s", reason)
            else:
                log.warning("signal table rows are accepted again: only trusted roles may insert")
        self._table_refusal = reason

    def remember(self, accepted: Accepted) -> None:
        """``accepted`` was carried out (the caller saves the state)."""
        self.state.remember(accepted.key, accepted.ts, self._clock() - SIGNAL_MAX_AGE_S)

    def _full(self, source: str) -> bool:
        """Refuse a new signal while as many as can be remembered were signed in the last
        SIGNAL_MAX_AGE_S: forgetting one sooner would let a copy of it run again."""
        if not self.state.remembers_enough():
            return False
        log.warning(
            "signal from %s ignored: the reader remembers %d signals carried out in the last "
            "%d days (so that none runs twice) and takes no more until the oldest expire",
            source,
            SEEN_SIGNALS_MAX,
            SIGNAL_MAX_AGE_S // 86_400,
        )
        return True

    def close(self) -> None:
        if self._topic is not None:
            self._topic.close()

    def _signed(self, content: bytes, via: str, source: str) -> Accepted | None:
        verified = self._verifier.verify(content, source)
        if verified is None:
            return None
        if verified.id in self.state.seen:
            log.info("signal %s from %s already carried out; ignored", verified.id, source)
            return None
        if self._full(source):
            return None
        signal = parse_document(verified.id, verified.document)
        if signal is None:
            return None
        return Accepted(signal, via, source, verified.id, verified.ts)
