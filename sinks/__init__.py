"""Writers that keep the followers (OpenSearch, Redis) in step with the change stream."""

from sinks.base import ApplyResult, Change, Sink, key_id

__all__ = ["ApplyResult", "Change", "Sink", "key_id"]
