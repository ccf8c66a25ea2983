"""The Kafka outage watch: told once when it starts, every so often while it lasts, once when
it ends; never for a quiet reader or a slow but answering Kafka."""

from __future__ import annotations

import logging

import pytest

from cdc.kafka_outage import OutageWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cdc.kafka_outage"]


def test_outage_told_at_start_periodically_and_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "cdc.kafka_outage")
    clock = Clock()
    watch = OutageWatch("k:1", grace_s=10, report_every_s=30, clock=clock)

    def tick(queued: int, delivered: int) -> None:
        watch.tick(queued, delivered, lambda: "Connection refused", lambda: "at LSN 0/1")

    tick(5, 0)
    for _ in range(9):  # within the grace: nothing said
        clock.now += 1
        tick(5, 0)
    assert lines(caplog) == []
    clock.now += 1
    tick(500, 0)
    first = lines(caplog)
    assert len(first) == 1 and "unreachable" in first[0] and "Connection refused" in first[0]
    assert "500 records queued" in first[0] and "at LSN 0/1" in first[0]
    for _ in range(60):  # two reports in the next minute, one per 30 s
        clock.now += 1
        tick(1000, 0)
    assert sum("still unreachable" in line for line in lines(caplog)) == 2
    clock.now += 5
    tick(900, 1)
    end = lines(caplog)[-1]
    assert "answers again after an outage of 75s" in end and "at most 1000" in end
    assert not watch.out


def test_no_outage_while_deliveries_go_on_or_nothing_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "cdc.kafka_outage")
    clock = Clock()
    watch = OutageWatch("k:1", grace_s=10, clock=clock)
    for i in range(100):  # slow but answering: one delivery every 5 s
        clock.now += 1
        watch.tick(10_000, i // 5, lambda: None, lambda: "")
    for _ in range(100):  # idle: nothing queued, nothing delivered
        clock.now += 1
        watch.tick(0, 19, lambda: None, lambda: "")
    assert lines(caplog) == []


def test_outage_ends_with_a_new_runs_answer(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "cdc.kafka_outage")
    clock = Clock()
    watch = OutageWatch("k:1", grace_s=10, clock=clock)
    for _ in range(12):
        clock.now += 1
        watch.tick(3, 7, lambda: None, lambda: "")
    assert watch.out and "librdkafka gave no reason" in lines(caplog)[0]
    clock.now += 100  # the run ended (records timed out); the next one's probe answers
    watch.answered()
    assert not watch.out and "after an outage of 111s" in lines(caplog)[-1]


def test_outage_between_runs_told_every_so_often(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "cdc.kafka_outage")
    clock = Clock()
    watch = OutageWatch("k:1", grace_s=10, report_every_s=30, clock=clock)
    watch.lasting("refused")  # no outage told yet: nothing to add
    assert lines(caplog) == []
    for _ in range(12):
        clock.now += 1
        watch.tick(3, 7, lambda: None, lambda: "")
    for _ in range(8):  # the run ended; new runs' probes fail every 5 s
        clock.now += 5
        watch.lasting("refused")
    told = [line for line in lines(caplog) if "no stream runs" in line]
    assert len(told) == 1 and "after 41s (refused)" in told[0]
