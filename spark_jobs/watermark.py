"""The follower's watermark: an LSN below which every committed change is *settled*:
applied to the follower, or dead-lettered (written to ``kafka.dead_letter_topic`` with the
reason, because the follower refused it for good or it could not be read). A dead letter does
not hold the watermark back, or one bad record would stop read-your-writes for every other
key; ``cdc status`` shows each job's dead-letter count beside its watermark, so a reader
waiting for a watermark can tell whether everything before it was applied.

The rule, for any number of partitions:

    A batch is *complete* when it read every partition up to the latest offset Spark saw
    when it planned the batch (no rate limit cut it short). A heartbeat LSN H read in batch
    b is *confirmed* once a complete batch c > b is applied; the watermark is the highest
    confirmed H.

Why it is exact. The reader writes H only after Kafka acknowledged every record of every
transaction committed at or before H, in every partition. Batch c was planned after batch b
was read, so after H was written, so after all those records were acknowledged: they lie
below the latest offsets c saw, in whatever partition, and a complete c read up to those
offsets. Spark applies batches one after another, so when c is applied they all are. (Taking
H from the same batch it is read in would rely on Spark listing the latest offsets of all
partitions at one instant; it lists them per broker, so this rule waits one batch instead.)

Without a rate limit every batch is complete, and the watermark trails by one batch. With
``maxOffsetsPerTrigger`` whether batch c was complete is known from its progress report
(``endOffset`` equal to ``latestOffset`` for every partition), read at the next batch: during
a rate-limited catch-up the watermark waits until the job reaches the end of the topics.

Without heartbeats (``--no-heartbeats``) the watermark is the highest commit LSN applied,
which is approximate across partitions (a partition may still hold older changes) and is
documented as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def progress_complete(progress: Mapping[str, Any] | None) -> bool:
    """Whether the batch of this progress report read every partition of every source up
    to the latest offset it saw (Spark's ``StreamingQueryProgress`` as a dict)."""
    if not progress:
        return False
    sources = progress.get("sources") or []
    if not sources:
        return False
    for source in sources:
        end, latest = source.get("endOffset"), source.get("latestOffset")
        if end is None or latest is None or _offsets(end) != _offsets(latest):
            return False
    return True


def _offsets(value: Any) -> Any:
    # Spark reports offsets as JSON text or as parsed dicts, depending on the API used.
    if isinstance(value, str):
        import json

        return json.loads(value)
    return value


class Watermark:
    """Heartbeats per batch, and the highest one a later complete batch confirmed."""

    def __init__(self) -> None:
        self._beats: dict[int, int] = {}  # batch id -> highest heartbeat LSN read in it
        self.confirmed = 0

    def seen(self, batch_id: int, heartbeat_lsn: int) -> None:
        """Batch ``batch_id`` read heartbeats up to ``heartbeat_lsn`` (0: none)."""
        if heartbeat_lsn:
            self._beats[batch_id] = max(self._beats.get(batch_id, 0), heartbeat_lsn)

    def complete(self, batch_id: int) -> int:
        """Batch ``batch_id`` was complete and is applied: the heartbeats of earlier
        batches are confirmed. Returns the watermark (0 if none confirmed yet)."""
        for b in [b for b in self._beats if b < batch_id]:
            self.confirmed = max(self.confirmed, self._beats.pop(b))
        return self.confirmed
