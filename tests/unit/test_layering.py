"""The package's sub-packages form layers: none imports another that imports it back, counting
every import statement wherever it stands (inside functions too, which a checker reading only
module-level imports misses), so each can be read, tested and replaced from the bottom up."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bwprune"


def imported_subpackages(path: Path) -> set[str]:
    """The sub-packages of `bwprune` that the module at `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "bwprune" and len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
                found.add(parts[1])
    return found


def subpackage_graph() -> dict[str, set[str]]:
    """Sub-package -> the other sub-packages its modules import."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) > 1:  # a module of a sub-package, not bwprune/*.py (they compose)
            graph.setdefault(parts[0], set()).update(imported_subpackages(path) - {parts[0]})
    return graph


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
    module.write_text("def f():\n    from bwprune.vllm.runner import x\n    import bwprune.runs\n")
    assert imported_subpackages(module) == {"vllm", "runs"}


def test_no_subpackage_imports_one_that_imports_it_back():
    assert cycles(subpackage_graph()) == []
