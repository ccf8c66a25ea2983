"""The envelope throughput figure from ``scripts/bench_envelope.py`` (another engineer's).

It is run as a subprocess; its number is taken from a JSON line (a key ending in
``per_s``/``events_per_s``) or from text like ``123,456 events/s``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from benchmarks.env import ROOT
from benchmarks.results import NotMeasured

SCRIPT = ROOT / "scripts" / "bench_envelope.py"
_TEXT = re.compile(r"([\d][\d,_.]*)\s*(?:events|envelopes)\s*/\s*s", re.I)


def parse_rate(output: str) -> float | None:
    """The events/s figure in the script's output (JSON first, then text)."""
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            for k, v in doc.items():
                if isinstance(v, (int, float)) and k.endswith("per_s"):
                    return float(v)
    matches = _TEXT.findall(output)
    if matches:
        return float(matches[-1].replace(",", "").replace("_", ""))
    return None


def run_envelope_bench(timeout_s: float = 300, *, quick: bool = False) -> tuple[float, str]:
    """(events/s, detail); NotMeasured when the script is missing or says nothing usable.
    ``quick`` asks for a short run (fewer events, one repeat) when the script takes it."""
    if not SCRIPT.exists():
        raise NotMeasured(f"{SCRIPT.relative_to(ROOT)} does not exist yet")
    cmd = [sys.executable, str(SCRIPT)]
    if "--min" in SCRIPT.read_text():
        cmd += ["--min", "0"]  # we want the figure even when it is below its own bar
    if quick and "--events" in SCRIPT.read_text():
        cmd += ["--events", "30000", "--repeats", "1"]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise NotMeasured(f"{SCRIPT.name} exited {done.returncode}: {tail}")
    rate = parse_rate(done.stdout)
    if rate is None:
        raise NotMeasured(f"no events/s figure in {SCRIPT.name}'s output")
    last = done.stdout.strip().splitlines()[-1]
    return rate, f"{SCRIPT.name}: {last}"
