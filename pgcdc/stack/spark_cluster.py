"""A Spark standalone cluster on this machine, from what pyspark ships, and the Python
environment its executors run the jobs in.

- :class:`SparkCluster` starts ``spark-class org.apache.spark.deploy.master.Master`` and two
  ``org.apache.spark.deploy.worker.Worker`` processes on 127.0.0.1 (ports in
  :mod:`pgcdc.core.ports`), each worker with 1 core and ``worker_memory`` for its
  executors; the daemons themselves get 256 MiB of heap. ``stop()`` kills each process
  group (a worker's executors and Python workers with it). Tests and benchmarks use
  ``with SparkCluster(paths).running() as cluster: ... cluster.master_url``;
  :meth:`SparkCluster.kill_worker` is a machine lost mid-stream.
- :func:`executor_env` packs a virtualenv holding the project's dependencies (all but
  pyspark, which the workers bring) with venv-pack, as Spark's Python packaging guide
  advises; :func:`project_zip` zips the project's own packages for ``--py-files``.
  ``scripts/spark-submit --master spark://…`` ships both (``--archives
  <env>.tar.gz#environment``, ``spark.pyspark.python=./environment/bin/python``), and
  :func:`native_archive`, the project's native module as built here, beside it.

Command line: ``python -m pgcdc.stack.spark_cluster up|down|status|pack``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from pgcdc.core.ports import (
    HOST,
    SPARK_MASTER_PORT,
    SPARK_MASTER_UI_PORT,
    SPARK_WORKER_PORTS,
    SPARK_WORKER_UI_PORTS,
)
from pgcdc.stack import common

# The project's packages that executors import (spark_jobs' closures reach all of these).
PROJECT_PACKAGES = ("pgcdc", "cdc", "schemas", "sinks", "spark_jobs")
DAEMON_MEMORY = "256m"
# Where a task finds the native module shipped beside the packed env (native_archive): the
# archive's folder in the executor's working directory, on the workers' PYTHONPATH.
NATIVE_DIR = "pgcdc_native_lib"


def venv_python() -> Path:
    """The project's virtualenv interpreter (the driver's)."""
    return common.REPO / ".venv" / "bin" / "python"


def spark_home() -> Path:
    """The installed pyspark package: it holds bin/spark-class and the jars."""
    found = sorted(common.REPO.glob(".venv/lib/python*/site-packages/pyspark"))
    if not found:
        raise common.StackError("no pyspark in .venv; install the project first (make install)")
    return found[0]


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
        return True
    return False


class SparkCluster:
    """A standalone master and ``workers`` workers, state under ``<stack>/spark-cluster``."""

    def __init__(
        self,
        paths: common.Paths | None = None,
        workers: int = 2,
        worker_memory: str = "768m",
        worker_cores: int = 1,
    ) -> None:
        if not 1 <= workers <= len(SPARK_WORKER_PORTS):
            raise common.StackError(f"workers must be 1..{len(SPARK_WORKER_PORTS)}")
        self.paths = paths or common.paths()
        self.workers = workers
        self.worker_memory = worker_memory
        self.worker_cores = worker_cores
        self.home = self.paths.stack / "spark-cluster"

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{SPARK_MASTER_PORT}"

    def _pidfile(self, role: str) -> Path:
        return self.paths.pidfile(f"spark-{role}")

    def _env(self) -> dict[str, str]:
        return {
            "SPARK_HOME": str(spark_home()),
            "JAVA_HOME": str(common.java_home()),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_LOG_DIR": str(self.paths.logs),
            "SPARK_NO_DAEMONIZE": "1",
            # No REST submission server (port 6066, on by default): jobs go through
            # spark-submit's own protocol on the master port; one port less to collide.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # The executors' Python: overridden per job by spark.pyspark.python.
            "PYSPARK_PYTHON": str(venv_python()),
        }

    def _spawn(self, role: str, args: list[str]) -> int:
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        pid = common.spawn(cmd, log=self.paths.log(f"spark-{role}"), env=self._env(), cwd=self.home)
        self._pidfile(role).parent.mkdir(parents=True, exist_ok=True)
        self._pidfile(role).write_text(f"{pid}\n")
        return pid

    def pid(self, role: str) -> int | None:
        pid = common.read_pid(self._pidfile(role))
        if pid is None or not common.pid_alive(pid):
            return None
        return pid if "org.apache.spark.deploy" in common.cmdline(pid) else None

    def start(self) -> None:
        """Start the master and the workers not running yet; wait until all registered."""
        self.home.mkdir(parents=True, exist_ok=True)
        if self.pid("master") is None:
            if _listening(SPARK_MASTER_PORT):
                raise common.StackError(
                    f"{HOST}:{SPARK_MASTER_PORT} already answers but not from a master this "
                    "stack started; stop that one first"
                )
            self._start_master()
        for i in range(1, self.workers + 1):
            self.start_worker(i)
        common.wait_until(
            "spark workers",
            lambda: self.alive_workers() >= self.workers,
            90,
            log=self.paths.log("spark-worker-1"),
        )

    # A master that exits during startup is started again this many times (its log's last
    # lines are printed each time, so the reason shows even where the log cannot be read).
    master_attempts = 3

    def _start_master(self) -> None:
        log = self.paths.log("spark-master")
        for attempt in range(1, self.master_attempts + 1):
            mark = common.log_size(log)
            common.say(f"starting the Spark master on {self.master_url}")
            pid = self._spawn(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    HOST,
                    "--port",
                    str(SPARK_MASTER_PORT),
                    "--webui-port",
                    str(SPARK_MASTER_UI_PORT),
                ],
            )
            try:
                # Alive by pid, not by command line: the launcher script execs java, and the
                # command line read in between says nothing about whether it still runs.
                common.wait_until(
                    "spark master",
                    lambda: _listening(SPARK_MASTER_PORT),
                    90,
                    alive=lambda: common.pid_alive(pid),  # noqa: B023 - this attempt's pid
                    log=log,
                )
                return
            except common.StackError:
                if attempt == self.master_attempts or common.pid_alive(pid):
                    raise
                common.say(
                    f"the Spark master exited during startup ({attempt}/{self.master_attempts}); "
                    f"its log said:{common.log_tail(log, since=mark)}\nstarting it again"
                )

    def start_worker(self, i: int) -> None:
        """Start worker ``i`` (1-based) unless it runs."""
        if self.pid(f"worker-{i}") is not None:
            return
        work = self.home / f"worker-{i}"
        work.mkdir(parents=True, exist_ok=True)
        common.say(f"starting Spark worker {i} ({self.worker_cores} core, {self.worker_memory})")
        self._spawn(
            f"worker-{i}",
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                HOST,
                "--port",
                str(SPARK_WORKER_PORTS[i - 1]),
                "--webui-port",
                str(SPARK_WORKER_UI_PORTS[i - 1]),
                "--cores",
                str(self.worker_cores),
                "--memory",
                self.worker_memory,
                "--work-dir",
                str(work),
                self.master_url,
            ],
        )

    def alive_workers(self) -> int:
        """Workers the master lists as ALIVE (from its web UI's JSON)."""
        import json
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://{HOST}:{SPARK_MASTER_UI_PORT}/json/", timeout=3
            ) as r:
                state = json.load(r)
        except (OSError, ValueError):
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def executor_pids(self, i: int) -> list[int]:
        """The executor JVMs running under worker ``i`` now."""
        pid = self.pid(f"worker-{i}")
        if pid is None:
            return []
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(stat[1]) == pid and "CoarseGrainedExecutorBackend" in common.cmdline(
                        int(proc.name)
                    ):
                        found.append(int(proc.name))
        return found

    def executors_of(self, i: int) -> int:
        """How many executor JVMs run under worker ``i`` now."""
        return len(self.executor_pids(i))

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i``'s process group: the worker, its executors and their Python
        workers vanish at once, like a lost machine."""
        pid = self.pid(f"worker-{i}")
        if pid is None:
            raise common.StackError(f"Spark worker {i} is not running")
        common.say(f"killing Spark worker {i} (process group {pid})")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        self._pidfile(f"worker-{i}").unlink(missing_ok=True)

    def stop(self) -> None:
        """Stop the workers then the master (each whole process group)."""
        for role in [*(f"worker-{i}" for i in range(self.workers, 0, -1)), "master"]:
            pid = self.pid(role)
            if pid is not None:
                common.say(f"stopping Spark {role} (pid {pid})")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
                with contextlib.suppress(common.StackError):
                    common.terminate(pid, grace_s=20)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            self._pidfile(role).unlink(missing_ok=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[SparkCluster]:
        """Started for the ``with`` block, stopped after it (also on errors)."""
        try:
            self.start()
            yield self
        finally:
            self.stop()


def _dependencies() -> list[str]:
    """The project's runtime dependencies (pyproject.toml) but pyspark (the workers bring
    it) and venv-pack (the packer)."""
    import tomllib

    project = tomllib.loads((common.REPO / "pyproject.toml").read_text())["project"]
    return [d for d in project["dependencies"] if not d.startswith(("pyspark", "venv-pack"))]


def executor_env_archive(paths: common.Paths | None = None) -> Path:
    """Where the packed executor virtualenv of this dependency set lives (built or not)."""
    paths = paths or common.paths()
    constraints = common.REPO / "constraints.txt"
    digest = hashlib.sha256(
        "\n".join([*_dependencies(), constraints.read_text(), sys.version]).encode()
    ).hexdigest()[:12]
    return paths.cache / "executor-env" / f"pgcdc-executor-{digest}.tar.gz"


def executor_env(paths: common.Paths | None = None) -> Path:
    """The packed executor virtualenv (a .tar.gz for ``--archives``), built once per set of
    dependencies and pins under ``<cache>/executor-env/``.

    Two jobs submitted at once share one build: the first takes a lock beside the archive
    and builds; the other waits for it and finds the archive (run together, both built into
    the same folder and one failed)."""
    out = executor_env_archive(paths)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(f"{out.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if out.exists():  # built by whoever held the lock before us
            return out
        _build_executor_env(out)
    return out


def _build_executor_env(out: Path) -> None:
    constraints = common.REPO / "constraints.txt"
    build = out.with_suffix("").with_suffix("")  # the venv folder beside it
    common.say(f"building the executors' virtualenv {build} (once per dependency set)")
    base = Path(os.path.realpath(venv_python()))
    common.run([base, "-m", "venv", "--clear", build], timeout=300)
    common.run(
        [build / "bin" / "pip", "install", "-q", "-c", constraints, *_dependencies()],
        timeout=1800,
    )
    venv_pack = common.REPO / ".venv" / "bin" / "venv-pack"
    tmp = out.with_name(f"{out.name}.{os.getpid()}.part.tar.gz")
    common.run([venv_pack, "-p", build, "-o", tmp, "--force"], timeout=900)
    tmp.replace(out)
    shutil.rmtree(build)  # the archive is what ships; the folder is not needed again


def native_archive(paths: common.Paths | None = None) -> Path | None:
    """The project's native module as ``make install`` built it into the venv
    (``pgcdc_native/``), packed for ``--archives <it>#pgcdc_native_lib`` (rebuilt when it
    changes); None when the venv has none (the executors then take the Python paths).

    A module cannot come through ``--py-files``: Python loads no compiled module from a zip.
    It is not in the packed env either, which is built from the dependencies' releases once
    per set of pins, and the module changes with the code. Built for this machine's Python,
    it suits executors that run the packed env of the same interpreter (a cluster of this
    machine's kind); a module that does not load, or is of another interface, leaves a task
    to the Python paths (:func:`pgcdc.core.native.module`)."""
    paths = paths or common.paths()
    found = sorted(common.REPO.glob(".venv/lib/python*/site-packages/pgcdc_native"))
    files = sorted(f for f in found[0].iterdir() if f.is_file()) if found else []
    if not any(f.suffix == ".so" for f in files):
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    out = paths.cache / "executor-env" / f"pgcdc-native-{h.hexdigest()[:12]}.tar.gz"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.part")
    with tarfile.open(tmp, "w:gz") as tar:
        for f in files:
            tar.add(f, arcname=f"pgcdc_native/{f.name}")
    tmp.replace(out)
    return out


def project_zip(paths: common.Paths | None = None) -> Path:
    """The project's own packages as a zip for ``--py-files`` (rebuilt when they change)."""
    paths = paths or common.paths()
    files = sorted(
        f
        for pkg in PROJECT_PACKAGES
        for f in (common.REPO / pkg).rglob("*")
        if f.is_file() and "__pycache__" not in f.parts and f.suffix in (".py", ".avsc", ".typed")
    )
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(common.REPO)).encode() + b"\0" + f.read_bytes())
    out = paths.cache / "executor-env" / f"pgcdc-code-{h.hexdigest()[:12]}.zip"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            z.write(f, f.relative_to(common.REPO))
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pgcdc.stack.spark_cluster",
        description="A Spark standalone cluster on 127.0.0.1 (a master and two workers) for "
        "the sync jobs; `pack` builds the executors' Python environment.",
    )
    p.add_argument("cmd", choices=("up", "down", "status", "pack"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-memory", default="768m")
    a = p.parse_args(argv)
    cluster = SparkCluster(workers=a.workers, worker_memory=a.worker_memory)
    try:
        if a.cmd == "up":
            cluster.start()
            print(f"spark master {cluster.master_url}, {cluster.alive_workers()} workers alive")
        elif a.cmd == "down":
            cluster.stop()
        elif a.cmd == "status":
            if not _listening(SPARK_MASTER_PORT):
                print(
                    f"no Spark master is running at {cluster.master_url} (start one: "
                    ".venv/bin/python -m pgcdc.stack.spark_cluster up)"
                )
                return 1
            alive = cluster.alive_workers()
            print(f"spark master {cluster.master_url}: {alive} of {a.workers} workers alive")
            return 0 if alive >= a.workers else 1
        else:
            print(executor_env())
            print(project_zip())
            print(native_archive() or "no native module in .venv (make install builds it)")
    except common.StackError as e:
        print(f"spark_cluster: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
