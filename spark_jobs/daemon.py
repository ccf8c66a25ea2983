"""PySpark's worker daemon with the tasks' modules imported once, before it forks its workers
(the jobs' ``spark.python.daemon.module`` on a local master: a cluster's executors keep
PySpark's own, :func:`spark_jobs.source.daemon_module`).

PySpark's daemon (``pyspark.daemon``) forks a worker per task slot, and each worker imports
``pyspark.worker`` and then, unpickling its task, the job's modules (the sinks, their
clients, the settings, the apply loop): measured in the shared job's 100,000-row backlog,
0.4-0.5 s of CPU per worker, each worker paying again what the others paid. Here the daemon imports them once and freezes them (``gc.freeze``: a worker's
garbage collections do not walk them, nor touch their pages), and each fork shares them.

Spark puts its ``pyspark.zip`` and py4j's zip first on its Python processes' path. Where
those are the installed pyspark's own (``SPARK_HOME`` is the pip package, as here), the daemon
takes them off (:func:`spark_zips_off`): the installed package is the same code, imported
faster than from a zip, and each worker's first task (``importlib.invalidate_caches`` in
``pyspark.worker_util.setup_spark_files``) read both zips' directories again, 2,575 entries:
about 6 % of the workers' time in the shared job's 100,000-row backlog.

Only the daemon of ``pyspark.worker`` preloads: the daemons Spark starts to plan a Python
data source (``pyspark.sql.worker.*``) only import pyspark from the package, not the zip.
PySpark imports a worker module after the fork so that nothing imported starts a thread
before it: none of these modules does, and a test holds it (``tests/unit/test_daemon.py``). A module that cannot be imported here is
left to the worker, which then fails the task with the error the job would have had anyway.

The daemon also caps the C library's malloc arenas of itself and its workers
(:func:`limit_arenas`), unless ``MALLOC_ARENA_MAX`` is set: glibc gives a thread that
allocates an arena of its own, up to eight a core, and a worker's threads (a range each, a
follower each, librdkafka's) each took one and kept freed memory in it. Measured in the
shared job (a 300,000-row backlog, 30,000 records a batch, three runs each, alternated): a
Python worker's peak RSS 475-487 MiB, with two arenas 375-398 MiB (the job's tree
1,150-1,162 MiB, with two arenas 1,050-1,075); the workers' CPU a change 18.6-19.3 µs, with
two arenas 18.5-18.7 µs.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import sys
from collections.abc import Mapping

WORKER = "pyspark.worker"
# The malloc arenas a daemon and its workers keep (glibc's M_ARENA_MAX, through mallopt).
ARENAS = 2
_M_ARENA_MAX = -8
# What a sync task unpickles (its function, settings and followers), and the worker itself.
PRELOAD = (WORKER, "spark_jobs.sync", "spark_jobs.documents_sync", "pgcdc.core.native")


def preload(worker_module: str | None) -> list[str]:
    """Import :data:`PRELOAD` for the daemon of ``worker_module`` (none for another worker
    module than :data:`WORKER`) and freeze what they made; the modules imported."""
    if worker_module not in (None, WORKER):
        return []
    done = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # the worker imports it again and reports the error
            continue
        done.append(name)
    from pgcdc.core import native

    native.module()  # the compiled module, when built: loaded once here too
    gc.collect()
    gc.freeze()
    return done


def limit_arenas(environ: Mapping[str, str] = os.environ) -> bool:
    """Cap this process's malloc arenas, and those of the processes it forks, at
    :data:`ARENAS`: True when capped; False when ``MALLOC_ARENA_MAX`` is set (the user's
    value stands; glibc read it at the start) or the C library has no ``mallopt`` (not
    glibc)."""
    if "MALLOC_ARENA_MAX" in environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, ARENAS))


def spark_zips_off(path: list[str]) -> list[str]:
    """Take off ``path`` (``sys.path``) the zips inside the installed pyspark package (its
    ``python/lib/pyspark.zip`` and py4j's, which Spark puts first when ``SPARK_HOME`` is that
    package) whose package is installed too (``pyspark-…zip`` or ``py4j-…zip``: ``pyspark``,
    ``py4j``), and its jars (``jars/spark-core_….jar``, which Spark puts there too: no Python
    in it, but 5,854 entries whose directory each worker's first task read again), and forget
    their importers; the entries taken off. A zip of another Spark home is kept: that
    pyspark may not be the installed one."""

    def installed(package: str) -> str | None:
        for entry in path:
            where = os.path.join(entry or ".", package)
            if not entry.endswith(".zip") and os.path.isfile(os.path.join(where, "__init__.py")):
                return os.path.realpath(where)
        return None

    home = installed("pyspark")
    if home is None:
        return []
    off = [
        e
        for e in path
        if os.path.realpath(e).startswith(home + os.sep)
        and (
            e.endswith(".jar")
            or (
                e.endswith(".zip")
                and installed(os.path.basename(e).split("-")[0].removesuffix(".zip")) is not None
            )
        )
    ]
    for entry in off:
        path.remove(entry)
        sys.path_importer_cache.pop(entry, None)
    return off


if __name__ == "__main__":
    worker_module = sys.argv[1] if len(sys.argv) > 1 else None
    spark_zips_off(sys.path)  # before pyspark is imported (a planner's daemon too)
    limit_arenas()  # before any thread: the workers fork from here
    from pyspark import daemon

    preload(worker_module)
    daemon.manager()
