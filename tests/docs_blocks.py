"""The shell blocks of README.md and docs/*.md, as the docs harness sees them.

Every fenced block labelled ``sh`` (or ``bash``, ``shell``) is a *shell block*, and every shell
block is one of three kinds, chosen by an HTML comment (invisible on the rendered page) on the
line just before its opening fence:

- **run** (no comment needed): ``tests/integration/test_docs_run.py`` runs it against the
  local stack, command by command, as a user on a fresh clone types it (see below);
- ``<!-- doc-test: skip: <reason> -->``: this machine cannot run it, and the reason says why
  (a Spark or Kafka cluster, TLS certificates, another host, a long run of its own);
- ``<!-- doc-test: covered-by <tests/path.py>[::test_name] -->``: another test runs exactly
  these commands (the file, and the test if named, must exist).

A run block may also carry ``<!-- doc-test: expect "text" "more text" -->``: what the page
promises the commands print (each must appear in their output). A ``sql`` block runs (through
``psql "$CDC_POSTGRES__DSN"``) only when marked ``<!-- doc-test: run -->``; a page may give SQL
that makes what its blocks assume (an application's tables) with
``<!-- doc-test: page-setup: <SQL> -->`` anywhere on the page.

Rules every shell block follows, run or not (:func:`lint`): programs as a fresh clone has them
(``.venv/bin/cdc``, ``.venv/bin/python``, or after ``source .venv/bin/activate``; never a bare
``cdc``), nothing the project does not install (``kcat``: use ``cdc topic tail`` / ``cdc topic
send``), and a fence with a language (an unlabelled block could hide a shell block). A run block
may not hold placeholders (``…``) nor commands that cannot run beside the other tests (``make``,
``scripts/stack down``, a cluster's ``up``; the schema registry's, ``scripts/stack up
--registry`` or ``up registry``, may run).

How a run block runs: each page gets a scratch database, slot, topic, key and index prefixes,
dead-letter and signal topics, checkpoint and Avro schema folders of its own, shared by the
page's blocks in order, as one shell session would (exported variables carry over). Those
*pinned* variables are set again after every command, so ``eval "$(scripts/stack env)"`` or an
``export`` in the page cannot point a block at the shared ``cdc`` database or names. Each
command must exit 0, with these exceptions: a ``cdc run`` without ``--until`` (it streams until
Ctrl-C) is started, waited for until it streams, then sent SIGINT, and must exit 0 within a few
seconds; a command ending in ``&`` is started, waited for in the same way when it is a ``cdc
run``, and stopped so at the block's end; a ``spark-submit`` of a sync job is only parsed (its
``--help`` must print without a JVM and name every option the line gives), so no Spark job
starts here.

``python -m tests.docs_blocks`` prints each page's blocks and their kinds.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELL = ("sh", "bash", "shell")
HARNESS = "tests/integration/test_docs_run.py"
HOWTO = "tests/docs_blocks.py"

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+|~~~+)(?P<lang>[\w+-]*)\s*$")
DIRECTIVE = re.compile(r"<!--\s*doc-test:\s*(?P<body>.*?)\s*-->", re.S)
PAGE_SETUP = re.compile(r"<!--\s*doc-test:\s*page-setup:\s*(?P<sql>.*?)\s*-->", re.S)

# Programs a fresh clone has only inside its virtualenv.
VENV_PROGRAMS = ("cdc", "python", "pip", "pytest", "spark-submit", "ruff", "mypy")
# Programs the project does not install, and what to use instead.
NOT_INSTALLED = {
    "kcat": "`.venv/bin/cdc topic tail` / `.venv/bin/cdc topic send`",
    "kafkacat": "`.venv/bin/cdc topic tail` / `.venv/bin/cdc topic send`",
    "kafka-console-consumer": "`.venv/bin/cdc topic tail`",
    "kafka-console-consumer.sh": "`.venv/bin/cdc topic tail`",
    "kafka-console-producer": "`.venv/bin/cdc topic send`",
    "kafka-console-producer.sh": "`.venv/bin/cdc topic send`",
    "kafka-topics.sh": "`.venv/bin/cdc status` (topics) or `.venv/bin/cdc topic tail`",
}
# Commands that cannot run beside the other tests, with why.
NOT_IN_A_RUN_BLOCK = (
    (re.compile(r"^make\b"), "`make` targets are long runs of their own"),
    (re.compile(r"^scripts/stack\s+down\b"), "`scripts/stack down` stops the shared servers"),
    (
        # The schema registry may: the tests start that one anyway (one server, no cluster).
        re.compile(r"^scripts/stack\s+up\s+(?!(--registry|registry)\s*(#.*)?$)\S"),
        "`scripts/stack up <service>` starts more servers (clusters, secured ones)",
    ),
    (re.compile(r"spark_cluster\s+up\b"), "a Spark standalone cluster (three JVMs)"),
    (re.compile(r"^docker\b"), "Docker is not what the default test run uses"),
)
PLACEHOLDER = "…"
ACTIVATE = re.compile(r"(^|[;&|]\s*)(source|\.)\s+\.venv/bin/activate\b")


@dataclass(frozen=True)
class Directive:
    kind: str  # "skip", "covered-by", "run", "expect"
    text: str  # the reason, the test, or the expected strings as written


@dataclass
class Block:
    page: Path
    line: int  # the opening fence's line (1-based)
    lang: str
    text: str
    directives: list[Directive] = field(default_factory=list)

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"

    @property
    def shell(self) -> bool:
        return self.lang in SHELL

    @property
    def kind(self) -> str:
        """``run``, ``skip`` or ``covered-by`` (shell blocks); ``sql-run`` / ``other``."""
        kinds = [d.kind for d in self.directives if d.kind in ("skip", "covered-by")]
        if self.shell:
            return kinds[0] if kinds else "run"
        if self.lang == "sql" and any(d.kind == "run" for d in self.directives):
            return "sql-run"
        return "other"

    @property
    def reason(self) -> str:
        return next((d.text for d in self.directives if d.kind in ("skip", "covered-by")), "")

    @property
    def expects(self) -> list[str]:
        out: list[str] = []
        for d in self.directives:
            if d.kind == "expect":
                out += shlex.split(d.text)
        return out


def pages() -> list[Path]:
    """The README and every page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _directives(lines: list[str], fence_index: int) -> list[Directive]:
    """The ``doc-test`` comments in the lines just above a fence (up to a blank line)."""
    chunk: list[str] = []
    i = fence_index - 1
    while i >= 0 and lines[i].strip() and not FENCE.match(lines[i]):
        chunk.insert(0, lines[i])
        i -= 1
    out: list[Directive] = []
    for m in DIRECTIVE.finditer("\n".join(chunk)):
        body = m.group("body")
        if body.startswith("page-setup:"):
            continue
        name, _, rest = body.partition(" ")
        out.append(Directive(name.rstrip(":"), rest.strip()))
    return out


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order, with the directives above it."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m.group("fence")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j])
            j += 1
        out.append(
            Block(page, i + 1, m.group("lang").lower(), "\n".join(body), _directives(lines, i))
        )
        i = j + 1
    return out


