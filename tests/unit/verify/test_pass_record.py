"""The record of ``cdc verify``'s last pass: made from the results, through its JSON and
back, and what ``cdc status`` makes of it (the text, the JSON, the exit status)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

import cdc.status
from cdc.cli import app
from cdc.status import problems, verify_section, verify_warnings
from cdc.status_view import render_text
from pgcdc.core.verify_record import Check, Outcome, VerifyPass, state_key
from pgcdc.verify.report import as_record
from pgcdc.verify.run import TableResult

pytestmark = pytest.mark.unit

T0 = 1_780_000_000.0  # 2026-05-28 20:26:40 UTC


def _results() -> list[TableResult]:
    drifted = TableResult(
        "public.items",
        "cache",
        leader_rows=120,
        follower_rows=120,
        missing=["1"],
        differ=["2", "3", "4", "5", "6", "7"],
        rows_checked=121,
        snapshot_lsn=0x1A4F2C8,
        finished_at=T0 + 3,
    )
    clean = TableResult(
        "public.items",
        "search",
        leader_rows=120,
        follower_rows=120,
        rows_checked=120,
        snapshot_lsn=0x1A4F2C8,
        finished_at=T0 + 4,
    )
    return [drifted, clean]


def test_a_pass_goes_through_its_json_and_back_unchanged() -> None:
    record = as_record(_results(), T0, T0 + 5, every_s=60.0, number=7)
    again = VerifyPass.from_json(record.to_json())
    assert again == record
    assert again.outcome is Outcome.DRIFT and again.rows_checked == 241
    drifted, clean = again.checks
    assert drifted.snapshot_lsn == "0/1A4F2C8" and drifted.finished_at == T0 + 3
    assert drifted.counts == {"missing": 1, "extra": 0, "differ": 6, "unsettled": 0}
    assert drifted.examples == {"missing": ["1"], "differ": ["2", "3", "4", "5", "6"]}
    assert (drifted.outcome, clean.outcome) == (Outcome.DRIFT, Outcome.CLEAN)
    assert state_key("cdc", "cdc_slot") == b"cdc/cdc_slot#verify"
    # Anything else (another version's record, a damaged one) is one ValueError, which
    # cdc status turns into a warning.
    for other in (
        json.dumps({**record.to_dict(), "v": 99}).encode(),
        b'{"v": 1}',
        b'{"v": 1, "started_at": 1, "finished_at": 2, "checks": [{"table": "t"}]}',
        b"[]",
        b"\xff",
    ):
        with pytest.raises(ValueError, match="not a verify record"):
            VerifyPass.from_json(other)


def test_a_pass_outcome_is_its_worst_check_and_failed_when_it_stopped() -> None:
    def check(**counts: int) -> Check:
        return Check("public.t", "cache", 10, "0/10", T0, counts=counts)

    assert VerifyPass(T0, T0, (check(), check())).outcome is Outcome.CLEAN
    assert VerifyPass(T0, T0, (check(unsettled=2), check())).outcome is Outcome.UNSETTLED
    assert VerifyPass(T0, T0, (check(unsettled=2), check(extra=1))).outcome is Outcome.DRIFT
    assert VerifyPass(T0, T0, (), error="no watermark").outcome is Outcome.FAILED


def _status(record: VerifyPass | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "slot": {"slot": "cdc_slot", "exists": True, "active": True, "wal_status": "reserved"},
        "warnings": [],
        "state": {"phase": "streaming"},
        "topics": {},
        "verify": verify_section(record, T0 + 65),
    }
    out["warnings"] += verify_warnings(out["verify"])
    out["problems"] = problems(out, 1024**3)
    out["healthy"] = not out["problems"]
    return out


def test_status_flags_drift_found_by_the_last_pass() -> None:
    status = _status(as_record(_results(), T0, T0 + 5, every_s=60.0, number=7))
    assert status["problems"] == [
        "the last pass 7 of cdc verify --every (finished 1m 00s ago) found drift: "
        "public.items on cache (missing 1, differ 6); `cdc verify --repair` publishes the "
        "missing and differing rows again (docs/verify.md)"
    ]
    text = render_text(status, width=200)
    assert (
        "Verification: last pass DRIFT, finished 2026-05-28 20:26:45 UTC (1m 00s ago, took "
        "5s, pass 7 of --every 1m 00s)"
    ) in text
    rows = [line.replace("│", " ").split() for line in text.splitlines()]
    lines = [r for r in rows if r and r[0] == "public.items"]
    assert lines[0][:9] == [
        "public.items",
        "cache",
        "drift",
        "121",
        "1",
        "0",
        "6",
        "0",
        "0/1A4F2C8",
    ]
    assert lines[1][:3] == ["public.items", "search", "clean"]
    assert "differ 2, 3, 4, 5, 6" in text and "UNHEALTHY" in text


def test_a_clean_pass_is_healthy_and_unsettled_or_failed_ones_only_warn() -> None:
    clean = _status(as_record(_results()[1:], T0, T0 + 5))
    assert clean["healthy"] and clean["warnings"] == []
    assert "last pass CLEAN" in render_text(clean, width=200)
    unsettled = TableResult("public.t", "search", unsettled=["9"], rows_checked=10)
    status = _status(as_record([unsettled], T0, T0 + 5))
    assert status["healthy"]
    assert status["warnings"] == [
        "the last cdc verify (finished 1m 00s ago) left 1 key(s) unsettled: they kept changing"
    ]
    failed = _status(as_record([], T0, T0 + 5, error="the cache follower's watermark …"))
    assert failed["healthy"]
    assert failed["warnings"] == [
        "the last cdc verify (finished 1m 00s ago) failed: the cache follower's watermark …"
    ]
    assert "last pass FAILED" in render_text(failed, width=200)
    # No pass recorded: nothing shown, nothing judged.
    none = _status(None)
    assert none["healthy"] and "Verification" not in render_text(none)


def test_status_json_carries_the_pass_and_exits_3_on_drift(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status = _status(as_record(_results(), T0, T0 + 5, every_s=60.0, number=7))
    monkeypatch.setattr(cdc.status, "gather_status", lambda settings, sections: status)
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 3
    verify = json.loads(result.stdout)["verify"]
    assert verify["outcome"] == "drift" and verify["age_s"] == 60.0
    assert [(c["table"], c["follower"], c["outcome"]) for c in verify["checks"]] == [
        ("public.items", "cache", "drift"),
        ("public.items", "search", "clean"),
    ]
    assert verify["checks"][0]["missing"] == 1 and verify["checks"][0]["differ"] == 6
