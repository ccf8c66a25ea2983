"""A transactional reader whose Kafka commit timed out, ending its run: fenced or not, the end
is told right.

librdkafka takes no abort while a commit that timed out is still in progress (``_CONFLICT``,
or ``_STATE`` once the commit began). A reader stopped (``SIGSTOP``, a long pause) inside a
commit, and fenced meanwhile by a second reader of its slot, met that: it took the refused abort for an aborted transaction, a
retryable end, and its next run took the transactional id back from the second reader (the
exactly-once kill test's fencing step then waited for it in vain). The commit is resumed
instead, and its end says which it was.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from cdc.publisher import Publisher
from pgcdc.core.errors import Fenced, TransactionAborted
from pgcdc.core.settings import KafkaSettings
from tests.conftest import Endpoints

pytestmark = pytest.mark.integration

RECORDS = 1_000
ATTEMPTS = 5


@contextmanager
def _stalled_commit(
    endpoints: Endpoints, topic_prefix: str
) -> Iterator[tuple[Publisher, Publisher]]:
    """A transactional publisher with records in its open transaction and a commit left in
    progress: the call timed out before the records were even flushed. With it, a second
    publisher of its transactional id, created (connected) but not yet initialised."""
    settings = KafkaSettings(bootstrap_servers=endpoints.kafka_bootstrap, topic_prefix=topic_prefix)
    tid = f"{topic_prefix}-{uuid.uuid4().hex[:8]}"
    first = Publisher(settings, transactional_id=tid)
    second = Publisher(settings, transactional_id=tid)
    topic = f"{topic_prefix}.public.t"
    first.ensure_topics([topic], partitions=1)
    first.start_transactions("db", "slot")
    for i in range(RECORDS):
        first.produce_plain(topic, b"%d" % i, b"x" * 100)
    with pytest.raises(KafkaException) as timed_out:
        first._producer.commit_transaction(0.0001)
    assert timed_out.value.args[0].code() == KafkaError._TIMED_OUT
    # The path under test: librdkafka refuses an abort until that commit ends (a conflicting
    # call while the commit call is under way, or the wrong state once the commit began).
    with pytest.raises(KafkaException) as refused:
        first._producer.abort_transaction(1)
    assert refused.value.args[0].code() in (KafkaError._CONFLICT, KafkaError._STATE)
    first._failure = first._aborted("the run ended", timed_out.value.args[0])
    yield first, second


def _committed_records(bootstrap: str, topic: str) -> int:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "fence-tests",
            "isolation.level": "read_committed",
        }
    )
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        seen = 0
        while True:
            msgs = c.consume(500, timeout=2)
            if not msgs:
                return seen
            seen += sum(1 for m in msgs if m.error() is None)
    finally:
        c.close()


def test_a_reader_fenced_while_its_commit_is_stalled_ends_fenced(
    endpoints: Endpoints, topic_prefix: str
) -> None:
    """The second publisher's init fences the first only if it reaches the coordinator
    before the first's commit does (a commit under way is let finish): on a busy machine the
    commit may win, and the first ends retryable, unfenced. That race is run again, a few
    times, until the path under test is hit."""
    commits_won = 0
    for _ in range(ATTEMPTS):
        with _stalled_commit(endpoints, topic_prefix) as (first, second):
            second.start_transactions("db", "slot")
            try:
                first.raise_if_failed()
            except Fenced as fenced:
                assert "this reader is fenced" in str(fenced)
                return
            except TransactionAborted as ended:
                assert ended.retryable
                commits_won += 1
    pytest.fail(f"the stalled commit completed before the fence in all {commits_won} attempts")


def test_a_stalled_commit_that_completes_ends_the_run_retryable(
    endpoints: Endpoints, topic_prefix: str
) -> None:
    with _stalled_commit(endpoints, topic_prefix) as (first, _second):
        with pytest.raises(TransactionAborted) as ended:
            first.raise_if_failed()
        assert ended.value.retryable
        # The resumed commit landed: its records are read_committed's, whole.
        topic = f"{topic_prefix}.public.t"
        assert _committed_records(endpoints.kafka_bootstrap, topic) == RECORDS
