"""The docs run as written: every run block of README.md and docs/*.md against the local stack.

How blocks are chosen, marked and run is in ``tests/docs_blocks.py``; in short, each page gets
scratch settings of its own (database, slot, prefixes, topics, folders: the *pinned*
variables, set again after every command), its blocks run in order as one shell session,
every command must exit 0 and print what the page's ``expect`` directives promise. A ``cdc
run`` that streams until Ctrl-C is started, waited for until it streams, and stopped with
SIGINT (it must exit 0 within :data:`STOP_WITHIN_S`); a sync job's ``spark-submit`` line is
only parsed (its ``--help``, without a JVM, names every option given), so no Spark job starts.

What runs is verified; what is parsed is counted apart. The summary line of each page (blocks
run, skipped, covered elsewhere; commands run, streamed and stopped, parsed) is printed.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests import docs_blocks
from tests.conftest import Endpoints, unique, wait_until

pytestmark = [pytest.mark.integration]

ROOT = docs_blocks.ROOT
COMMAND_TIMEOUT_S = 180.0  # a command that does not end by then fails the page
STREAMING_WITHIN_S = 120.0  # a `cdc run` must stream by then
STOP_WITHIN_S = 10.0  # ...and exit this soon after Ctrl-C (the reader's own test asks 1 s)
STREAMING = re.compile(r"replication started")


@dataclass
class PageRun:
    """What one page's run did, for its summary line."""

    blocks: dict[str, int] = field(default_factory=dict)
    commands_run: int = 0
    streamed_and_stopped: int = 0
    parsed: int = 0
    sql_blocks: int = 0
    output: list[str] = field(default_factory=list)
    timings: list[tuple[float, str]] = field(default_factory=list)  # (seconds, command)

    def line(self, page: str, seconds: float) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.blocks.items()))
        return (
            f"{page}: blocks {kinds or 'none'}; commands: {self.commands_run} run, "
            f"{self.streamed_and_stopped} streamed then stopped with Ctrl-C, {self.parsed} "
            f"parsed only; {self.sql_blocks} sql blocks run; {seconds:.1f}s; slowest: "
            + ", ".join(
                f"{t:.1f}s {c.splitlines()[0][:50]!r}" for t, c in sorted(self.timings)[-4:]
            )
        )


class Session:
    """A shell session for one page: the state (exported variables) carries over between
    commands, and the pinned variables are set again after each."""

    def __init__(self, tmp: Path, pinned: dict[str, str], conditional: dict[str, str]) -> None:
        self.tmp = tmp
        self.state = tmp / "state.sh"
        self.pinned = pinned
        # Pinned only once the page sets them (e.g. the signal topic: not every run has one).
        self.conditional = conditional
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CDC_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")
        }
        # A fresh clone's PATH: no virtualenv on it, so a bare `cdc` fails here as there.
        env["PATH"] = ":".join(
            p for p in env.get("PATH", "").split(":") if "/.venv/" not in p + "/"
        )
        env["PYTHONUNBUFFERED"] = "1"
        self.state.write_text(
            "".join(f"export {k}={shlex.quote(v)}\n" for k, v in {**env, **pinned}.items())
        )
        self.background: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self._n = 0

    def _script(self, command: str, keep_state: bool) -> str:
        """The command inside the session: the state sourced before; with ``keep_state``
        the exported variables saved after, the pinned ones set again."""
        q = shlex.quote
        state = q(str(self.state))
        lines = [f"source {state}", f"cd {q(str(ROOT))}", command]
        if keep_state:
            lines += ["__rc=$?", f"export -p > {state}"]
            lines += [f"echo {q(f'export {k}={q(v)}')} >> {state}" for k, v in self.pinned.items()]
            lines += [
                f'if [ -n "${{{k}:-}}" ]; then echo {q(f"export {k}={q(v)}")} >> {state}; fi'
                for k, v in self.conditional.items()
            ]
            lines.append("exit $__rc")
        return "\n".join(lines) + "\n"

    def run(self, command: str) -> tuple[int, str]:
        """Run a command to its end; its exit status and output."""
        done = subprocess.run(
            ["bash", "-c", self._script(command, keep_state=True)],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        return done.returncode, done.stdout + done.stderr

    def start(self, command: str) -> tuple[subprocess.Popen[bytes], Path]:
        """Start a command that runs until stopped, in a process group of its own (as a
        terminal's foreground job), its output in a file."""
        self._n += 1
        log = self.tmp / f"background-{self._n}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", self._script(command, keep_state=False)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc, log

    def ctrl_c(self, proc: subprocess.Popen[bytes]) -> tuple[int, float]:
        """SIGINT to the command's process group (what Ctrl-C does); its exit status and how
        long it took to exit."""
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            rc = proc.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return -1, time.monotonic() - started
        return rc, time.monotonic() - started

    def close(self) -> None:
        for _command, proc, _log in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_streaming(proc: subprocess.Popen[bytes], log: Path, command: str) -> None:
    def streaming() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"`{command}` exited ({proc.returncode}) before streaming:\n{_tail(log)}")
        return bool(STREAMING.search(log.read_text(errors="replace")))

    wait_until(streaming, timeout=STREAMING_WITHIN_S, interval=0.2, what=f"`{command}` to stream")


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


_HELP_CACHE: dict[str, str] = {}


