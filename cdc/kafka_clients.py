"""Kafka client plumbing the reader's modules share: clients, topic creation, reading back.

The publisher, the state store and ``cdc status`` all open librdkafka clients, create
compacted topics and read a topic from its start to its current end; they do it here, once.
Every client gets the ``kafka`` settings' connection and security
(:func:`pgcdc.core.kafka_config.client_config`) and stops at the first refused login or
unverifiable broker certificate with one line (retrying cannot fix either).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import ClusterMetadata
from confluent_kafka.cimpl import NewTopic

from pgcdc.core.errors import AuthenticationFailed, ConfigError, KafkaUnavailable, PublishError
from pgcdc.core.kafka_config import client_config
from pgcdc.core.settings import KafkaSettings

log = logging.getLogger(__name__)
# librdkafka's own chatter goes here; the CLI keeps it quiet unless --debug.
rdkafka_log = logging.getLogger("cdc.librdkafka")


class _FenceSaidByTheReader(logging.Filter):
    """librdkafka's fatal lines for a fence say "fenced by a newer instance" whatever fenced
    it; the reader's own line says which it was (another reader, or a transaction the broker
    aborted on its timeout: cdc.pipeline). Shown with --debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        fence = "fenced by a newer instance" in record.getMessage()
        return not fence or rdkafka_log.isEnabledFor(logging.DEBUG)


rdkafka_log.addFilter(_FenceSaidByTheReader())

# Answers a partition gives while its leader is still being elected (a topic created a moment
# ago); they pass, so they are retried.
_TRANSIENT = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
    }
)


# The last reason librdkafka gave for not reaching each bootstrap list ("Connect to
# ipv4#127.0.0.1:9092 failed: Connection refused"), kept for the unreachable error's line.
_last_transport_error: dict[str, str] = {}
_TRANSPORT_ERRORS = frozenset(
    {KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._TIMED_OUT, KafkaError._SSL}
)


def transport_reason(text: str) -> str:
    """librdkafka's reason without the broker's name in front and the state after it:
    ``127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after
    0ms in state CONNECT)`` is ``Connect to ipv4#127.0.0.1:1 failed: Connection refused``.
    A repeat of the same error says how many it stood for inside the brackets (``(after 0ms
    in state CONNECT, 1 identical error(s) suppressed)``); that goes too."""
    text = re.sub(r"^\S+/(bootstrap|\d+): ", "", text.strip())
    return re.sub(
        r" \(after \d+ms in state \w+(, \d+ identical error\(s\) suppressed)?\)$", "", text
    )


def last_transport_error(bootstrap_servers: str) -> str | None:
    """The last reason librdkafka gave for not reaching ``bootstrap_servers``, if any."""
    return _last_transport_error.get(bootstrap_servers)


def _fail_fast(bootstrap_servers: str) -> Callable[[KafkaError], None]:
    """librdkafka's ``error_cb``: a refused login or a broker certificate that does not verify
    raises ConfigError (out of the poll that serves it); other errors, which librdkafka
    retries by itself, are only logged (and a transport error kept for the line that says
    the brokers are unreachable)."""

    def on_error(err: KafkaError) -> None:
        if err.code() == KafkaError._AUTHENTICATION:
            raise AuthenticationFailed(
                f"Kafka at {bootstrap_servers} refused the login ({err.str()}); check "
                "kafka.sasl_username, kafka.sasl_password and kafka.sasl_mechanism"
            )
        if err.code() in _TRANSPORT_ERRORS:
            _last_transport_error[bootstrap_servers] = transport_reason(err.str())
        if err.code() == KafkaError._SSL and "certificate verify failed" in err.str():
            raise ConfigError(
                f"Kafka at {bootstrap_servers}: the broker's certificate does not verify "
                f"({err.str()}); check kafka.ssl_ca_location"
            )
        rdkafka_log.debug("librdkafka error: %s", err.str())

    return on_error


def client_conf(kafka: KafkaSettings, **extra: Any) -> dict[str, Any]:
    """librdkafka properties of one of our clients: the settings' brokers, security and
    pass-through, our logger and error handler, then ``extra``."""
    return {
        **client_config(kafka),
        "logger": rdkafka_log,
        "error_cb": _fail_fast(kafka.bootstrap_servers),
        **extra,
    }


def as_settings(kafka: KafkaSettings | str) -> KafkaSettings:
    """The settings themselves, or for a bare ``host:port`` list plaintext brokers there
    (a convenience of the helpers that tests call directly)."""
    return kafka if isinstance(kafka, KafkaSettings) else KafkaSettings(bootstrap_servers=kafka)


def admin_client(kafka: KafkaSettings) -> AdminClient:
    """An admin client for the configured brokers (see :func:`client_conf`)."""
    return AdminClient(client_conf(kafka))


def consumer(kafka: KafkaSettings, group_id: str, **conf: Any) -> Consumer:
    """A consumer for the configured brokers; ``conf`` adds librdkafka settings."""
    return Consumer(client_conf(kafka, **{"group.id": group_id}) | conf)


