"""librdkafka's reason for not reaching a broker, as the unreachable line quotes it: without
the broker's name in front and the state (and count of repeats) after it."""

from __future__ import annotations

import pytest

from cdc.kafka_clients import transport_reason

REFUSED = "Connect to ipv4#127.0.0.1:9092 failed: Connection refused"


@pytest.mark.parametrize(
    "said",
    [
        # the first error of a broker (seen from our error callback, librdkafka 2.x)
        f"127.0.0.1:9092/bootstrap: {REFUSED} (after 0ms in state CONNECT)",
        # a later one, 30 s on, counts those it held back in between (librdkafka's
        # rd_kafka_broker_set_error)
        f"127.0.0.1:9092/bootstrap: {REFUSED} (after 0ms in state CONNECT, 558 identical "
        "error(s) suppressed)",
        # a known broker's id in place of "bootstrap"
        f"localhost:9092/1: {REFUSED} (after 12ms in state CONNECT)",
    ],
)
def test_the_reason_without_the_brokers_name_and_state(said: str) -> None:
    assert transport_reason(said) == REFUSED


def test_a_reason_in_another_form_is_kept_whole() -> None:
    said = "Failed to resolve 'kafka:9092': Name or service not known"
    assert transport_reason(said) == said
