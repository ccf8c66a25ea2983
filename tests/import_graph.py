"""The project's import graph, read from the source text (nothing is imported or run).

Used by ``tests/unit/test_import_graph.py`` to hold the layering: the shared kernel
``pgcdc.core`` imports nothing of ours, no two packages import each other (directly or
through others), no module cycle exists inside a package, and no package reaches into
another's private names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Units of the package graph: a top-level package, except that the kernel and the stack
# tooling inside ``pgcdc`` are units of their own.
SPLIT_PACKAGES = ("pgcdc.core", "pgcdc.stack", "pgcdc.verify")


@dataclass(frozen=True)
class Edge:
    importer: str  # module name
    imported: str  # module name (best effort: ``from a import b`` gives ``a.b`` if a.b exists)
    names: tuple[str, ...]
    line: int


@dataclass
class ImportGraph:
    modules: dict[str, Path] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    def unit(self, module: str) -> str:
        """The package-graph unit a module belongs to."""
        for split in SPLIT_PACKAGES:
            if module == split or module.startswith(split + "."):
                return split
        return module.split(".")[0]

    def package_edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {self.unit(m): set() for m in self.modules}
        for e in self.edges:
            a, b = self.unit(e.importer), self.unit(e.imported)
            if a != b:
                out.setdefault(a, set()).add(b)
        return out

    def module_edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for e in self.edges:
            if e.imported in self.modules and e.imported != e.importer:
                out[e.importer].add(e.imported)
        return out

    def private_imports(self) -> list[Edge]:
        """Imports of an underscore name that belongs to another package unit."""
        return [
            e
            for e in self.edges
            if self.unit(e.importer) != self.unit(e.imported)
            and (
                any(n.startswith("_") and not n.startswith("__") for n in e.names)
                or any(p.startswith("_") and not p.startswith("__") for p in e.imported.split("."))
            )
        ]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, *([target] if target else [])])


def read_graph(root: Path, packages: Iterable[str]) -> ImportGraph:
    """Every import statement (at any depth, lazy ones too) of the given top-level packages."""
    graph = ImportGraph()
    files: list[Path] = []
    for pkg in packages:
        files.extend(sorted((root / pkg).rglob("*.py")))
    for path in files:
        graph.modules[_module_name(root, path)] = path
    ours = {m.split(".")[0] for m in graph.modules}
    for path in files:
        module = _module_name(root, path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in ours:
                        graph.edges.append(Edge(module, alias.name, (), node.lineno))
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, path.name == "__init__.py", node.level, node.module)
                if target.split(".")[0] not in ours:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    imported = sub if sub in graph.modules else target
                    names = () if sub in graph.modules else (alias.name,)
                    graph.edges.append(Edge(module, imported, names, node.lineno))
    return graph


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)