WAIT_SLICE_S = 0.5  # a wait on librdkafka (which Python's signals cannot cut) at a time
SAY_WAITING_AFTER_S = 2.0


def cluster_metadata(
    client: AdminClient | Consumer | Producer, bootstrap_servers: str, timeout_s: float
) -> ClusterMetadata:
    """The cluster's topics; no broker answering is one clear KafkaUnavailable, a refused
    login or certificate one clear ConfigError.

    The wait is cut into slices of :data:`WAIT_SLICE_S` (so Ctrl-C acts between them), and
    one that lasts over :data:`SAY_WAITING_AFTER_S` says what it waits for.
    """
    started = time.monotonic()
    said = False
    while True:
        left = timeout_s - (time.monotonic() - started)
        try:
            return client.list_topics(timeout=max(0.01, min(WAIT_SLICE_S, left)))
        except KafkaException as e:
            if time.monotonic() - started < timeout_s:
                client.poll(0)  # serve the error callback: a refused login stops here
                if not said and time.monotonic() - started >= SAY_WAITING_AFTER_S:
                    said = True
                    why = _last_transport_error.get(bootstrap_servers, e.args[0].str())
                    log.info(
                        "waiting for Kafka at %s to answer (%s); up to %.0fs more",
                        bootstrap_servers,
                        why,
                        timeout_s - (time.monotonic() - started),
                    )
                continue
            # The reason a broker did not answer waits in the client's queue: serving it
            # lets :func:`_fail_fast` name a refused login instead of a "transport failure".
            client.poll(0)
            why = _last_transport_error.get(bootstrap_servers, e.args[0].str())
            raise KafkaUnavailable(
                f"Kafka at {bootstrap_servers} is unreachable: {why}; check "
                "kafka.bootstrap_servers (CDC_KAFKA__BOOTSTRAP_SERVERS), that the brokers "
                "run, and kafka.security_protocol"
            ) from e


def create_topics(admin: AdminClient, topics: Sequence[NewTopic]) -> None:
    """Create ``topics``; one that already exists (another client was quicker) is fine."""
    for topic, fut in admin.create_topics(list(topics), operation_timeout=30).items():
        try:
            fut.result()
            log.info("created topic", extra={"topic": topic})
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise PublishError(f"cannot create topic {topic}: {e.args[0].str()}") from e


def offset_bounds(reader: Consumer, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
    """(low, high) offsets of a partition, retrying while its leader is not yet known."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = reader.get_watermark_offsets(tp, timeout=5)
            return int(low), int(high)
        except KafkaException as e:
            err = e.args[0]
            if err.code() not in _TRANSIENT or time.monotonic() >= deadline:
                raise PublishError(
                    f"cannot read the offsets of {tp.topic} [{tp.partition}]: {err.str()}"
                ) from e
            time.sleep(0.1)


def read_to_end(reader: Consumer, topic: str, timeout_s: float) -> Iterator[Message]:
    """Every record of ``topic``, from each partition's start to its end as of this call.

    ``reader`` must be created with ``enable.partition.eof``. A missing or empty topic yields
    nothing; records of one partition come in offset order.
    """
    md = reader.list_topics(topic, timeout=10).topics.get(topic)
    if md is None or md.error is not None:
        return
    ends: dict[int, int] = {}
    for p in sorted(md.partitions):
        low, high = offset_bounds(reader, TopicPartition(topic, p), timeout_s=30.0)
        if high > low:
            ends[p] = high
    if not ends:
        return
    reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    yield from read_assigned(reader, topic, ends, timeout_s)


def read_assigned(
    reader: Consumer, topic: str, ends: dict[int, int], timeout_s: float
) -> Iterator[Message]:
    """The records of the partitions ``reader`` is assigned, each up to its offset in
    ``ends`` (not included), in offset order per partition. ``reader`` must be created with
    ``enable.partition.eof``."""
    done: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(done) < len(ends):
        if time.monotonic() > deadline:
            raise PublishError(f"timed out reading {topic}")
        for msg in reader.consume(10_000, 0.5):
            part, offset, err = msg.partition(), msg.offset(), msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF and part is not None:
                    done.add(part)
                    continue
                raise PublishError(f"cannot read {topic}: {err.str()}")
            yield msg
            if part is not None and offset is not None and offset + 1 >= ends[part]:
                done.add(part)


def read_topic(
    kafka: KafkaSettings | str, topic: str, group_id: str, timeout_s: float, **conf: Any
) -> Iterator[Message]:
    """:func:`read_to_end` with a consumer of its own, closed when the reading ends."""
    reading = {"enable.auto.commit": False, "enable.partition.eof": True}
    reader = consumer(as_settings(kafka), group_id, **(reading | conf))
    try:
        yield from read_to_end(reader, topic, timeout_s)
    finally:
        reader.close()
