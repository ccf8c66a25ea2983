"""What a task (or, summed, a micro-batch) did: the counts the driver logs and exports."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BatchStats:
    """What a partition (or, summed, a batch) did."""

    applied: int = 0
    skipped: int = 0
    failed: int = 0
    dead_lettered: int = 0
    keyless: int = 0  # records of keyless tables, skipped
    truncates: int = 0  # Debezium t events, skipped
    max_commit_lsn: int = 0
    heartbeat_lsn: int = 0
    newest_commit_ms: int = 0  # commit time (source.ts_ms) of the newest change seen
    keyless_tables: set[str] = field(default_factory=set)
    # Changes of the direct read's native path (spark.apply = native: spark_jobs.fast_changes).
    native: int = 0
    job: str = ""  # the follower these counts are of
    # Set when the follower was unreachable (the sink's retries exhausted): the reason; the
    # counts are then void and the batch runs again for that follower.
    unreachable: str | None = None

    def add(self, other: BatchStats) -> None:
        self.applied += other.applied
        self.skipped += other.skipped
        self.failed += other.failed
        self.dead_lettered += other.dead_lettered
        self.keyless += other.keyless
        self.truncates += other.truncates
        self.max_commit_lsn = max(self.max_commit_lsn, other.max_commit_lsn)
        self.heartbeat_lsn = max(self.heartbeat_lsn, other.heartbeat_lsn)
        self.newest_commit_ms = max(self.newest_commit_ms, other.newest_commit_ms)
        self.keyless_tables |= other.keyless_tables
        self.native += other.native

    @property
    def busy(self) -> bool:
        """Whether anything was applied, skipped, refused or dead-lettered."""
        return bool(
            self.applied
            or self.skipped
            or self.failed
            or self.dead_lettered
            or self.keyless
            or self.truncates
        )
