"""Every shell block of README.md and docs/*.md is run by the docs harness or marked with a
reason (tests/docs_blocks.py says how); the rules hold for a new block as well."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import docs_blocks
from tests.docs_blocks import Block, blocks, commands, lint, programs

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("page", docs_blocks.pages(), ids=lambda p: p.name)
def test_every_block_is_runnable_or_marked(page: Path) -> None:
    activated = False
    for block in blocks(page):
        assert block.lang, (
            f"{block.where}: label the fence (```sh for commands, ```text for output or "
            "config): an unlabelled block could hide a shell block the harness never sees"
        )
        if not block.shell:
            continue
        problems = lint(block, activated)
        assert not problems, docs_blocks.explain(block, problems)
        activated = activated or any(docs_blocks.ACTIVATE.search(c) for c in commands(block.text))


def _page(tmp_path: Path, text: str) -> list[Block]:
    page = tmp_path / "page.md"
    page.write_text(text)
    return blocks(page)


def _problems(tmp_path: Path, text: str) -> list[str]:
    (block,) = [b for b in _page(tmp_path, text) if b.shell]
    return lint(block, activated=False)


def test_a_new_block_that_cannot_run_must_be_marked(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "Build it:\n\n```sh\nmake bench\nscripts/stack down\n```\n")
    assert any("`make` targets" in p for p in problems)
    assert any("stops the shared servers" in p for p in problems)
    marked = "<!-- doc-test: skip: a long benchmark of its own -->\n```sh\nmake bench\n```\n"
    assert _problems(tmp_path, marked) == []
    (block,) = _page(tmp_path, marked)
    assert (block.kind, block.reason) == ("skip", "a long benchmark of its own")
    message = docs_blocks.explain(block, ["x"])
    assert "<!-- doc-test: skip:" in message and "covered-by" in message


def test_commands_are_written_as_on_a_fresh_clone(tmp_path: Path) -> None:
    text = "```sh\ncdc run --until current && .venv/bin/cdc status\n```\n"
    assert any("`.venv/bin/cdc`" in p for p in _problems(tmp_path, text))
    kcat = "```sh\necho x |\n  kcat -P -b 127.0.0.1:19092 -t t\n```\n"
    assert any("cdc topic send" in p for p in _problems(tmp_path, kcat))
    activated = "```sh\nsource .venv/bin/activate\ncdc status\n```\n"
    assert _problems(tmp_path, activated) == []


def test_placeholders_and_missing_reasons_and_tests(tmp_path: Path) -> None:
    assert _problems(tmp_path, "```sh\nexport CDC_KAFKA__SASL_PASSWORD=…\n```\n")
    assert _problems(tmp_path, "<!-- doc-test: skip: no -->\n```sh\nmake x\n```\n")
    gone = "<!-- doc-test: covered-by tests/nowhere.py -->\n```sh\nmake x\n```\n"
    assert any("does not exist" in p for p in _problems(tmp_path, gone))
    here = "<!-- doc-test: covered-by tests/docs_blocks.py::no_such_test -->\n```sh\nls\n```\n"
    assert any("not a test" in p for p in _problems(tmp_path, here))


def test_commands_as_a_shell_reads_them() -> None:
    text = """
# a comment line
eval "$(scripts/stack env)"   # a trailing comment
psql "$DSN" -c "INSERT INTO t VALUES ('1',
   'two lines')"
echo x |
  .venv/bin/cdc topic send t
.venv/bin/python - <<'EOF'
print("a | b && c")
EOF
.venv/bin/cdc run &
scripts/spark-submit --master local[2] \\
    spark_jobs/cache_sync.py --available-now
"""
    found = commands(text)
    assert len(found) == 6, found
    assert found[1].endswith("'two lines')\"")
    assert list(programs(found[2])) == ["echo", ".venv/bin/cdc"]
    assert list(programs(found[3])) == [".venv/bin/python"]
    assert docs_blocks.streams_until_stopped(found[4])
    assert not docs_blocks.streams_until_stopped(".venv/bin/cdc run --until current")
    assert docs_blocks.spark_job(found[5]) == ("spark_jobs/cache_sync.py", ["--available-now"])


def test_directives_and_page_setup(tmp_path: Path) -> None:
    text = (
        "<!-- doc-test: page-setup: CREATE TABLE t (id int PRIMARY KEY) -->\n\n"
        "Check it:\n"
        '<!-- doc-test: expect "all checks passed" "ok" -->\n'
        "```sh\n.venv/bin/cdc config check\n```\n\n"
        "<!-- doc-test: run -->\n```sql\nSELECT 1;\n```\n"
    )
    shell, sql = _page(tmp_path, text)
    assert shell.kind == "run" and shell.expects == ["all checks passed", "ok"]
    assert sql.kind == "sql-run"
    assert docs_blocks.page_setup(tmp_path / "page.md") == ["CREATE TABLE t (id int PRIMARY KEY)"]
