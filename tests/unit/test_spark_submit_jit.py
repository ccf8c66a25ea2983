"""scripts/spark-submit keeps the driver JVM to its quick compiler (C1) and a small serial-GC
heap when the job reads Kafka directly (spark.read = "direct": the JVM moves no record), and
only then."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_spark_submit_cluster import EXE, JARS, _submit

pytestmark = pytest.mark.unit

JOB = ["spark_jobs/sync.py", "--followers", "cache,search"]


def _java_options(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--driver-java-options":
            return argv[i + 1]
    return None


def test_the_direct_read_by_variable_conf_or_file_gets_c1_and_a_small_heap(tmp_path: Path) -> None:
    s = _submit()
    flags = s.DIRECT_JAVA_OPTIONS.split()
    assert flags[0] == s.C1_ONLY and "-XX:+UseSerialGC" in flags
    assert not any(f.startswith("-Xmx") for f in flags)  # --driver-memory still sets the max
    assert _java_options(s.build_argv(JOB, JARS, EXE, None, {"CDC_SPARK__READ": "direct"})) == (
        s.DIRECT_JAVA_OPTIONS
    )
    by_conf = ["--conf", "spark.cdc.spark.read=direct", *JOB]
    assert _java_options(s.build_argv(by_conf, JARS, EXE, None, {})) == s.DIRECT_JAVA_OPTIONS
    toml = tmp_path / "cdc.toml"
    toml.write_text('[spark]\nread = "direct"\n')
    by_file = [*JOB, "--config", str(toml)]
    assert _java_options(s.build_argv(by_file, JARS, EXE, None, {})) == s.DIRECT_JAVA_OPTIONS
    assert _java_options(s.build_argv(JOB, JARS, EXE, None, {"CDC_CONFIG": str(toml)})) == (
        s.DIRECT_JAVA_OPTIONS
    )


def test_the_variable_wins_as_in_the_settings_and_the_spark_read_keeps_c2() -> None:
    s = _submit()
    # The default read is direct, unless the job splits partitions (Spark's source then).
    assert _java_options(s.build_argv(JOB, JARS, EXE, None, {})) == s.DIRECT_JAVA_OPTIONS
    split = {"CDC_SPARK__MIN_PARTITIONS": "4"}
    assert _java_options(s.build_argv(JOB, JARS, EXE, None, split)) is None
    assert _java_options(s.build_argv([*JOB, "--min-partitions", "4"], JARS, EXE, None, {})) is (
        None
    )
    assert _java_options(s.build_argv(JOB, JARS, EXE, None, {"CDC_SPARK__READ": "spark"})) is None
    by_conf = ["--conf", "spark.cdc.spark.read=direct", *JOB]
    # CDC_* variables win over --conf spark.cdc.* (spark_jobs.source.settings_env_from_conf).
    assert _java_options(s.build_argv(by_conf, JARS, EXE, None, {"CDC_SPARK__READ": "spark"})) is (
        None
    )


def test_a_driver_heap_under_256_mib_starts_small() -> None:
    # A starting heap over the largest stops the JVM: -Xms128m only where -Xmx allows it.
    s = _submit()
    env = {"CDC_SPARK__READ": "direct"}
    assert "-Xms128m -Xmn48m" in s.DIRECT_JAVA_OPTIONS
    for memory, expected in (
        (["--driver-memory", "512m"], s.DIRECT_JAVA_OPTIONS),
        (["--driver-memory=256m"], s.DIRECT_JAVA_OPTIONS),
        (["--driver-memory", "1G"], s.DIRECT_JAVA_OPTIONS),
        (["--driver-memory", "200m"], s.SMALL_DRIVER_JAVA_OPTIONS),
        (["--driver-memory", "100"], s.SMALL_DRIVER_JAVA_OPTIONS),  # MiB, as Spark reads it
        (["--conf", "spark.driver.memory=192m"], s.SMALL_DRIVER_JAVA_OPTIONS),
        (["--driver-memory", "lots"], s.DIRECT_JAVA_OPTIONS),  # spark-submit says what is wrong
    ):
        assert _java_options(s.build_argv([*memory, *JOB], JARS, EXE, None, env)) == expected
    assert "-Xms64m" in s.SMALL_DRIVER_JAVA_OPTIONS and "-Xmn" not in s.SMALL_DRIVER_JAVA_OPTIONS


def test_the_users_own_java_options_are_left_alone() -> None:
    s = _submit()
    env = {"CDC_SPARK__READ": "direct"}
    own = ["--driver-java-options", "-Xss4m", *JOB]
    argv = s.build_argv(own, JARS, EXE, None, env)
    assert argv.count("--driver-java-options") == 1 and _java_options(argv) == "-Xss4m"
    conf = ["--conf", "spark.driver.extraJavaOptions=-Xss4m", *JOB]
    assert "--driver-java-options" not in s.build_argv(conf, JARS, EXE, None, env)


def test_the_driver_maps_the_class_archive_unless_spark_submit_opts_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgcdc.stack import spark_cds

    s = _submit()
    archive = tmp_path / "spark.jsa"
    monkeypatch.setattr(spark_cds, "archive", lambda: archive)
    env: dict[str, str] = {}
    s.with_class_archive(env)
    assert env == {}  # none written yet: the JVM starts as before
    archive.write_bytes(b"")
    s.with_class_archive(env)
    assert env["SPARK_SUBMIT_OPTS"] == f"-XX:SharedArchiveFile={archive} {spark_cds.QUIET}"
    own = {"SPARK_SUBMIT_OPTS": " "}
    s.with_class_archive(own)
    assert own == {"SPARK_SUBMIT_OPTS": " "}
