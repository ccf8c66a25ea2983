"""Error hierarchy. Whether an error is worth retrying is part of its type."""

from __future__ import annotations


class CdcError(Exception):
    """Root of every error this project raises on purpose."""

    retryable: bool = False


class ConfigError(CdcError):
    """Settings are missing, malformed or inconsistent. Never retried."""


class AuthenticationFailed(ConfigError):
    """A server refused the login (user, password, or not admitted). Never retried: the
    settings (or the server's access rules) must change."""


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


class TopicGone(PublishError):
    """A table topic was deleted under the running reader. Worth a new run: it starts
    from the slot, finds the topic lost (cdc.topic_ids) and snapshots its table again."""

    retryable = True


class TransactionAborted(PublishError):
    """A Kafka transaction of a transactional reader (``kafka.exactly_once``) was aborted:
    none of its records is visible to ``read_committed`` consumers and nothing in it was
    confirmed to PostgreSQL. Worth a new run: it resumes from the committed position."""

    retryable = True


class Fenced(PublishError):
    """Another reader took this reader's ``transactional.id`` (the same slot) over: this
    one stops, confirming nothing more. ``kafka`` is Kafka's own words for it."""

    def __init__(self, message: str, kafka: str = "") -> None:
        super().__init__(message)
        self.kafka = kafka


class KafkaUnavailable(ConnectionFailed, PublishError):
    """Kafka did not answer: no broker reachable, or a record not acknowledged within the
    producer's ``message.timeout.ms`` (an outage longer than that). Worth a new run:
    nothing after the last acknowledged transaction was confirmed to PostgreSQL, so the
    run resumes from the slot and produces it again (cdc.supervise)."""

    retryable = True


class SchemaError(CdcError):
    """An event could not be built or encoded."""


class SinkError(CdcError):
    """A follower could not apply a change."""


class RetryableSinkError(SinkError):
    retryable = True


def root_reason(e: BaseException) -> str:
    """The innermost operating-system reason behind an error, as the system words it
    ("Connection refused", "timed out", "Name or service not known"), else the error's
    first line. HTTP and Redis clients wrap these several layers deep."""
    seen: set[int] = set()
    todo: list[BaseException] = [e]
    while todo:
        err = todo.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, TimeoutError) or type(err).__name__ == "timeout":
            return "timed out"
        if isinstance(err, OSError) and err.strerror:
            return err.strerror
        todo += [x for x in (err.__cause__, err.__context__) if x is not None]
        todo += [a for a in err.args if isinstance(a, BaseException)]
        todo += [a for a in vars(err).values() if isinstance(a, BaseException)]
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class VerifyError(CdcError):
    """``cdc verify`` could not reach a verdict (e.g. a follower never caught up with the
    snapshot it is compared with)."""
