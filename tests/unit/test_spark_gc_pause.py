"""The garbage collector paused for a task (spark_jobs/gc_pause.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from spark_jobs.gc_pause import gc_paused, thaw

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    """Each test leaves nothing of the test process frozen."""
    yield
    gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_the_collector_is_off_in_the_block_and_its_cycles_are_collected_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        node = _Node()
        gone = weakref.ref(node)
        del node
        assert gone() is not None  # nothing collects it in the block
    assert gc.isenabled()
    assert gone() is None


def test_the_collector_comes_back_after_an_error() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("task failed")
    assert gc.isenabled()


def test_a_collector_already_off_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_what_outlives_the_block_is_left_out_of_full_collections() -> None:
    with gc_paused():
        kept = _Node()
    # PySpark's daemon runs a full collection after every task: it must not walk this again.
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())
    gc.collect()
    assert kept.me is kept  # frozen, not freed


def test_a_thaw_lets_a_full_collection_free_a_frozen_cycle() -> None:
    with gc_paused():
        node = _Node()  # a long-lived object (a cached sink), frozen after the task
    gone = weakref.ref(node)
    del node  # then let go (a sink dropped after a failure)
    gc.collect()
    assert gone() is not None  # frozen: the full collection does not see the cycle
    thaw()
    gc.collect()
    assert gone() is None


class _Held:
    """What a worker caches between tasks, as a sink is (no server: only its lifetime)."""

    def __init__(self, _settings: object) -> None:
        self.me = self
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_dropping_a_cached_sink_thaws_what_was_frozen() -> None:
    from pgcdc.core.settings import Settings
    from spark_jobs.apply_loop import cached_sink, drop_sink

    settings = Settings()
    with gc_paused():
        sink = cached_sink(settings, "gc_pause_test", _Held)  # type: ignore[arg-type]
    gone = weakref.ref(sink)
    assert gc.get_freeze_count() > 0
    del sink
    drop_sink(settings, "gc_pause_test")
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None
