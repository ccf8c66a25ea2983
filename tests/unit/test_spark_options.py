"""The sync jobs' command line over the settings, and where their checkpoints go."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pgcdc.core.contract import CACHE_JOB, table_topic_pattern
from pgcdc.core.errors import ConfigError
from pgcdc.core.spark_settings import ReadPath
from spark_jobs.options import parse_args

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("CDC_"):
            monkeypatch.delenv(k)


def test_defaults_follow_every_table_topic_and_the_heartbeats() -> None:
    settings, opts = parse_args(CACHE_JOB, [])
    assert opts.name == CACHE_JOB
    assert opts.topics == ()
    assert opts.topic_pattern == table_topic_pattern(settings.kafka.topic_prefix)
    assert opts.heartbeat_topic == f"__cdc-heartbeat.{settings.kafka.topic_prefix}"
    assert opts.starting_offsets == "earliest"
    assert not opts.available_now
    assert opts.checkpoint == f"{settings.spark.checkpoint_dir}/{CACHE_JOB}"


def test_flags_override_the_settings() -> None:
    _, opts = parse_args(
        CACHE_JOB,
        [
            "--name=mine",
            "--topics=a.public.t, a.public.u",
            "--no-heartbeats",
            "--starting-offsets=latest",
            "--checkpoint=/ckpt/x",
            "--available-now",
            "--max-offsets-per-trigger=7",
        ],
    )
    assert opts.name == "mine"
    assert opts.topics == ("a.public.t", "a.public.u")
    assert opts.topic_pattern is None
    assert opts.heartbeat_topic is None
    assert (opts.starting_offsets, opts.checkpoint) == ("latest", "/ckpt/x")
    assert opts.available_now and opts.max_offsets_per_trigger == 7


def test_a_relative_checkpoint_dir_is_made_absolute_at_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CDC_SPARK__CHECKPOINT_DIR", "ckpt/")
    settings, opts = parse_args(CACHE_JOB, [])
    assert settings.spark.checkpoint_dir == str(tmp_path / "ckpt")
    assert opts.checkpoint == str(tmp_path / "ckpt" / CACHE_JOB)
    # The default is absolute too; URIs of other file systems are kept as they are.
    monkeypatch.delenv("CDC_SPARK__CHECKPOINT_DIR")
    assert Path(parse_args(CACHE_JOB, [])[0].spark.checkpoint_dir).is_absolute()
    monkeypatch.setenv("CDC_SPARK__CHECKPOINT_DIR", "hdfs://nn:8020/ckpt")
    assert parse_args(CACHE_JOB, [])[0].spark.checkpoint_dir == "hdfs://nn:8020/ckpt"


def test_the_source_waits_little_for_a_fetch_unless_the_settings_say_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spark_jobs.source import source_options

    settings, opts = parse_args(CACHE_JOB, ["--topics=a.public.t", "--min-partitions=6"])
    assert settings.spark.read is ReadPath.SPARK  # Spark's source splits the partitions
    got = source_options(settings, opts)
    # The broker holds a fetch at the log's end this long: it bounds a small batch's time.
    assert got["kafka.fetch.max.wait.ms"] == "10"
    assert got["subscribe"] == f"a.public.t,{opts.heartbeat_topic}"
    assert got["minPartitions"] == "6"
    assert got["includeHeaders"] == "true"

    monkeypatch.setenv("CDC_KAFKA__SPARK_CLIENT", '{"fetch.max.wait.ms": "100"}')
    settings, opts = parse_args(CACHE_JOB, [])
    got = source_options(settings, opts)
    assert got["kafka.fetch.max.wait.ms"] == "100"
    assert "subscribe" not in got
    assert opts.heartbeat_topic is not None
    assert got["subscribePattern"] == (
        f"^(?:(?:{opts.topic_pattern})|{re.escape(opts.heartbeat_topic)})$"
    )


@pytest.mark.parametrize("job", ["cache_sync", "sync"])  # search_sync: the docs harness
def test_a_jobs_help_prints_without_a_jvm(job: str, tmp_path: Path) -> None:
    """``python spark_jobs/<job>.py --help`` lists the options and exits 0 without starting
    Spark: with no java on the PATH and JAVA_HOME pointing nowhere, starting a JVM fails."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env["PATH"] = "/usr/bin:/bin"
    env["JAVA_HOME"] = str(tmp_path / "no-java")
    done = subprocess.run(
        [sys.executable, f"spark_jobs/{job}.py", "--help"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: spark_jobs/{job}.py")
    for option in ("--available-now", "--health-port", "--checkpoint", "--topics"):
        assert option in done.stdout
    assert "JAVA_HOME" not in done.stderr and "Java gateway" not in done.stderr
    assert ("--followers" in done.stdout) == (job == "sync")


def test_the_shared_jobs_followers() -> None:
    from pgcdc.core.errors import ConfigError
    from spark_jobs.options import chosen_followers

    known = ("cache", "search")
    assert chosen_followers(None, known) == known
    assert chosen_followers("search", known) == ("search",)
    assert chosen_followers(" search , cache,search", known) == ("search", "cache")
    for wrong in ("redis", ",", "cache,nope"):
        with pytest.raises(ConfigError, match="name one or more of cache, search"):
            chosen_followers(wrong, known)
    _settings, opts = parse_args("sync", ["--followers", "cache"], known)
    assert opts.followers == ("cache",) and opts.checkpoint.endswith("/sync")
    assert parse_args(CACHE_JOB, [])[1].followers == ()


def test_min_partitions_on_the_command_line_reads_with_spark_unless_direct_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings, opts = parse_args(CACHE_JOB, [])
    assert settings.spark.read is ReadPath.DIRECT and opts.min_partitions is None
    monkeypatch.setenv("CDC_SPARK__READ", "direct")
    with pytest.raises(ConfigError, match=r"spark\.read = direct does not"):
        parse_args(CACHE_JOB, ["--min-partitions=4"])
