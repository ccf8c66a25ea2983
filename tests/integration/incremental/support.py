"""Helpers of the incremental snapshot tests: one pipeline per test (database, slot, topic
prefix, follower prefixes), the reader as a background process, and the checks."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import ROOT, Endpoints, unique, wait_until
from tests.e2e.pipeline import Pipeline
from tests.integration.reader_support import Record, read_topic
from tests.integration.real_databases.support import cleanup

CDC = [sys.executable, "-m", "cdc"]
CHUNK_DONE = re.compile(
    r"incremental snapshot chunk (\d+) of (\S+) done: (\d+) rows, (\d+) dropped for changes"
)
RESUMED = re.compile(r"incremental snapshot of (\S+) resumed after chunk (\d+)")


@contextmanager
def pipeline(endpoints: Endpoints, tmp_path: Path, prefix: str) -> Iterator[Pipeline]:
    """A database of its own and the names of everything the test creates; all dropped after."""
    name = unique(prefix)
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    p = Pipeline(
        endpoints=endpoints,
        dsn=endpoints.postgres_dsn_for(name),
        name=name,
        index_prefix=name.lower(),
        key_prefix=name,
        checkpoint_dir=tmp_path / "ckpt",
    )
    try:
        yield p
    finally:
        cleanup(p)


class Reader:
    """``cdc run`` in the background, its output appended to one log file."""

    def __init__(self, p: Pipeline, log: Path, **env: str) -> None:
        self.p = p
        self.log = log
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *args: str) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*CDC, "run", *args],
                env=self.p.env(PYTHONUNBUFFERED="1", **self.env),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, pattern: str, timeout: float = 120.0, count: int = 1) -> None:
        def seen() -> bool:
            assert self.proc is None or self.proc.poll() is None, self.tail()
            return self.text().count(pattern) >= count

        wait_until(seen, timeout=timeout, interval=0.05, what=f"{pattern!r} in the reader's log")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(120)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def catch_up(self, timeout: float = 300) -> None:
        """``cdc run --until current`` (snapshots queued included); must exit 0."""
        self.start("--until", "current")
        assert self.proc is not None
        rc = self.proc.wait(timeout)
        assert rc == 0, f"cdc run --until current exited {rc}:\n{self.tail()}"

    def tail(self, n: int = 4000) -> str:
        return self.text()[-n:]


def cdc(p: Pipeline, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [*CDC, *args], env=p.env(**env), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def cdc_fails(p: Pipeline, *args: str, **env: str) -> str:
    """``cdc ARGS`` must exit non-zero with one ``error:`` line on stderr; that line."""
    out = subprocess.run(
        [*CDC, *args], env=p.env(**env), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0, out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def chunks_done(log: str) -> list[tuple[int, str, int, int]]:
    """(chunk, table, rows, dropped) of every chunk the log says was done."""
    return [(int(a), b, int(c), int(d)) for a, b, c, d in CHUNK_DONE.findall(log)]


def topic(p: Pipeline, table: str = "public.orders") -> list[Record]:
    return read_topic(p.endpoints.kafka_bootstrap, f"{p.name}.{table}")


def assert_chunk_rows_not_stale(records: list[Record]) -> int:
    """Every incremental ``r`` equals the state its key had just before it in the topic (or
    is the key's first record): a chunk row is never older than a streamed change before it,
    and never newer than one after it (the per-key order check says the rest). Returns the
    number of incremental rows checked."""
    last: dict[tuple[int, bytes], dict[str, Any] | None] = {}
    prev: dict[tuple[int, bytes], Record] = {}
    checked = 0
    for r in records:
        if r.key is None:
            continue
        k = (r.partition, r.key)
        p = r.payload
        if p is not None and p["op"] == "r" and p["source"]["snapshot"] == "incremental":
            checked += 1
            if k in last:
                assert last[k] == p["after"], (
                    f"incremental row of {r.key!r} at offset {r.offset} is {p['after']}, but "
                    f"the stream had {last[k]} just before it (offset {prev[k].offset}, "
                    f"version {prev[k].commit_lsn}/{prev[k].order}; the row's version "
                    f"{r.commit_lsn}/{r.order})"
                )
        last[k] = None if p is None or p["op"] == "d" else p["after"]
        prev[k] = r
    return checked