def _parse_spark_job(session: Session, job: str, args: list[str], where: str) -> None:
    """A sync job's line, parsed only: its --help prints (no JVM) and names each option."""
    if job not in _HELP_CACHE:
        rc, out = session.run(f".venv/bin/python {shlex.quote(job)} --help")
        assert rc == 0, f"{where}: `{job} --help` failed ({rc}):\n{out}"
        _HELP_CACHE[job] = out
    for arg in args:
        option = arg.split("=", 1)[0]
        if option.startswith("--"):
            assert option in _HELP_CACHE[job], f"{where}: {job} has no option {option}"


def _run_command(
    session: Session,
    where: str,
    command: str,
    result: PageRun,
    started_here: list[tuple[str, subprocess.Popen[bytes], Path]],
) -> None:
    """One command of a block, as its kind says (see the module's docstring)."""
    code = docs_blocks._code(command) or command
    job = docs_blocks.spark_job(command)
    if job is not None:
        _parse_spark_job(session, job[0], job[1], where)
        result.parsed += 1
        return
    if code.rstrip().endswith("&") and not code.rstrip().endswith("&&"):
        text = command.rstrip().removesuffix("&").rstrip()
        proc, log = session.start(text)
        started_here.append((text, proc, log))
        if docs_blocks.streams_until_stopped(text):
            _wait_streaming(proc, log, text)
        return
    if docs_blocks.streams_until_stopped(command):
        proc, log = session.start(command)
        _wait_streaming(proc, log, command)
        _stop(session, where, command, proc, log, result)
        return
    rc, out = session.run(command)
    result.output.append(out)
    assert rc == 0, f"{where}: `{command}` exited {rc}:\n{out[-4000:]}"
    result.commands_run += 1


def _stop(
    session: Session,
    where: str,
    command: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    result: PageRun,
) -> None:
    """Ctrl-C a command that streams: it must exit 0 soon."""
    rc, took = session.ctrl_c(proc)
    result.output.append(log.read_text(errors="replace"))
    assert rc == 0, (
        f"{where}: `{command}` did not exit 0 within {STOP_WITHIN_S}s of Ctrl-C "
        f"(status {rc}, {took:.1f}s):\n{_tail(log)}"
    )
    result.streamed_and_stopped += 1


def _run_block(session: Session, block: docs_blocks.Block, result: PageRun) -> None:
    started_here: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    try:
        for command in docs_blocks.commands(block.text):
            began = time.monotonic()
            try:
                _run_command(session, block.where, command, result, started_here)
            finally:
                result.timings.append((time.monotonic() - began, command))
    finally:
        for text, proc, log in started_here:  # a `command &` stops with its block
            if proc.poll() is None:
                _stop(session, block.where, f"{text} &", proc, log, result)
    seen = "\n".join(result.output)
    for text in block.expects:
        assert text in seen, (
            f"{block.where}: the page promises {text!r}, not in the output:\n{seen[-3000:]}"
        )


@pytest.fixture
def scratch(
    endpoints: Endpoints,
    pg_database: str,
    topic_prefix: str,
    key_prefix: str,
    index_prefix: str,
    tmp_path: Path,
) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """The pinned variables of one page, and those pinned once the page sets them."""
    slot = unique("docs")
    pinned = {
        "CDC_POSTGRES__DSN": pg_database,
        "CDC_POSTGRES__SLOT_NAME": slot,
        "CDC_KAFKA__BOOTSTRAP_SERVERS": endpoints.kafka_bootstrap,
        "CDC_KAFKA__TOPIC_PREFIX": topic_prefix,
        "CDC_KAFKA__DEAD_LETTER_TOPIC": f"{topic_prefix}.dlq",
        "CDC_REDIS__URL": endpoints.redis_url,
        "CDC_REDIS__KEY_PREFIX": key_prefix,
        "CDC_SEARCH__URL": endpoints.search_url,
        "CDC_SEARCH__INDEX_PREFIX": index_prefix,
        "CDC_SPARK__CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
    }
    conditional = {
        "CDC_KAFKA__SIGNAL_TOPIC": f"{topic_prefix}.signals",
        "CDC_SCHEMA__AVRO_SCHEMA_DIR": str(tmp_path / "avsc"),
    }
    yield pinned, conditional


def _pages() -> list[Path]:
    return [
        p
        for p in docs_blocks.pages()
        if any(b.kind in ("run", "sql-run") for b in docs_blocks.blocks(p))
    ]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_the_page_runs_as_written(
    page: Path, scratch: tuple[dict[str, str], dict[str, str]], tmp_path: Path
) -> None:
    started = time.monotonic()
    pinned, conditional = scratch
    found = docs_blocks.blocks(page)
    result = PageRun()
    for b in found:
        if b.shell or b.kind == "sql-run":
            result.blocks[b.kind] = result.blocks.get(b.kind, 0) + 1
    with psycopg.connect(pinned["CDC_POSTGRES__DSN"], autocommit=True) as conn:
        for sql in docs_blocks.page_setup(page):
            conn.execute(sql)
    session = Session(tmp_path, pinned, conditional)
    try:
        for block in found:
            if block.kind == "sql-run":
                rc, out = session.run(
                    "psql \"$CDC_POSTGRES__DSN\" -v ON_ERROR_STOP=1 -q <<'__SQL__'\n"
                    f"{block.text}\n__SQL__"
                )
                assert rc == 0, f"{block.where}: the SQL failed:\n{out}"
                result.sql_blocks += 1
            elif block.kind == "run":
                _run_block(session, block, result)
    finally:
        session.close()
    print(result.line(str(page.relative_to(ROOT)), time.monotonic() - started))
