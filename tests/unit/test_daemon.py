"""The jobs' worker daemon (spark_jobs.daemon) preloads the tasks' modules in one thread, and
only for PySpark's task workers."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.core import native
from spark_jobs.daemon import spark_zips_off
from spark_jobs.source import daemon_module

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _after_preload(worker_module: str) -> list[str]:
    """What a fresh interpreter holds after ``preload(worker_module)``: its modules that
    matter here, its OS thread count and frozen object count, a line each."""
    code = (
        "import gc, os, sys\n"
        "from spark_jobs.daemon import preload\n"
        f"preload({worker_module!r})\n"
        "print(','.join(m for m in ('spark_jobs.apply_loop', 'sinks.cache', 'sinks.search', "
        "'pgcdc_native', 'pyarrow', 'pandas') if m in sys.modules))\n"
        "print(len(os.listdir('/proc/self/task')))\n"
        "print(gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split("\n")


def test_the_task_daemon_imports_the_tasks_modules_and_starts_no_thread() -> None:
    """PySpark forks its workers from the daemon: a thread started by an import (pyarrow
    starts two) would not be in them. The task modules are there, frozen, in one thread."""
    modules, threads, frozen = _after_preload("pyspark.worker")[:3]
    wanted = {"spark_jobs.apply_loop", "sinks.cache", "sinks.search"}
    if native.module() is not None:
        wanted.add("pgcdc_native")
    assert set(modules.split(",")) == wanted
    assert threads == "1"
    assert int(frozen) > 10_000


def test_a_planner_daemon_preloads_nothing() -> None:
    """The daemons that plan a Python data source stay as PySpark's own (their processes are
    started at each job's start: the tasks' modules would cost them 0.4 s each)."""
    modules, _threads, frozen = _after_preload("pyspark.sql.worker.plan_data_source_read")[:3]
    assert modules == ""
    assert frozen == "0"


def test_the_daemon_serves_as_pyspark_s_does(tmp_path: Path) -> None:
    """Started as Spark starts a daemon (``python -m <module> pyspark.worker``), it tells
    its port on stdout and listens, with the tasks' modules already loaded (their shared
    libraries mapped) and one thread."""
    env = {
        **os.environ,
        "PYTHON_WORKER_FACTORY_SECRET": "s",
        "SPARK_REUSE_WORKER": "1",
        # As Spark starts it: its own zips of pyspark and py4j first (here: the installed
        # package's, which the daemon leaves for the package itself).
        "PYTHONPATH": os.pathsep.join([*_spark_zips(), str(ROOT)]),
    }
    p = subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.daemon", "pyspark.worker"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None
        (port,) = struct.unpack("!i", p.stdout.read(4))
        assert 0 < port < 65536
        maps = Path(f"/proc/{p.pid}/maps").read_text()
        assert "orjson" in maps
        if native.module() is not None:
            assert "pgcdc_native" in maps
        assert len(os.listdir(f"/proc/{p.pid}/task")) == 1
    finally:
        p.terminate()
        p.wait(30)


def test_only_a_local_master_gets_the_daemon() -> None:
    """A cluster's executors start their daemon before a task brings the job's code to their
    path: there it would not be found, and no task would run."""
    assert daemon_module("local[2]") == "spark_jobs.daemon"
    assert daemon_module("local") == "spark_jobs.daemon"
    assert daemon_module("spark://127.0.0.1:7077") is None
    assert daemon_module("yarn") is None
    assert daemon_module("k8s://https://h:6443") is None


def _spark_zips() -> list[str]:
    """The zips and the jar Spark puts on its Python processes' path: the installed
    pyspark's own."""
    import pyspark

    home = Path(pyspark.__file__).parent
    zips = sorted(str(z) for z in (home / "python" / "lib").glob("*.zip"))
    assert any("pyspark.zip" in z for z in zips) and any("py4j" in z for z in zips)
    core = sorted(str(j) for j in (home / "jars").glob("spark-core_*.jar"))
    assert len(core) == 1
    return sorted([*zips, *core])


def test_the_installed_pyspark_s_own_zips_come_off_the_path_another_home_s_stay(
    tmp_path: Path,
) -> None:
    """The installed pyspark's zips come off (the package is the same code), and its
    spark-core jar (no Python in it); a zip of another Spark home, or of a package not
    installed, stays."""
    import pyspark

    site = str(Path(pyspark.__file__).parent.parent)
    own = _spark_zips()
    other = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")
    lonely = str(Path(own[0]).parent / "nothing_installed-1.0-src.zip")
    path = [*own, other, lonely, site]
    assert sorted(spark_zips_off(path)) == own
    assert path == [other, lonely, site]
    assert spark_zips_off([other, str(tmp_path)]) == []  # no installed pyspark: all stay


def _arenas(cap: bool, environ: dict[str, str] | None = None) -> int:
    """The malloc arenas a fresh interpreter holds once eight threads have each allocated
    (glibc's ``malloc_stats`` names each on stderr), after ``limit_arenas()`` or not."""
    code = (
        "import ctypes, sys, threading\n"
        "from spark_jobs.daemon import limit_arenas\n"
        f"print(limit_arenas() if {cap!r} else None)\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "both = threading.Barrier(9)\n"
        "def allocate():\n"
        "    libc.malloc(4096)\n"
        "    both.wait()\n"
        "    both.wait()\n"
        "threads = [threading.Thread(target=allocate) for _ in range(8)]\n"
        "for t in threads: t.start()\n"
        "both.wait()\n"
        "libc.malloc_stats()\n"
        "both.wait()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | (environ or {})
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, env=env
    )
    return sum(1 for line in out.stderr.splitlines() if line.startswith("Arena "))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_stats")
def test_the_daemon_caps_its_workers_malloc_arenas() -> None:
    """Each thread that allocates takes an arena of its own (up to eight a core), and a
    worker's threads kept freed memory in each: the daemon caps them at two, for itself and
    the workers it forks; a MALLOC_ARENA_MAX of the user's stands."""
    from spark_jobs.daemon import ARENAS, limit_arenas

    assert _arenas(cap=False) > ARENAS
    assert _arenas(cap=True) == ARENAS
    assert _arenas(cap=True, environ={"MALLOC_ARENA_MAX": "3"}) == 3
    assert limit_arenas({"MALLOC_ARENA_MAX": "3"}) is False
