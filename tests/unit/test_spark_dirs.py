"""A job's scratch folder is its own, and a killed job's is removed at the next start: only
folders named for a process that is gone (pgcdc/stack/spark_dirs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.stack import spark_dirs
from tests import spark_submit_script

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc"),
]


def gone_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_only_the_folders_of_gone_processes_are_removed(tmp_path: Path) -> None:
    me, started = os.getpid(), spark_dirs.start_time(os.getpid())
    assert started is not None
    running = tmp_path / f"{me}-{started}"
    reused = tmp_path / f"{me}-{started + 1}"  # this pid, but another process's start
    dead = tmp_path / f"{gone_pid()}-{started}"
    other = tmp_path / "spark-1234"
    a_file = tmp_path / "1-2"
    for d in (running, reused, dead, other):
        (d / "userFiles").mkdir(parents=True)
        (d / "userFiles" / "env.bin").write_bytes(b"x" * 1000)
    a_file.write_text("not a folder")
    assert sorted(spark_dirs.remove_dead(tmp_path)) == sorted([reused, dead])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [running.name, other.name, a_file.name]
    )


def test_a_job_gets_a_folder_named_for_its_process(tmp_path: Path) -> None:
    killed = tmp_path / f"{gone_pid()}-1"
    killed.mkdir()
    mine = spark_dirs.own_dir(under=tmp_path)
    assert mine == tmp_path / f"{os.getpid()}-{spark_dirs.start_time(os.getpid())}"
    assert mine.is_dir() and not killed.exists()
    assert spark_dirs.own_dir(pid=gone_pid(), under=tmp_path) is None  # no such process


def test_a_root_that_is_not_ours_is_not_used(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "root"
    link.symlink_to(elsewhere)
    assert spark_dirs.own_dir(under=link) is None


def test_spark_submit_gives_the_job_its_folder_unless_the_user_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spark_dirs, "root", lambda: tmp_path)
    s = spark_submit_script.load()
    env: dict[str, str] = {}
    s.with_own_scratch(["spark_jobs/sync.py"], env)
    assert env["SPARK_LOCAL_DIRS"] == str(spark_dirs.own_dir(under=tmp_path))
    chosen = {"SPARK_LOCAL_DIRS": "/data/spark"}
    s.with_own_scratch(["spark_jobs/sync.py"], chosen)
    assert chosen == {"SPARK_LOCAL_DIRS": "/data/spark"}
    env = {}
    s.with_own_scratch(["--conf", "spark.local.dir=/data/x", "spark_jobs/sync.py"], env)
    assert env == {}


def test_the_root_is_this_users_in_this_pid_namespace() -> None:
    space = os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    assert spark_dirs.root().name == f"pgcdc-spark-{os.getuid()}-{space}"


def test_a_root_that_cannot_be_made_is_not_used(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert spark_dirs.own_dir(under=blocked / "root") is None
