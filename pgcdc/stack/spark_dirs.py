"""The driver's scratch folders: a folder of its own for each job ``scripts/spark-submit``
starts, and the folders of jobs that are gone removed at the next start.

Spark writes a driver's scratch files (``spark-<uuid>``: the files and archives given to
the job, unpacked; the Python workers' files) under ``spark.local.dir``, ``/tmp`` by
default, and removes them when the JVM exits normally. A job killed (``kill -9``, the
machine's OOM killer, a container stopped) leaves them: on a standalone cluster each holds
the executors' environment unpacked, about 520 MB, and a development machine whose jobs were
killed by tests filled its disk with them.

So each job gets ``<tmp>/pgcdc-spark-<uid>-<pid namespace>/<pid>-<start>`` (``SPARK_LOCAL_DIRS``): the JVM's pid
(``scripts/spark-submit`` execs it, so its pid is the launcher's) and that process's start
time, which tells it from a later process given the same pid. A folder of that form whose
process is gone is removed when the next job starts; nothing else is touched. Linux only
(``/proc``); elsewhere, and when the user chose ``spark.local.dir`` or ``SPARK_LOCAL_DIRS``,
Spark's own default stands.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

_NAME = re.compile(r"(\d+)-(\d+)")


def root() -> Path:
    """Where this user's jobs' folders are: ``pgcdc-spark-<uid>-<pid namespace>`` in the
    temporary directory. A pid tells processes apart only inside its namespace: a job in
    another container that shares the temporary directory has a root of its own, and its
    folders are never taken for those of gone processes."""
    try:
        space = re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        space = "0"
    return Path(tempfile.gettempdir()) / f"pgcdc-spark-{os.getuid()}-{space}"


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot: ``/proc/<pid>/stat``'s 22nd
    field), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (2nd field) is in parentheses and may hold spaces: count after it.
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def remove_dead(under: Path) -> list[Path]:
    """Remove each ``<pid>-<start>`` folder in ``under`` whose process is gone (no process
    of that pid, or one that started at another time); the folders removed."""
    removed: list[Path] = []
    try:
        entries = list(under.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _NAME.fullmatch(entry.name)
        if m is None or entry.is_symlink() or not entry.is_dir():
            continue
        if start_time(int(m.group(1))) == int(m.group(2)):
            continue  # its job runs
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def own_dir(pid: int | None = None, under: Path | None = None) -> Path | None:
    """The folder for the job that will run as ``pid`` (this process, by default), made,
    after the gone jobs' folders are removed; None where processes' start times cannot be
    read (no ``/proc``)."""
    pid = os.getpid() if pid is None else pid
    started = start_time(pid)
    if started is None:
        return None
    under = root() if under is None else under
    try:
        under.mkdir(mode=0o700, exist_ok=True)
        if under.is_symlink() or under.stat().st_uid != os.getuid():
            return None  # not ours: Spark's default stands
        remove_dead(under)
        mine = under / f"{pid}-{started}"
        mine.mkdir(mode=0o700, exist_ok=True)
    except OSError:  # a temporary directory we cannot write: Spark's default stands
        return None
    return mine
