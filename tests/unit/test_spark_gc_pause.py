"""The garbage collector paused for a task (spark_jobs/gc_pause.py)."""

from __future__ import annotations

import gc
import weakref

import pytest

from spark_jobs.gc_pause import gc_paused

pytestmark = pytest.mark.unit


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
