"""The package's sub-packages form layers: none imports another that imports it back, counting
every import statement wherever it stands (inside functions too, which a checker reading only
module-level imports misses), so each can be read, tested and replaced from the bottom up. The
same holds inside a sub-package that has sub-packages of its own (`bwprune.vllm`)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bwprune"


def imported_subpackages(path: Path, package: Path = PACKAGE) -> set[str]:
    """The sub-packages of `package` (`bwprune/` or a folder in it) that the module at `path`
    imports, anywhere in it."""
    prefix = package.relative_to(PACKAGE.parent).parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = tuple(name.split("."))
            depth = len(prefix)
            if parts[:depth] == prefix and len(parts) > depth and (package / parts[depth]).is_dir():
                found.add(parts[depth])
    return found


def subpackage_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Sub-package of `package` -> the other sub-packages of it that its modules import."""
    graph: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).parts
        if len(parts) > 1:  # a module of a sub-package, not package/*.py (they compose)
            graph.setdefault(parts[0], set()).update(
                imported_subpackages(path, package) - {parts[0]}
            )
    return graph


def layered_packages() -> list[Path]:
    """`bwprune/` and every package in it that has sub-packages of its own."""
    nested = (d for d in PACKAGE.rglob("*") if d.is_dir() and any(d.glob("*/__init__.py")))
    return [PACKAGE, *sorted(nested)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_cycles_are_found_through_imports_inside_functions(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from bwprune.vllm.running.runner import x\n    import bwprune.runs"
    )
    assert imported_subpackages(module) == {"vllm", "runs"}


def test_nested_subpackages_are_nodes_of_their_parent(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from bwprune.vllm.binding.host import x\nimport bwprune.vllm.running\n")
    assert imported_subpackages(module, PACKAGE / "vllm") == {"binding", "running"}
    assert PACKAGE / "vllm" in layered_packages()


def test_no_subpackage_imports_one_that_imports_it_back():
    for package in layered_packages():
        assert cycles(subpackage_graph(package)) == [], package


def test_vllm_binding_builds_on_neither_running_nor_serving():
    """What vLLM loads into a worker (the model plugin) needs the binding alone."""
    graph = subpackage_graph(PACKAGE / "vllm")
    assert graph["binding"] == set()
    assert graph["running"] <= {"binding"}