def page_setup(page: Path) -> list[str]:
    """The page's setup SQL (``<!-- doc-test: page-setup: ... -->``), in order."""
    return [m.group("sql") for m in PAGE_SETUP.finditer(page.read_text())]


# --- commands ------------------------------------------------------------------------------


def commands(text: str) -> list[str]:
    """A block's commands as a shell reads them: a line continued by ``\\``, by a trailing
    ``|``, ``&&`` or ``||``, by an open quote or by a here-document is one command; comment
    lines and blank lines are none."""
    out: list[str] = []
    current: list[str] = []
    heredoc: str | None = None
    for line in text.splitlines():
        if heredoc is not None:
            current.append(line)
            if line.strip() == heredoc:
                heredoc = None
                out.append("\n".join(current))
                current = []
            continue
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        joined = "\n".join(current)
        here = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if here:
            heredoc = here.group(1)
            continue
        code = _code(joined)
        if code is None:  # an open quote: the command goes on
            continue
        if code.rstrip().endswith(("\\", "|", "&&", "||")):
            continue
        out.append(joined)
        current = []
    if current:
        out.append("\n".join(current))
    return out


def _tokens(text: str) -> list[str] | None:
    """A shell's words and operators, comments left out; None while a quote is still open."""
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        return list(lex)
    except ValueError:
        return None


def _code(command: str) -> str | None:
    """The command without its comments; None while a quote is still open."""
    tokens = _tokens(command)
    if tokens is None:
        return None
    text = " ".join(tokens)
    return text + (" \\" if command.rstrip().endswith("\\") else "")


