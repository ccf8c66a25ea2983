"""A follower behind the shared job (spark_jobs.behind): its state file, the offsets a batch
starts at (Spark's own offsets log) and the range it catches up on."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from pgcdc.core.errors import ConfigError, RetryableSinkError
from pgcdc.core.settings import load_settings
from spark_jobs import behind
from spark_jobs.apply_loop import ApplyBatch, Follower
from spark_jobs.behind import EARLIEST, Behind
from spark_jobs.options import JobOptions

pytestmark = pytest.mark.unit

# As Spark 4 writes them (offsets/<n>: version, metadata, the source's offsets; the initial
# offsets sources/0/0 begin with a NUL).
OFFSETS_1 = (
    'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795883853156,"conf":{"a":"b"}}\n'
    '{"hb":{"0":28},"t":{"0":467,"1":531}}'
)
INITIAL = '\x00v1\n{"hb":{"0":0},"t":{"0":0,"1":0}}'


def test_the_state_round_trips_and_is_replaced_whole(tmp_path: Path) -> None:
    assert behind.load(tmp_path) == {}
    state = {"search_sync": Behind(7, {"t": {"0": 5, "1": 9}})}
    behind.save(tmp_path, state)
    assert behind.load(tmp_path) == state
    # Readers beside a writer only ever see a whole file (written, then renamed over).
    stop = threading.Event()
    seen: list[int] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(len(behind.load(tmp_path)))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(200):
        behind.save(tmp_path, {**state, "cache_sync": Behind(i, {})} if i % 2 else state)
    stop.set()
    reader.join()
    assert seen and set(seen) <= {1, 2}
    behind.save(tmp_path, {})
    assert behind.load(tmp_path) == {}
    assert [p.name for p in tmp_path.iterdir()] == [behind.STATE_FILE]  # no temporary left


def test_a_batch_starts_where_the_offsets_log_says(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "1").write_text(OFFSETS_1)
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text(INITIAL)
    assert behind.batch_start(tmp_path, 2) == {"hb": {"0": 28}, "t": {"0": 467, "1": 531}}
    assert behind.batch_start(tmp_path, 0) == {"hb": {"0": 0}, "t": {"0": 0, "1": 0}}
    with pytest.raises(FileNotFoundError):
        behind.batch_start(tmp_path, 5)
    with pytest.raises(ValueError):
        behind.logged_offsets("not a log")
    # The direct read's source writes no initial offsets: the first batch starts at the
    # earliest offset of every partition (none given), which catch_up_range reads from.
    (tmp_path / "sources" / "0" / "0").unlink()
    assert behind.batch_start(tmp_path, 0) == {}
    # With the ranges it read: their starts, and its end where it read nothing.
    (tmp_path / "offsets" / "0").write_text(OFFSETS_1)
    assert behind.batch_start(tmp_path, 0, {"t": {"1": 500}}) == {
        "hb": {"0": 28},
        "t": {"0": 467, "1": 500},
    }
    assert behind.catch_up_range({}, {"t": {"0": 5}}) == (
        {"t": {"0": behind.EARLIEST}},
        {"t": {"0": 5}},
    )


def test_local_dir() -> None:
    assert behind.local_dir("/c/sync") == Path("/c/sync")
    assert behind.local_dir("file:///c/sync") == Path("/c/sync")
    assert behind.local_dir("file:/c/sync") == Path("/c/sync")
    with pytest.raises(ConfigError, match="not a local directory"):
        behind.local_dir("s3a://bucket/c")


def test_the_catch_up_range() -> None:
    since = {"t": {"0": 10, "1": 20}, "gone": {"0": 3}}
    until = {"t": {"0": 15, "1": 20, "2": 4}, "new": {"0": 6}}
    # Partition 1 missed nothing; partition 2 and the new topic appeared since: from their
    # earliest offset; a topic no longer read is not read.
    assert behind.catch_up_range(since, until) == (
        {"t": {"0": 10, "2": EARLIEST}, "new": {"0": EARLIEST}},
        {"t": {"0": 15, "2": 4}, "new": {"0": 6}},
    )
    assert behind.catch_up_range(until, until) is None
    assert behind.catch_up_range({}, {}) is None


def test_a_long_catch_up_goes_in_steps_of_a_batch() -> None:
    start = {"t": {"0": 100, "1": 0, "2": EARLIEST}, "hb": {"0": 7}}
    end = {"t": {"0": 1100, "1": 5, "2": 40}, "hb": {"0": 9}}
    # 400 records a step: 100 a partition; a partition from its earliest offset goes whole.
    first = behind.catch_up_step(start, end, 400)
    assert first == {"t": {"0": 200, "1": 5, "2": 40}, "hb": {"0": 9}}
    since = behind.advanced(start, first)
    assert since == first and start["t"]["0"] == 100  # a new value, the old one kept
    steps, at = [first], since
    while (span := behind.catch_up_range(at, end)) is not None:
        steps.append(behind.catch_up_step(*span, 400))
        assert behind.records_between(span[0], steps[-1]) == min(400, 1100 - at["t"]["0"])
        at = behind.advanced(at, steps[-1])
    # Partition 0's other 900 records, 400 a step once it is the only one left.
    assert [step["t"]["0"] for step in steps] == [200, 600, 1000, 1100] and at == end
    assert behind.records_between({"t": {"0": 100}}, {"t": {"0": 250}}) == 150
    assert behind.records_between(start, end) is None  # an earliest start: not known
    assert behind.catch_up_step({"t": {"0": 5}}, {"t": {"0": 9}}, 0) == {"t": {"0": 6}}


class _Answers:
    """A sink that answers the background probe (nothing else is called here)."""

    def read_watermark(self, job: str) -> None:
        return None

    def close(self) -> None:
        pass


def test_the_direct_reads_ranges_come_from_the_offsets_log(tmp_path: Path) -> None:
    """A batch's ranges: from the previous entry to its own; the first batch from
    ``earliest``, from offset 0 (the task's consumer goes on from each log start); the first
    from anywhere else, or an entry missing, collected by a Spark job (None)."""
    log_dir = tmp_path / "offsets"
    log_dir.mkdir()
    (log_dir / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"hb":{"0":0},"t":{"0":400,"1":9}}')
    (log_dir / "1").write_text(OFFSETS_1)
    batch = _batch(tmp_path, "cache_sync")
    assert [(r.topic, r.partition, r.start, r.end) for r in batch._logged_ranges(0) or []] == [
        ("t", 0, 0, 400),
        ("t", 1, 0, 9),
    ]
    assert [(r.topic, r.partition, r.start, r.end) for r in batch._logged_ranges(1) or []] == [
        ("hb", 0, 0, 28),
        ("t", 0, 400, 467),
        ("t", 1, 9, 531),
    ]
    assert batch._logged_ranges(2) is None
    batch.opts = replace(batch.opts, starting_offsets="latest")
    assert batch._logged_ranges(0) is None
    assert batch._logged_ranges(1) is not None


def _batch(tmp_path: Path, *jobs: str) -> ApplyBatch:

    spark = load_settings().spark.model_copy(
        update={"follower_behind_after_s": 0.3, "follower_retry_s": 0.6}
    )
    opts = JobOptions(
        name="sync",
        heartbeat_topic=None,
        topics=("t",),
        topic_pattern=None,
        starting_offsets="earliest",
        checkpoint=str(tmp_path),
        available_now=False,
        trigger_interval="1 second",
        max_offsets_per_trigger=None,
    )
    followers = [Follower(job, lambda _s: _Answers()) for job in jobs]  # type: ignore[arg-type,return-value]
    return ApplyBatch(load_settings().model_copy(update={"spark": spark}), opts, None, followers)


def test_one_follower_down_is_retried_alone_then_falls_behind(tmp_path: Path) -> None:
    """The outage rule of the shared job (ApplyBatch._each): the follower that answered is
    not asked again; the one down is, until follower_behind_after_s, then it is behind
    since the batch's start offsets (the previous batch's end, from the offsets log)."""
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "1").write_text(OFFSETS_1)
    batch = _batch(tmp_path, "cache_sync", "search_sync")
    calls: list[tuple[str, ...]] = []

    def step(followers: Sequence[Follower]) -> dict[str, str]:
        jobs = tuple(f.job for f in followers)
        calls.append(jobs)
        return {"search_sync": "down"} if "search_sync" in jobs else {}

    batch._each(2, batch.followers, step)
    assert calls[0] == ("cache_sync", "search_sync")
    assert len(calls) > 1 and set(calls[1:]) == {("search_sync",)}  # alone, again
    assert batch.outage_retries == len(calls) - 1
    want = {"search_sync": Behind(2, {"hb": {"0": 28}, "t": {"0": 467, "1": 531}})}
    assert batch.behind == want
    assert behind.load(tmp_path) == want  # a restart knows it too
    # Every follower down: no one goes on, so none falls behind; the job stops.
    calls.clear()
    with pytest.raises(RetryableSinkError, match="cache_sync unreachable: down"):
        batch._each(3, batch.followers[:1], lambda fs: {"cache_sync": "down"})
    assert behind.load(tmp_path) == want
    batch.stopping.set()


def test_a_single_follower_never_falls_behind(tmp_path: Path) -> None:
    batch = _batch(tmp_path, "cache_sync")
    with pytest.raises(RetryableSinkError):
        batch._each(0, batch.followers, lambda fs: {"cache_sync": "down"})
    assert batch.behind == {} and not (tmp_path / behind.STATE_FILE).exists()


def test_the_kafka_planner_refuses_a_checkpoint_that_is_not_local(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """spark.direct_planner = kafka takes each batch's ranges from the checkpoint's offsets
    log: a job on an hdfs:// checkpoint stops at once, with one line (no session made)."""
    from spark_jobs.job import run

    monkeypatch.setenv("CDC_SPARK__DIRECT_PLANNER", "kafka")
    status = run("cache_sync", lambda _: None, ["--checkpoint", "hdfs://nn/ckpt/cache"])  # type: ignore[arg-type,return-value]
    assert status == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: spark.direct_planner = kafka reads each batch's offsets"), line
    assert "hdfs://nn/ckpt/cache is not a local directory" in line and "\n" not in line


@pytest.mark.parametrize(
    ("given", "checkpoint", "planner"),
    [
        ("auto", "/var/ckpt/sync", "kafka"),
        ("auto", "file:///var/ckpt/sync", "kafka"),
        ("auto", "hdfs://nn/ckpt/sync", "python"),
        ("auto", "s3a://bucket/ckpt/sync", "python"),
        ("python", "/var/ckpt/sync", "python"),
        ("kafka", "/var/ckpt/sync", "kafka"),
    ],
)
def test_auto_plans_with_the_kafka_source_where_the_offsets_log_is_local(
    monkeypatch: pytest.MonkeyPatch, given: str, checkpoint: str, planner: str
) -> None:
    from spark_jobs.source import direct_planner

    monkeypatch.setenv("CDC_SPARK__DIRECT_PLANNER", given)
    assert direct_planner(load_settings(), checkpoint) == planner
