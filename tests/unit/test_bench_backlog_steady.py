"""benchmarks.followers_backlog.steady: the figures after a job's first batch, and when
there are too few of them to say anything."""

from benchmarks.followers_backlog import steady
from benchmarks.proc import ProcStats


def _stats(samples: list[tuple[float, float]]) -> ProcStats:
    return ProcStats(0, 20.0, 10.0, 0.0, 0.0, 0.0, samples)


def test_a_trailing_batch_of_a_few_changes_says_nothing() -> None:
    # The first batch holds nearly everything; a worker's exit took CPU out of the tree.
    st = _stats([(0.0, 0.0), (10.0, 9.0), (10.5, 8.5)])
    spans = [(0, 1.0, 10.2, 199_997), (1, 10.3, 10.5, 3)]
    assert steady(st, 0.0, spans) is None


def test_later_batches_give_cpu_per_change_and_rate() -> None:
    samples = [(float(t), 0.5 * t) for t in range(0, 21)]
    spans = [(0, 0.0, 5.0, 50_000), (1, 5.0, 10.0, 25_000), (2, 10.0, 15.0, 25_000)]
    got = steady(_stats(samples), 0.0, spans)
    assert got is not None
    cpu_us, rate = got
    assert cpu_us == 5.0 / 50_000 * 1e6  # 0.5 CPU s a second over 10 s
    assert rate == 5_000.0


def test_cpu_between_samples_is_taken_in_proportion() -> None:
    from benchmarks.followers_backlog import cpu_at

    st = _stats([(0.0, 0.0), (1.0, 0.2), (2.0, 1.2)])
    assert cpu_at(st, 100.0, 99.0) == 0.0  # before the first sample
    assert cpu_at(st, 100.0, 101.5) == 0.7  # half way through a busy second
    assert cpu_at(st, 100.0, 105.0) == 1.2  # after the last


def test_a_tree_keeps_the_cpu_of_a_child_that_ended() -> None:
    """A Python worker exits before its job does: the tree's CPU must not fall with it."""
    import sys

    from benchmarks.proc import Measured

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    parent = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {burn!r}])\n"
        "time.sleep(0.6)"
    )
    st = Measured([sys.executable, "-c", parent], sample_s=0.05).wait(60)
    assert st.returncode == 0
    cpus = [cpu for _, cpu in st.samples]
    assert cpus == sorted(cpus), "the tree's CPU fell when the child ended"
    assert cpus[-1] >= 0.5, cpus[-1]  # the child's burn, seen after it ended
