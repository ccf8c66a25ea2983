"""spark_jobs.checkpoint_lock: one job per checkpoint, told in one line."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_jobs.checkpoint_lock import LOCK_FILE, CheckpointInUse, checkpoint_lock

TRY = """
import sys
from pathlib import Path
from spark_jobs.checkpoint_lock import CheckpointInUse, checkpoint_lock
try:
    checkpoint_lock(Path(sys.argv[1]), wait_s=float(sys.argv[2]))
except CheckpointInUse as e:
    print(e)
    sys.exit(2)
print("locked")
"""


def _try(directory: Path, wait_s: float = 0.2) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", TRY, str(directory), str(wait_s)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_second_process_on_a_held_checkpoint_is_told_who_holds_it(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt" / "sync"
    held = checkpoint_lock(checkpoint)  # made if missing
    try:
        out = _try(checkpoint)
        assert out.returncode == 2, out
        line = out.stdout.strip()
        assert str(checkpoint) in line and "another job runs on the checkpoint" in line
        assert "--checkpoint" in line and "pid " in line
    finally:
        held.close()
    # Released (as when the job's process ends): the next one takes it.
    assert _try(checkpoint).stdout.strip() == "locked"
    assert (checkpoint / LOCK_FILE).exists()


def test_the_same_process_cannot_take_it_twice_either(tmp_path: Path) -> None:
    held = checkpoint_lock(tmp_path)
    try:
        with pytest.raises(CheckpointInUse):
            checkpoint_lock(tmp_path, wait_s=0)
    finally:
        held.close()


def test_a_job_restarted_at_once_waits_for_its_predecessor_to_end(tmp_path: Path) -> None:
    held = checkpoint_lock(tmp_path)
    threading.Timer(0.3, held.close).start()  # the killed job's process ends
    started = time.monotonic()
    out = _try(tmp_path, wait_s=10)
    assert out.stdout.strip() == "locked", out
    assert time.monotonic() - started < 10
