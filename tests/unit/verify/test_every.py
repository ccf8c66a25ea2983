"""``cdc verify --every``'s loop and what it says and counts per pass, on clocks that only
move when told (no test sleeps)."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import generate_latest

from pgcdc.core.durations import parse_duration
from pgcdc.core.errors import ConfigError, VerifyError
from pgcdc.core.verify_record import Outcome, VerifyPass
from pgcdc.verify.every import pass_line, run_every
from pgcdc.verify.metrics import VerifyMetrics
from pgcdc.verify.report import as_record
from pgcdc.verify.run import TableResult

pytestmark = pytest.mark.unit


class Clocks(threading.Event):
    """The stop event, whose waits move a fake monotonic clock instead of sleeping; it is
    set after ``passes`` waits."""

    def __init__(self, passes: int) -> None:
        super().__init__()
        self.now = 0.0
        self.passes = passes
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_780_000_000.0 + self.now

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(round(timeout, 6))
        self.now += timeout
        if len(self.waits) >= self.passes:
            self.set()
        return self.is_set()


def _result(**kinds: list[str]) -> TableResult:
    return TableResult("public.items", "cache", rows_checked=120, snapshot_lsn=16, **kinds)


def test_passes_start_an_interval_apart_and_a_long_one_is_followed_at_once() -> None:
    clocks = Clocks(passes=4)
    took = iter([2.0, 12.0, 1.0, 1.0])  # the second pass takes longer than the interval
    seen: list[VerifyPass] = []

    def one_pass() -> list[TableResult]:
        clocks.now += next(took)
        return [_result()]

    n = run_every(
        10.0, one_pass, seen.append, clocks, clock=clocks.wall, monotonic=clocks.monotonic
    )
    assert n == 4
    # Starts at 0, 10, 22 (at once after the long pass), 32: no burst to catch up.
    assert clocks.waits == [8.0, 0.0, 9.0, 9.0]
    assert [p.number for p in seen] == [1, 2, 3, 4]
    assert all(p.every_s == 10.0 and p.outcome is Outcome.CLEAN for p in seen)
    assert seen[1].finished_at - seen[1].started_at == 12.0


def test_a_failed_pass_is_recorded_and_the_next_runs_a_settings_error_ends_the_run() -> None:
    clocks = Clocks(passes=3)
    outcomes = iter(
        [VerifyError("the cache follower's watermark (none recorded) did not reach …"), None]
    )
    seen: list[VerifyPass] = []

    def one_pass() -> list[TableResult]:
        failure = next(outcomes, None)
        if failure is not None:
            raise failure
        return [_result(missing=["1"])]

    assert run_every(5.0, one_pass, seen.append, clocks, monotonic=clocks.monotonic) == 3
    assert [p.outcome for p in seen] == [Outcome.FAILED, Outcome.DRIFT, Outcome.DRIFT]
    assert seen[0].error is not None and seen[0].error.startswith("the cache follower's")

    def not_captured() -> list[TableResult]:
        raise ConfigError("table 'nope' is not captured")

    with pytest.raises(ConfigError):
        run_every(5.0, not_captured, seen.append, Clocks(passes=3))
    assert len(seen) == 3  # nothing recorded for it
    with pytest.raises(ValueError):
        run_every(0, not_captured, seen.append, Clocks(passes=1))


def test_one_line_per_pass() -> None:
    drift = as_record(
        [_result(missing=["1"], differ=["2", "3"]), _result()], 100.0, 101.5, number=3
    )
    assert pass_line(drift) == (
        "verify pass 3: 1 table(s) on cache, 240 rows checked, DRIFT: public.items on cache "
        "(missing 1, differ 2), in 1.5s"
    )
    clean = as_record([_result()], 100.0, 164.0, number=4)
    assert pass_line(clean) == (
        "verify pass 4: 1 table(s) on cache, 120 rows checked, clean, in 1m 04s"
    )
    unsettled = as_record([_result(unsettled=["7"])], 100.0, 100.0, number=5)
    assert "no drift, 1 key(s) unsettled" in pass_line(unsettled)
    failed = as_record([], 100.0, 160.0, error="OpenSearch cannot be read", number=6)
    assert pass_line(failed) == "verify pass 6 failed after 1m 00s: OpenSearch cannot be read"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("10m", 600.0), ("1h", 3600.0), ("1h30m", 5400.0), ("500ms", 0.5), ("2", 2.0)],
)
def test_every_takes_a_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "1h banana", "0s", "-3", "inf", "m"])
def test_every_refuses_what_is_no_duration(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def _metrics(m: VerifyMetrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in generate_latest(m.registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_count_rows_and_passes_and_show_the_last_completed_pass() -> None:
    m = VerifyMetrics()
    m.on_pass(as_record([_result()], 100.0, 101.0))
    m.on_pass(as_record([_result(missing=["1"], extra=["9", "8"])], 200.0, 203.0))
    m.on_pass(as_record([], 300.0, 301.0, error="fence timed out"))
    got = _metrics(m)
    labels = 'follower="cache",table="public.items"'
    assert got[f"cdc_verify_rows_checked_total{{{labels}}}"] == 240
    key = 'cdc_verify_divergent_keys{{follower="cache",kind="{}",table="public.items"}}'
    assert [got[key.format(k)] for k in ("missing", "extra", "differ", "unsettled")] == [
        1,
        2,
        0,
        0,
    ]
    # A failed pass is counted, and leaves the last completed pass's figures as they were.
    assert got["cdc_verify_last_pass_completed_timestamp_seconds"] == 203.0
    assert got["cdc_verify_last_pass_duration_seconds"] == 3.0
    passes = {o: got[f'cdc_verify_passes_total{{outcome="{o}"}}'] for o in Outcome}
    assert passes == {"clean": 1, "drift": 1, "unsettled": 0, "failed": 1}
    # A table no longer checked leaves the gauge.
    m.on_pass(as_record([TableResult("public.other", "search", rows_checked=1)], 400, 401))
    assert not any(k.startswith("cdc_verify_divergent_keys") and "items" in k for k in _metrics(m))
