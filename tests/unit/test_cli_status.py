"""``cdc --version`` and ``cdc status``: the table, ``--json``, and exit 3 when unhealthy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

import cdc.status
from cdc.cli import app
from cdc.status import problems
from pgcdc import __version__

pytestmark = pytest.mark.unit

GIB = 1024**3


def _slot(**over: Any) -> dict[str, Any]:
    base = {
        "database": "cdc",
        "slot": "cdc_slot",
        "exists": True,
        "server_wal_lsn": "0/200",
        "active": True,
        "active_pid": 42,
        "wal_status": "reserved",
        "safe_wal_size": None,
        "confirmed_flush_lsn": "0/100",
        "restart_lsn": "0/100",
        "retained_wal_bytes": 256,
        "lag_bytes": 256,
        "lag_seconds": 1.5,
    }
    return base | over


def _status(slot: dict[str, Any], followers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "slot": slot,
        "warnings": [],
        "state": {"phase": "streaming", "acked_lsn": "0/100"},
        "topics": {"cdc.public.t": {"0": 7, "1": 3}},
        "followers": followers or {"cache_sync": {"watermark": "0/100", "behind_bytes": 256}},
    }
    out["problems"] = problems(out, GIB)
    out["healthy"] = not out["problems"]
    return out


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"cdc (pgcdc) {__version__}"


def test_a_streaming_slot_is_healthy() -> None:
    assert problems(_status(_slot()), GIB) == []


@pytest.mark.parametrize(
    ("slot", "followers", "expected"),
    [
        (_slot(exists=False), None, "does not exist"),
        (_slot(wal_status="lost"), None, "is lost"),
        (_slot(active=False, retained_wal_bytes=2 * GIB), None, "inactive and retains 2.0 GiB"),
        (_slot(), {"search_sync": {"error": "connection refused"}}, "search_sync: connection"),
    ],
)
def test_what_makes_the_reader_unhealthy(
    slot: dict[str, Any], followers: dict[str, Any] | None, expected: str
) -> None:
    (line,) = problems(_status(slot, followers), GIB)
    assert expected in line


def test_an_inactive_slot_under_the_threshold_is_healthy() -> None:
    assert problems(_status(_slot(active=False, retained_wal_bytes=GIB)), GIB) == []


def _invoke(monkeypatch: pytest.MonkeyPatch, status: dict[str, Any], *args: str) -> Any:
    monkeypatch.setattr(cdc.status, "gather_status", lambda settings, sections: status)
    return CliRunner().invoke(app, ["status", *args])


def test_status_prints_tables_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _invoke(monkeypatch, _status(_slot()))
    assert result.exit_code == 0, result.output
    for part in ("cdc_slot", "reserved", "0/100", "256 B", "1.5", "cdc.public.t", "10"):
        assert part in result.stdout, part
    assert "cache_sync" in result.stdout and result.stdout.rstrip().endswith("healthy")


def test_status_json_and_exit_3_when_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    status = _status(_slot(wal_status="lost"))
    result = _invoke(monkeypatch, status, "--json")
    assert result.exit_code == 3
    printed = json.loads(result.stdout)
    assert printed["healthy"] is False and printed["slot"]["wal_status"] == "lost"
    table = _invoke(monkeypatch, status)
    assert table.exit_code == 3 and "unhealthy: replication slot cdc_slot is lost" in table.stdout


def test_status_help_documents_the_exit_status() -> None:
    result = CliRunner().invoke(app, ["status", "--help"])
    assert "3 unhealthy" in " ".join(result.stdout.split())


def _follower(mark: str, age: float | None) -> dict[str, Any]:
    return {"search_sync": {"watermark": mark, "watermark_age_s": age, "behind_bytes": 0}}


def _with_commit(status: dict[str, Any], last_commit: str | None) -> dict[str, Any]:
    status["state"]["last_commit_lsn"] = last_commit
    return status


@pytest.mark.parametrize(
    ("mark", "age", "last_commit", "stale"),
    [
        ("0/100", 61.0, "0/200", True),  # changes wait, and it has not moved for 61s
        ("0/100", 59.0, "0/200", False),  # changes wait, but it moved lately
        ("0/200", 3600.0, "0/200", False),  # an idle database: nothing waits
        ("0/300", 3600.0, "0/200", False),  # heartbeats carried it past the last commit
        ("0/100", None, "0/200", False),  # age unknown (written before it was recorded)
        ("0/100", 61.0, None, False),  # the reader acknowledged no commit yet
    ],
)
def test_a_follower_is_stale_when_changes_wait_for_an_old_watermark(
    mark: str, age: float | None, last_commit: str | None, stale: bool
) -> None:
    status = _with_commit(_status(_slot(), _follower(mark, age)), last_commit)
    found = problems(status, GIB, watermark_stale_s=60.0)
    assert bool(found) is stale, found
    if stale:
        (line,) = found
        assert line.startswith("follower search_sync: watermark 0/100 has not advanced for 1m 01s")
        assert "spark.watermark_stale_s = 60s" in line and "changes up to 0/200" in line
