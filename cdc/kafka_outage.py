"""Kafka outages, told: once when Kafka stops acknowledging, every so often while it lasts,
once when it answers again.

The reader cannot tell a broker that is down from one that cannot be reached; what matters
to it is that records wait and none is acknowledged. So an outage starts when records are
queued in the producer and no delivery has succeeded for :data:`GRACE_S`, and ends at the
next successful delivery (or the next run's metadata answer, see below). While it lasts the
reader reads nothing more from the replication stream once the producer queue is full (the
publisher waits for room), so memory stays bounded by the producer's queue limits, and
nothing past the last acknowledged transaction is confirmed to PostgreSQL.

An outage can outlive a run: a record not acknowledged within ``message.timeout.ms`` ends
the run (:class:`pgcdc.core.errors.KafkaUnavailable`) and :mod:`cdc.supervise` starts the
next from the slot. So the watch of a broker list lives as long as the process
(:func:`watch_for`), and the next run's first answer from Kafka ends it.

No Kafka here: the publisher ticks the watch from every place it waits on Kafka (its
produce loop while the queue is full, ``poll``, ``flush``) with what it counts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

GRACE_S = 10.0  # no acknowledgment this long, with records waiting: Kafka is out
REPORT_EVERY_S = 30.0  # how often a lasting outage is told again
TICK_EVERY_S = 1.0  # how often at most a tick looks at the counts


class OutageWatch:
    """Notices that Kafka at ``servers`` stopped acknowledging, and says so."""

    def __init__(
        self,
        servers: str,
        *,
        grace_s: float = GRACE_S,
        report_every_s: float = REPORT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.servers = servers
        self.grace_s = grace_s
        self.report_every_s = report_every_s
        self._clock = clock
        self._next_tick = 0.0
        self._delivered = -1
        self._quiet_since = clock()  # since when nothing was delivered while records waited
        self.since: float | None = None  # when the outage began (None: Kafka answers)
        self._next_report = 0.0
        self.peak_queued = 0  # the most records queued during the current/last outage

    @property
    def out(self) -> bool:
        return self.since is not None

    def tick(
        self,
        queued: int,
        delivered: int,
        reason: Callable[[], str | None],
        where: Callable[[], str],
    ) -> None:
        """Look at the producer: ``queued`` records waiting, ``delivered`` acknowledged so
        far (a counter of this run). ``reason`` is librdkafka's last word on the brokers,
        ``where`` the reader's position; both are asked only when a line is written."""
        now = self._clock()
        if now < self._next_tick:
            return
        self._next_tick = now + TICK_EVERY_S
        if delivered != self._delivered:
            self._delivered = delivered
            self._quiet_since = now
            self.answered(queued)
            return
        if queued == 0:
            if self.since is None:
                self._quiet_since = now  # nothing waits: nothing to be late
            return
        if self.since is None:
            if now - self._quiet_since >= self.grace_s:
                self.since = self._quiet_since
                self._next_report = now + self.report_every_s
                self.peak_queued = queued
                log.warning(
                    "Kafka at %s unreachable: nothing acknowledged for %.0fs (%s); %d records "
                    "queued in the producer; %s. The reader waits for Kafka and reads no more "
                    "from PostgreSQL while the producer queue is full",
                    self.servers,
                    now - self.since,
                    reason() or "librdkafka gave no reason",
                    queued,
                    where(),
                )
            return
        self.peak_queued = max(self.peak_queued, queued)
        if now >= self._next_report:
            self._next_report = now + self.report_every_s
            log.warning(
                "Kafka at %s still unreachable after %.0fs (%s); %d records queued in the "
                "producer; %s",
                self.servers,
                now - self.since,
                reason() or "librdkafka gave no reason",
                queued,
                where(),
            )

    def lasting(self, reason: str) -> None:
        """Between runs (a new run's metadata request failed): the periodic line, if due."""
        now = self._clock()
        if self.since is not None and now >= self._next_report:
            self._next_report = now + self.report_every_s
            log.warning(
                "Kafka at %s still unreachable after %.0fs (%s); no stream runs: the next "
                "run resumes from the slot once Kafka answers",
                self.servers,
                now - self.since,
                reason,
            )

    def answered(self, queued: int = 0) -> None:
        """Kafka answered (a delivery succeeded, or a new run's metadata request): an
        outage, if one was told, ends here."""
        if self.since is None:
            return
        now = self._clock()
        log.info(
            "Kafka at %s answers again after an outage of %.0fs; %d records queued in the "
            "producer (at most %d during the outage)",
            self.servers,
            now - self.since,
            queued,
            self.peak_queued,
        )
        self.since = None
        self._quiet_since = now


_watches: dict[str, OutageWatch] = {}


def watch_for(servers: str) -> OutageWatch:
    """The process's watch of the brokers ``servers`` (it outlives a run, see above)."""
    watch = _watches.get(servers)
    if watch is None:
        watch = _watches[servers] = OutageWatch(servers)
    return watch
