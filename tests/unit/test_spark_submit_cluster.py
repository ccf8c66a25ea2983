"""scripts/spark-submit on a standalone cluster ships the executors' environment, and
settings given as Spark configuration reach the settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark import SparkConf

from spark_jobs.source import settings_env_from_conf
from tests import spark_submit_script

pytestmark = pytest.mark.unit


_submit = spark_submit_script.load


JARS = [Path("/jars/a.jar")]
EXE = Path("/spark/bin/spark-submit")
FILES = (Path("/c/env.tar.gz"), Path("/c/code.zip"), Path("/c/native.tar.gz"))


def test_a_cluster_master_ships_the_packed_env_and_the_code() -> None:
    s = _submit()
    args = ["--master", "spark://h:7077", "spark_jobs/cache_sync.py", "--available-now"]
    assert s.on_cluster(args)
    argv = s.build_argv(args, JARS, EXE, FILES)
    archives = "/c/env.tar.gz#environment,/c/native.tar.gz#pgcdc_native_lib"
    assert argv[argv.index("--archives") + 1] == archives
    assert "spark.executorEnv.PYTHONPATH=pgcdc_native_lib" in argv
    assert "spark.pyspark.python=./environment/bin/python" in argv
    assert argv[argv.index("--py-files") + 1] == "/c/code.zip"
    assert argv[argv.index("--executor-memory") + 1] == "512m"
    assert argv[argv.index("--master") + 1] == "spark://h:7077"
    assert argv[-2:] == ["spark_jobs/cache_sync.py", "--available-now"]  # the app comes last


def test_no_native_module_or_an_own_pythonpath_ships_the_env_alone() -> None:
    s = _submit()
    args = ["--master", "spark://h:7077", "spark_jobs/cache_sync.py"]
    argv = s.build_argv(args, JARS, EXE, (*FILES[:2], None))
    assert argv[argv.index("--archives") + 1] == "/c/env.tar.gz#environment"
    assert not any("PYTHONPATH" in a for a in argv)
    own = ["--conf", "spark.executorEnv.PYTHONPATH=/opt/lib", *args]
    argv = s.build_argv(own, JARS, EXE, FILES)
    assert argv[argv.index("--archives") + 1] == "/c/env.tar.gz#environment"
    assert [a for a in argv if "PYTHONPATH" in a] == ["spark.executorEnv.PYTHONPATH=/opt/lib"]


def test_the_native_archive_holds_the_venvs_module_and_follows_it(tmp_path: Path) -> None:
    import tarfile

    from pgcdc.stack import common, spark_cluster

    built = spark_cluster.native_archive(common.Paths(stack=tmp_path, cache=tmp_path))
    if built is None:
        pytest.skip("no native module in .venv (make install builds it where cargo is)")
    with tarfile.open(built) as tar:
        names = tar.getnames()
    assert "pgcdc_native/__init__.py" in names
    assert any(n.startswith("pgcdc_native/") and n.endswith(".so") for n in names)
    # Named by its content: the same module, the same archive, not packed again.
    assert spark_cluster.native_archive(common.Paths(stack=tmp_path, cache=tmp_path)) == built


def test_own_archives_and_local_masters_are_left_alone() -> None:
    s = _submit()
    own = ["--master=spark://h:7077", "--archives", "mine.tgz#env", "spark_jobs/cache_sync.py"]
    argv = s.build_argv(own, JARS, EXE, FILES)
    assert argv.count("--archives") == 1 and "mine.tgz#env" in argv
    assert "--py-files" not in argv
    assert not s.on_cluster(["--master", "local[2]", "spark_jobs/cache_sync.py"])
    assert not s.on_cluster(["spark_jobs/cache_sync.py", "--master", "spark://h:1"])  # a job arg
    assert "--archives" not in s.build_argv(["spark_jobs/cache_sync.py"], JARS, EXE)


def test_spark_cdc_conf_becomes_settings_variables() -> None:
    conf = SparkConf(loadDefaults=False)
    conf.set("spark.cdc.redis.url", "redis://cache:6379/0")
    conf.set("spark.cdc.kafka.bootstrap_servers", "k1:9092")
    conf.set("spark.cdc.redis.key_prefix", "from-conf")
    conf.set("spark.executor.memory", "1g")
    env = {"CDC_REDIS__KEY_PREFIX": "from-env"}
    assert settings_env_from_conf(conf, env) == 2
    assert env == {
        "CDC_REDIS__URL": "redis://cache:6379/0",
        "CDC_KAFKA__BOOTSTRAP_SERVERS": "k1:9092",
        "CDC_REDIS__KEY_PREFIX": "from-env",  # a variable that is set wins
    }


def test_the_packed_env_holds_what_the_tasks_import() -> None:
    """The executors' env is built from the project's dependencies less pyspark (the
    workers bring it, but not its optional requirements): the tasks read their rows with
    pyarrow (mapInArrow), so it must be listed by name, and it keys the pack, so a pack
    built before it is not reused."""
    from pgcdc.stack import spark_cluster

    names = [d.split(">")[0].split("=")[0].split("<")[0] for d in spark_cluster._dependencies()]
    assert "pyarrow" in names and "pyspark" not in names


def test_a_second_job_waits_for_the_executor_env_another_is_building(tmp_path: Path) -> None:
    # Two jobs submitted at once on a fresh cache both built into one folder and one failed
    # (the followers bench, both jobs on the standalone cluster). Here another process holds
    # the build lock; executor_env must wait and return that process's archive, not build.
    import subprocess
    import sys
    import threading

    from pgcdc.stack import common, spark_cluster

    paths = common.Paths(stack=tmp_path / "stack", cache=tmp_path / "cache")
    out = spark_cluster.executor_env_archive(paths)
    out.parent.mkdir(parents=True)
    lock = out.with_name(f"{out.name}.lock")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time\n"
         f"f = open({str(lock)!r}, 'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
         "print('held', flush=True); sys.stdin.readline()\n"
         f"open({str(out)!r}, 'wb').write(b'archive'); f.close()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "held"
    got: list[Path] = []
    waiter = threading.Thread(target=lambda: got.append(spark_cluster.executor_env(paths)))
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive(), "executor_env did not wait for the lock"
    holder.stdin.write("\n")
    holder.stdin.flush()
    waiter.join(10)
    assert not waiter.is_alive() and got == [out]
    assert out.read_bytes() == b"archive"  # the other process's archive: nothing rebuilt
    assert holder.wait(10) == 0


def test_the_driver_and_its_ui_listen_on_loopback_unless_asked_otherwise() -> None:
    s = _submit()
    app = ["spark_jobs/cache_sync.py", "--available-now"]
    assert s.local_ip(app, {}) == "127.0.0.1"
    assert s.local_ip(["--master", "local[4]", *app], {}) == "127.0.0.1"
    assert s.local_ip(["--master=spark://127.0.0.1:17077", *app], {}) == "127.0.0.1"
    # The user's own address wins, and a cluster elsewhere must reach the driver.
    assert s.local_ip(app, {"SPARK_LOCAL_IP": "0.0.0.0"}) is None
    assert s.local_ip(["--conf", "spark.driver.bindAddress=0.0.0.0", *app], {}) is None
    assert s.local_ip(["--conf=spark.driver.host=10.0.0.5", *app], {}) is None
    assert s.local_ip(["-c", "spark.driver.host=10.0.0.5", *app], {}) is None
    assert s.local_ip(["--master", "spark://spark-master:7077", *app], {}) is None
    assert s.local_ip(["--master", "yarn", *app], {}) is None
    # Another --conf, or the job's own arguments, change nothing.
    assert s.local_ip(["--conf", "spark.ui.port=4050", *app], {}) == "127.0.0.1"
    assert s.local_ip([*app, "--conf", "spark.driver.host=x"], {}) == "127.0.0.1"


def test_the_connector_jars_go_on_the_drivers_class_path_unless_one_is_given() -> None:
    """The class path the archive of Spark's classes is written with (spark_cds), so that
    the driver maps the connector's classes too; a user's own class path, or a driver on
    the cluster (whose files are elsewhere), keeps Spark's default."""
    s = _submit()
    job = ["spark_jobs/sync.py"]

    def class_path(args: list[str]) -> str | None:
        argv = s.build_argv(args, JARS, EXE, None, {})
        return (
            argv[argv.index("--driver-class-path") + 1] if "--driver-class-path" in argv else None
        )

    assert class_path(job) == ":".join(str(j) for j in JARS)
    assert class_path(["--driver-class-path", "/mine.jar", *job]) == "/mine.jar"
    assert class_path(["--conf", "spark.driver.extraClassPath=/mine.jar", *job]) is None
    assert class_path(["--deploy-mode", "cluster", *job]) is None