def programs(command: str) -> Iterator[str]:
    """The program of each simple command in ``command`` (after ``&&``, ``|``, ``;``, ``(``),
    quoted text and here-documents left out."""
    code = re.sub(r"(<<-?\s*['\"]?(\w+)['\"]?).*?^\2$", r"\1", command, flags=re.S | re.M)
    tokens = _tokens(code)
    if tokens is None:
        return
    starts = True
    for token in tokens:
        if token in ("&&", "||", "|", ";", "&", "(", ")", "|&", ";;"):
            starts = True
            continue
        if starts and re.match(r"^\w+=", token):  # VAR=value before a program
            continue
        if starts and token not in ("export", "eval", "then", "do", "else", "!"):
            yield token
        starts = token in ("then", "do", "else", "!")


def streams_until_stopped(command: str) -> bool:
    """A ``cdc run`` without ``--until``: it streams until Ctrl-C."""
    code = _code(command) or command
    return bool(re.search(r"(^|[\s;&|(])(\.venv/bin/)?cdc run\b", code)) and "--until" not in code


def spark_job(command: str) -> tuple[str, list[str]] | None:
    """``(spark_jobs/<job>.py, its arguments)`` of a spark-submit line, else None."""
    code = _code(command) or command
    if "spark-submit" not in code:
        return None
    words = shlex.split(code.replace("\\\n", " ").rstrip("\\ &"))
    for i, w in enumerate(words):
        if w.startswith("spark_jobs/") and w.endswith(".py"):
            return w, words[i + 1 :]
    return None


# --- the rules ----------------------------------------------------------------------------


def lint(block: Block, activated: bool) -> list[str]:
    """What is wrong with a shell block as written (``activated``: an earlier block of the
    page ran ``source .venv/bin/activate``)."""
    problems: list[str] = []
    for command in commands(block.text):
        if ACTIVATE.search(command):
            activated = True
        for program in programs(command):
            if program in VENV_PROGRAMS and not activated:
                problems.append(
                    f"`{program}` is not on a fresh clone's PATH: write `.venv/bin/{program}` "
                    "(or `source .venv/bin/activate` first)"
                )
            if program in NOT_INSTALLED:
                problems.append(
                    f"`{program}` is not installed by the project: use {NOT_INSTALLED[program]}"
                )
        if block.kind != "run":
            continue
        first = command.strip()
        for pattern, why in NOT_IN_A_RUN_BLOCK:
            if pattern.search(first):
                problems.append(f"{why}: `{first.splitlines()[0]}` cannot run in {HARNESS}")
        if PLACEHOLDER in (_code(command) or command):
            problems.append(f"a placeholder ({PLACEHOLDER}) cannot run: `{first.splitlines()[0]}`")
    for d in block.directives:
        if d.kind == "skip" and len(d.text.split()) < 3:
            problems.append("a skip needs its reason (what this machine lacks), in words")
        if d.kind == "covered-by":
            path, _, test = d.text.partition("::")
            target = ROOT / path.strip()
            if not target.is_file():
                problems.append(f"covered-by names {path.strip()}, which does not exist")
            elif test and f"def {test.strip()}(" not in target.read_text():
                problems.append(f"covered-by names {d.text}, which is not a test in that file")
        if d.kind not in ("skip", "covered-by", "expect", "run"):
            problems.append(f"unknown directive doc-test: {d.kind}")
    return problems


def explain(block: Block, problems: list[str]) -> str:
    """The failure message: what is wrong, and the ways to fix it."""
    listed = "\n".join(f"  - {p}" for p in problems)
    return (
        f"{block.where}: this {block.lang or 'unlabelled'} block is neither runnable as "
        f"written nor marked:\n{listed}\n"
        f"Every shell block of README.md and docs/*.md is run by {HARNESS} against the local "
        "stack (commands as a user on a fresh clone types them), unless the line before its "
        "``` fence marks it:\n"
        "    <!-- doc-test: skip: <what this machine lacks: a cluster, TLS certificates, "
        "another host> -->\n"
        "    <!-- doc-test: covered-by tests/<path>.py::<test that runs these commands> -->\n"
        f"Fix the commands, or mark the block. The directives are described in {HOWTO}."
    )


def main() -> int:
    """Print each page's blocks: where, language, kind and reason."""
    for page in pages():
        found = [b for b in blocks(page) if b.shell or b.kind == "sql-run"]
        counts = {k: sum(b.kind == k for b in found) for k in ("run", "skip", "covered-by")}
        print(f"{page.relative_to(ROOT)}: {counts}")
        for b in found:
            print(f"  {b.line:4d} {b.lang:5s} {b.kind:10s} {b.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
