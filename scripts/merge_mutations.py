"""Delete each rule of the incremental merge alone and run its model test.

    .venv/bin/python scripts/merge_mutations.py [SEED ...]   (default: 1 2 3 none)

For each rule of ``cdc/incremental/merge.py`` (its comments ``rule 1`` … ``rule 4``), the rule
is made a no-op, ``tests/unit/test_incremental_model.py`` runs as CI runs it once per seed
(``--hypothesis-seed``; ``none``: Hypothesis picks one), each run with an empty example
database, and the file is restored. A first row runs the code as it is. One line per run;
the exit status is 1 when the code as it is fails or a rule deleted leaves the test passing.
docs/incremental-snapshots.md ("The model-based test") records a run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MERGE = ROOT / "cdc" / "incremental" / "merge.py"
# rule: (the rule's code in merge_chunk, what it becomes)
RULES = {
    "1 unconfirmed": (
        "    if any(seen.unseen(xid) for xid in window.unconfirmed):\n        return None\n",
        "",
    ),
    "2 early": ("        if seen.unseen(xid):\n            drop |= ks\n", "        pass\n"),
    "3 window": ("    drop = set(window.window)\n", "    drop: set[KeyId] = set()\n"),
    "4 truncated": ("    if window.truncated:\n        return []\n", ""),
}


def run(seed: str) -> tuple[bool, str]:
    """Whether the model test passed with ``seed``; its summary and first error."""
    seeded = [] if seed == "none" else [f"--hypothesis-seed={seed}"]
    with tempfile.TemporaryDirectory() as store:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/unit/test_incremental_model.py", "-q",
             "-p", "no:cacheprovider", *seeded],
            cwd=ROOT, capture_output=True, text=True,
            env={**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": store},
        )  # fmt: skip
    lines = out.stdout.splitlines()
    error = next((m[0] for x in lines if (m := re.search(r"\w+Error: .*", x))), "")
    return out.returncode == 0, f"{lines[-1] if lines else ''} {error[:100]}"


def main(seeds: list[str]) -> int:
    original = MERGE.read_text()
    wrong = False
    for rule, (code, noop) in [("none deleted", ("", "")), *RULES.items()]:
        if code:
            assert original.count(code) == 1, f"rule {rule}: its code is not in merge.py"
            MERGE.write_text(original.replace(code, noop))
        try:
            for seed in seeds:
                passed, what = run(seed)
                wrong = wrong or passed != (not code)
                print(f"rule {rule:14} seed {seed:5} {what}", flush=True)
        finally:
            MERGE.write_text(original)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["1", "2", "3", "none"]))
