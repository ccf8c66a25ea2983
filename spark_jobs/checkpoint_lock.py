"""One job per checkpoint, on a local path written with ``spark.checkpoint_files =
filesystem``.

Spark's default checkpoint writer (Hadoop's ``FileContext``) renames each batch's offsets
file into place without overwriting, so a second job started on the same checkpoint fails
at its first batch. Hadoop's ``FileSystem`` API, which the ``filesystem`` setting uses, checks
and then renames, which two jobs can pass at once. So the job takes an exclusive lock on a
file in its checkpoint for as long as it runs (the kernel releases it when the process ends,
a ``kill -9`` too), and a second job on that checkpoint stops with one line (after waiting
up to 10 s for the first to end).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

LOCK_FILE = ".pgcdc-job.lock"
WAIT_S = 10.0


class CheckpointInUse(Exception):
    """Another running job holds the checkpoint's lock."""


def checkpoint_lock(directory: Path, wait_s: float = WAIT_S) -> IO[str]:
    """Hold ``directory``'s lock (made if missing) until the returned file is closed or the
    process ends; :class:`CheckpointInUse` if another process still holds it after
    ``wait_s`` (a job restarted at once after a kill may meet its predecessor's last
    moments)."""
    directory.mkdir(parents=True, exist_ok=True)
    f = (directory / LOCK_FILE).open("a+")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
        f.seek(0)
        holder = f.read().strip() or "a process"
        f.close()
        raise CheckpointInUse(
            f"another job runs on the checkpoint {directory} ({holder}): stop it first, or "
            "give this job a --checkpoint of its own"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f
