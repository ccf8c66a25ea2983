"""Which table topics lost what they held (cdc.topic_ids), and the state that records them."""

from __future__ import annotations

import pytest

from cdc.incremental.queue import SnapshotsState
from cdc.topic_ids import describe_loss, lost_topics

pytestmark = pytest.mark.unit


def test_a_topic_gone_or_created_again_is_lost_and_others_are_not() -> None:
    recorded = {"p.public.a": "id-a", "p.public.b": "id-b", "p.public.c": "id-c"}
    now = {"p.public.a": "id-a", "p.public.b": None, "p.public.c": "id-new", "p.public.d": "x"}
    assert lost_topics(recorded, now) == ["p.public.b", "p.public.c"]
    # A topic no longer captured (not asked about) is not lost; one never recorded neither.
    assert lost_topics(recorded, {"p.public.d": None}) == []
    assert "was deleted (it held" in describe_loss("t", "id-b", None)
    assert "topic id id-c, now id-new" in describe_loss("t", "id-c", "id-new")


def test_the_recorded_topics_round_trip() -> None:
    state = SnapshotsState(captured=[("public", "a")], topics={"p.public.a": "id-a"})
    assert SnapshotsState.from_json(state.to_json()).topics == {"p.public.a": "id-a"}
    # Written by a reader from before: none recorded.
    assert SnapshotsState.from_json(b'{"captured": null, "queue": [], "seen": {}}').topics == {}
