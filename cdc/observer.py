"""What the streaming loop reports as it goes: an observer, so metrics stay a decoration.

The loop (:mod:`cdc.streamer`) calls a :class:`StreamObserver`; :class:`NullObserver` ignores
every call, and :class:`cdc.metrics.ReaderMetrics` turns them into Prometheus series.
"""

from __future__ import annotations

from typing import Protocol

from pgcdc.core.lsn import Lsn


class StreamObserver(Protocol):
    """Receives the streaming loop's events, counts and positions."""

    @property
    def measures_lag(self) -> bool:
        """Whether the loop should ask the server for its WAL position to report lag."""
        ...

    def on_event(self, op: str) -> None:
        """One change event (``op`` is Debezium's ``c u d t``) was handed to Kafka."""

    def on_acknowledged(self, lsn: Lsn) -> None:
        """The slot's flush position moved to ``lsn``."""

    def on_lag(self, lag_bytes: int) -> None:
        """The server's WAL is ``lag_bytes`` ahead of the last acknowledged position."""


class NullObserver:
    """The default observer: reports go nowhere, and lag is never measured."""

    measures_lag = False

    def on_event(self, op: str) -> None:
        pass

    def on_acknowledged(self, lsn: Lsn) -> None:
        pass

    def on_lag(self, lag_bytes: int) -> None:
        pass
