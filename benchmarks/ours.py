"""Our reader (``python -m cdc run``), launched the way a user would, on this run's resources."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from benchmarks.env import ROOT, BenchEnv
from benchmarks.proc import Measured
from pgcdc.core.contract import table_topic

log = logging.getLogger(__name__)


class OursReader:
    """One reader identity for this run: its own slot, publication and topic prefix."""

    name = "ours"

    def __init__(
        self,
        env: BenchEnv,
        tables: list[str],
        *,
        role: str = "ours",
        settings: dict[str, str] | None = None,
    ) -> None:
        """``settings``: ``CDC_*`` variables of this reader (e.g. kafka.exactly_once)."""
        self.env = env
        self.settings = settings or {}
        self.tables = tables
        self.role = role
        names = env.names_for(role)
        self.slot, self.publication, self.prefix = names.slot, names.publication, names.prefix
        self.workdir = names.workdir

    def topic(self, table: str) -> str:
        """Our topic for ``schema.table``."""
        schema, _, name = table.partition(".")
        return table_topic(self.prefix, schema, name)

    def available(self) -> str | None:
        """None when ``cdc run`` starts here (its ``--help`` exits 0); otherwise the reason."""
        done = subprocess.run(
            [sys.executable, "-m", "cdc", "run", "--help"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"`python -m cdc run` is not usable yet ({tail[0]})"
        return None

    def prepare(self) -> None:
        """Create our topics up front with the bench topic settings (LogAppendTime)."""
        self.env.create_topics([self.topic(t) for t in self.tables])

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CDC_POSTGRES__DSN"] = self.env.dsn
        env["CDC_KAFKA__BOOTSTRAP_SERVERS"] = self.env.bootstrap
        return env | self.settings

    def launch(
        self, *, until_current: bool, snapshot_mode: str = "no_data", drop_slot: bool = False
    ) -> Measured:
        """Start ``cdc run`` (``--until current`` exits once caught up)."""
        cmd = [
            sys.executable, "-m", "cdc", "run",
            "--slot", self.slot, "--publication", self.publication,
            "--topic-prefix", self.prefix, "--tables", ",".join(self.tables),
            "--snapshot-mode", snapshot_mode,
        ]  # fmt: skip
        if until_current:
            cmd += ["--until", "current"]
        if drop_slot:
            cmd.append("--drop-slot-on-exit")
        return Measured(cmd, env=self.environ(), cwd=ROOT, log_path=self.workdir / "reader.log")

    def finish(self, m: Measured, timeout_s: float = 600.0) -> None:
        """Wait for ``--until current`` to end, or stop a streaming reader; raise on failure."""
        st = m.wait(timeout_s) if "--until" in m.cmd else m.stop(60)
        ok = (0,) if "--until" in m.cmd else (0, -15, 143)
        if st.returncode not in ok:
            errors = [x for x in self.log_tail(200).splitlines() if x.startswith("error:")]
            why = errors[-1] if errors else self.log_tail(1)
            raise RuntimeError(f"cdc run exited {st.returncode}: {why}")

    def log_tail(self, lines: int = 15) -> str:
        p = self.workdir / "reader.log"
        if not p.exists():
            return ""
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
