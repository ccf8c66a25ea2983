"""The parallel schedule of `make test` (tests/schedule.py, scripts/test)."""

from __future__ import annotations

import importlib.util
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import pytest

from tests import schedule

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _runner() -> ModuleType:  # scripts/test is a script without a .py suffix
    loader = SourceFileLoader("scripts_test", str(ROOT / "scripts" / "test"))
    spec = importlib.util.spec_from_loader("scripts_test", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_listed_module_exists() -> None:
    """A renamed or deleted module must leave the tables too: a stale entry schedules nothing."""
    for path in [*schedule.SHARED_GROUPS, *schedule.SLOW_MODULES]:
        assert (ROOT / path).exists(), f"tests/schedule.py names {path}, which does not exist"


def test_modules_share_a_group_only_where_listed() -> None:
    assert schedule.group_of("tests/e2e/test_followers.py") == "tests/e2e/test_followers.py"
    assert schedule.group_of("tests/e2e/test_scale_out.py") == schedule.group_of(
        "tests/integration/test_sinks_cache_cluster.py"
    )
    assert schedule.group_of("tests/integration/security/test_sasl_ssl.py") == "secure"
    assert schedule.weight("tests/unit/test_lsn.py") == 0.0
    assert schedule.weight("tests/integration/security/test_sasl_ssl.py") > 0


def test_the_runner_combines_a_users_marker_with_each_phase() -> None:
    run = _runner()
    assert run.split_marker(["-x", "-m", "e2e and not slow", "-k", "kill"]) == (
        ["-x", "-k", "kill"],
        "e2e and not slow",
    )
    assert run.split_marker(["-munit"]) == ([], "unit")
    assert run.split_marker(["--maxfail=1"]) == (["--maxfail=1"], None)
    assert run.both(None, "exclusive") == "exclusive"
    assert run.both("e2e", "not exclusive") == "(e2e) and (not exclusive)"


def test_a_modules_tests_are_one_unit_of_work_and_shared_groups_one_together() -> None:
    """The scheduler's scope (tests/conftest.py's pytest_xdist_make_scheduler): every test of a
    module, parametrized or not, in one unit; the cluster modules in one unit."""
    scopes = {
        schedule.scope_of(n)
        for n in (
            "tests/e2e/test_followers.py::test_poison_message_goes_to_the_dead_letter_topic",
            "tests/e2e/test_followers.py::test_followers_converge_to_the_database",
            "tests/e2e/test_followers.py::test_kill[a::b@c]",
        )
    }
    assert scopes == {"tests/e2e/test_followers.py"}
    assert schedule.scope_of("tests/e2e/test_scale_out.py::test_x") == schedule.scope_of(
        "tests/integration/test_sinks_cache_cluster.py::test_y[hash]"
    )


def test_the_time_summary_counts_each_worker_and_module() -> None:
    spent = schedule.TimeSpent()
    spent.add("gw0", "tests/a.py::t1", "setup", 0.0, 10.0)
    spent.add("gw0", "tests/a.py::t1", "call", 10.0, 15.0)
    spent.add("gw1", "tests/b.py::t2", "call", 2.0, 4.0)
    spent.add("gw0", "tests/c.py::t3", "call", 100.0, 101.0)
    lines = spent.lines(slowest=2)
    assert lines[0] == "worker gw0: busy 16 s over 2 tests, first to last 101 s"
    assert lines[1] == "worker gw1: busy 2 s over 1 tests, first to last 2 s"
    assert lines[3:] == ["     15.0 s  tests/a.py", "      2.0 s  tests/b.py"]
