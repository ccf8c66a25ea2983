"""The layering holds: the kernel imports nothing of ours and no import cycles exist.

The checker is tested first on synthetic trees, so a pass on the real tree means something.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import cycles, read_graph

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pgcdc", "cdc", "schemas", "sinks", "spark_jobs", "benchmarks", "demo")
# Who may import whom (besides itself). Tooling (benchmarks, demo) may import anything.
ALLOWED: dict[str, set[str]] = {
    "pgcdc.core": set(),
    "pgcdc.stack": {"pgcdc.core"},
    "pgcdc": {"pgcdc.core"},
    "schemas": {"pgcdc", "pgcdc.core"},
    "cdc": {"pgcdc", "pgcdc.core", "schemas"},
    "sinks": {"pgcdc.core"},
    "spark_jobs": {"pgcdc.core", "sinks", "schemas"},
    # `cdc verify`'s logic: reads the followers through the sinks and renders rows with the
    # jobs' converter; PostgreSQL's side is cdc.verify_leader, wired in by cdc.cli.
    "pgcdc.verify": {"pgcdc.core", "sinks", "schemas", "spark_jobs"},
}
# Entry points wire the parts together: `cdc status` shows the followers' watermarks too, and
# `cdc verify` joins PostgreSQL's reader (cdc) with the followers' (pgcdc.verify).
ENTRY_POINTS = {"cdc.cli"}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_finds_a_package_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "a/__init__.py": "",
            "a/x.py": "from b.y import thing\n",
            "b/__init__.py": "",
            "b/y.py": "def thing():\n    from a import x\n    return x\n",
            "c/__init__.py": "from a.x import thing\n",
        },
    )
    graph = read_graph(tmp_path, ["a", "b", "c"])
    assert cycles(graph.package_edges()) == [["a", "b"]]
    assert graph.package_edges()["c"] == {"a"}


def test_checker_finds_a_module_cycle_and_relative_imports(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/one.py": "from . import two\n",
            "p/two.py": "from .three import f\n",
            "p/three.py": "from p.one import g\n",
            "p/four.py": "import p.one\n",
        },
    )
    graph = read_graph(tmp_path, ["p"])
    assert cycles(graph.module_edges()) == [["p.one", "p.three", "p.two"]]
    assert cycles(graph.package_edges()) == []


def test_checker_finds_private_names_across_packages(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "a/__init__.py": "",
            "a/x.py": "_hidden = 1\n",
            "a/_impl.py": "",
            "b/__init__.py": "",
            "b/y.py": "from a.x import _hidden\nfrom a import _impl\nfrom .z import _ok\n",
            "b/z.py": "_ok = 1\n",
        },
    )
    graph = read_graph(tmp_path, ["a", "b"])
    found = sorted((e.importer, e.imported, e.names) for e in graph.private_imports())
    assert found == [("b.y", "a._impl", ()), ("b.y", "a.x", ("_hidden",))]


def test_no_cycle_between_packages() -> None:
    graph = read_graph(ROOT, PACKAGES)
    assert cycles(graph.package_edges()) == []


def test_packages_import_only_what_their_layer_allows() -> None:
    graph = read_graph(ROOT, PACKAGES)
    edges = graph.package_edges()
    assert set(ALLOWED) <= set(edges), "a package of the layering is missing from the tree"
    wrong = {
        (a, b)
        for a, targets in edges.items()
        if a in ALLOWED
        for b in targets
        if b not in ALLOWED[a]
    }
    where = [
        f"{e.importer}:{e.line} imports {e.imported}"
        for e in graph.edges
        if (graph.unit(e.importer), graph.unit(e.imported)) in wrong
        and e.importer not in ENTRY_POINTS
    ]
    assert not where, "\n".join(where)


def test_no_module_cycle_inside_a_package() -> None:
    graph = read_graph(ROOT, PACKAGES)
    assert cycles(graph.module_edges()) == []


def test_no_package_imports_another_packages_private_names() -> None:
    graph = read_graph(ROOT, PACKAGES)
    bad = [f"{e.importer}:{e.line} {e.imported} {e.names}" for e in graph.private_imports()]
    assert not bad, "\n".join(bad)
