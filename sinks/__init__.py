"""Writers that keep the followers (OpenSearch, Redis) in step with the change stream."""

from sinks.base import ApplyResult, Change, Outcome, Sink, key_id

__all__ = ["ApplyResult", "Change", "Outcome", "Sink", "key_id"]
