"""Error hierarchy. Whether an error is worth retrying is part of its type."""

from __future__ import annotations


class CdcError(Exception):
    """Root of every error this project raises on purpose."""

    retryable: bool = False


class ConfigError(CdcError):
    """Settings are missing, malformed or inconsistent. Never retried."""


class ConnectionFailed(CdcError):
    """A server could not be reached. Worth retrying."""

    retryable = True


class DecodeError(CdcError):
    """A pgoutput message could not be decoded."""


class SnapshotError(CdcError):
    """The initial snapshot failed."""


class SlotError(CdcError):
    """The replication slot or publication is missing or unusable."""


class PublishError(CdcError):
    """Kafka refused or lost a record."""


class SchemaError(CdcError):
    """An event could not be built or encoded."""


class SinkError(CdcError):
    """A follower could not apply a change."""


class RetryableSinkError(SinkError):
    retryable = True
