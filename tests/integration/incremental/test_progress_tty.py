"""The incremental snapshot's progress bar on a real terminal, and none without one (issue 11).

``cdc run`` runs under a pseudo-terminal (``pty.openpty``) while it snapshots a table
incrementally: the frames it draws (one per chunk) must name the table and show rows done
of the estimate, rows/s and an ETA, and the last one must say 100 %. The same reader with
its output in a file draws nothing.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import termios
import threading
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT, Endpoints
from tests.integration.incremental.support import CDC, cdc, chunks_done, pipeline
from tests.integration.reader_support import Workload

pytestmark = pytest.mark.integration

ROWS = 3_000
CHUNK = 500
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]")
FRAME = re.compile(
    r"public\.orders\s+\S*\s+(\d+)%\s+(\d+)/(\d+)\s+([\d,]+) rows/s\s+"
    r"(\d+:\d\d:\d\d)\s+ETA\s+(-:--:--|\d+:\d\d:\d\d)"
)


def _run_on_a_terminal(env: dict[str, str], timeout: float = 120) -> str:
    """``cdc run --until current`` with a 200-column pseudo-terminal as stdin, stdout and
    stderr; everything it wrote there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    out = bytearray()

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer has gone
                return
            if not data:
                return
            out.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.Popen(
            [*CDC, "run", "--until", "current"],
            env={**env, "TERM": "xterm-256color", "COLUMNS": "200"},
            cwd=ROOT,
            stdin=slave,
            stdout=slave,
            stderr=slave,
        )
        os.close(slave)
        rc = proc.wait(timeout)
        reader.join(30)
    finally:
        os.close(master)
    text = out.decode(errors="replace")
    assert rc == 0, text[-3000:]
    return text


def test_progress_bar_on_a_terminal_and_none_without(endpoints: Endpoints, tmp_path: Path) -> None:
    with pipeline(endpoints, tmp_path, "incr_tty") as p:
        Workload(p.dsn, "public.orders").setup(ROWS)
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("ANALYZE orders")  # the estimate is then the row count
        env = p.env(
            CDC_POSTGRES__INITIAL_SNAPSHOT="incremental",
            CDC_POSTGRES__INCREMENTAL_CHUNK_ROWS=str(CHUNK),
        )
        text = _run_on_a_terminal(env)
        assert f"incremental snapshot of public.orders complete: {ROWS} rows" in text
        frames = [m.groups() for m in FRAME.finditer(ANSI.sub("", text))]
        assert frames, f"no progress bar drawn:\n{ANSI.sub('', text)[-3000:]}"
        done = [int(f[1]) for f in frames]
        assert {int(f[2]) for f in frames} == {ROWS}, frames  # rows done / the estimate
        # A frame per chunk after the first (the bar starts once a chunk is in Kafka).
        assert set(range(2 * CHUNK, ROWS + 1, CHUNK)) <= set(done), done
        assert done == sorted(done)
        middle = [f for f in frames if int(f[1]) < ROWS]
        assert any(f[5] != "-:--:--" for f in middle), middle  # an ETA
        # rows/s: counted from the bar's first frame on (rich redraws frames 10 times a second)
        assert all(int(f[3].replace(",", "")) > 0 for f in frames if int(f[1]) > done[0]), frames
        last = frames[-1]
        assert (last[0], last[1], last[2]) == ("100", str(ROWS), str(ROWS)), last

        # Without a terminal: the same snapshot, no bar, the log lines only.
        cdc(p, "snapshot", "public.orders")
        log_file = tmp_path / "plain.log"
        with log_file.open("wb") as out:
            rc = subprocess.run(
                [*CDC, "run", "--until", "current"],
                env={**env, "TERM": "xterm-256color"},
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=120,
            ).returncode
        plain = log_file.read_text(errors="replace")
        assert rc == 0, plain[-3000:]
        assert len(chunks_done(plain)) == ROWS // CHUNK + 1  # the last one finds no rows
        assert f"incremental snapshot of public.orders complete: {ROWS} rows" in plain
        assert "\x1b[" not in plain and "━" not in plain and not FRAME.search(plain)
