"""The import graph of the `realtime_ming` package has no cycle, and model kernels import one way.

Built from the source with `ast` (nothing is imported): every `import` statement, at module level or
inside a function (a lazy import still ties two modules together), is an edge from the importing
module to the module it names (`from pkg import sub` names `pkg.sub` when that is a module). Imports
under `if TYPE_CHECKING:` are left out: they never run, they only name types for annotations.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "realtime_ming"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
KERNELS = f"{PACKAGE}.model.kernels"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node of `tree`, except those under `if TYPE_CHECKING:`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif _is_type_checking(node):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of this package it imports (anywhere in its source)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                origin = _resolve(name, path.name == "__init__.py", node)
                targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_graph_sees_the_package():
    """The walk finds the package's modules and their real edges (a graph of nothing would pass anything)."""
    graph = import_graph()
    assert f"{PACKAGE}.model.thinker" in graph and f"{PACKAGE}.engine.models" in graph
    assert f"{PACKAGE}.model.config" in graph[f"{PACKAGE}.model.thinker"]
    assert sum(map(len, graph.values())) > 100


def test_type_checking_imports_are_left_out():
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
                     "def f():\n    from d import e\n")
    assert sorted(n.names[0].name if isinstance(n, ast.Import) else n.module for n in _imports(tree)) == ["a", "c", "d"]


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_realtime_ming_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_kernels_import_no_model_module():
    """Model code imports kernels, never the other way: `model/kernels` imports only itself (and outside libraries)."""
    graph = import_graph()
    kernels = [m for m in graph if m == KERNELS or m.startswith(KERNELS + ".")]
    if not kernels:
        pytest.fail(f"{KERNELS} not found")
    bad = {m: sorted(t for t in graph[m] if not (t == KERNELS or t.startswith(KERNELS + "."))) for m in kernels}
    assert not {m: t for m, t in bad.items() if t}, bad
