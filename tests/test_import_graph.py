"""The import graph of the `realtime_ming` package: no cycle, and the layers import one way.

Built from the source with `ast` (nothing is imported): every `import` statement, at module level or
inside a function (a lazy import still ties two modules together), is an edge from the importing
module to the module it names (`from pkg import sub` names `pkg.sub` when that is a module). Imports
under `if TYPE_CHECKING:` count too: a type named across a boundary couples the two modules as much as a
call does (a circle drawn only through annotations is still a circle to whoever reads or splits the code).

The rules (README "Layout"): no cycle; `model/kernels` imports no other model module;
`session/` reaches the engine only through `engine/api.py` and never imports `model/`; `server/` reaches
`model/` only through `model/checkpoint_check.py` (the start-up checks).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "realtime_ming"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
KERNELS = f"{PACKAGE}.model.kernels"
ENGINE_API = f"{PACKAGE}.engine.api"
CHECKPOINT_CHECK = f"{PACKAGE}.model.checkpoint_check"


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


def _imports(tree: ast.AST, type_checking: bool = True):
    """Every Import / ImportFrom node of `tree`; those under `if TYPE_CHECKING:` only with `type_checking`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif _is_type_checking(node) and not type_checking:
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


@functools.cache
def import_graph(type_checking: bool = True) -> dict[str, set[str]]:
    """module -> the modules of this package it imports (anywhere in its source; under `if TYPE_CHECKING:` too
    unless `type_checking` is False). Cached: do not mutate it."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path)), type_checking):
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


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _imports_of(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """module of `package` -> the modules outside it that it imports."""
    return {m: {t for t in targets if not _under(t, package)} for m, targets in graph.items() if _under(m, package)}


def test_the_graph_sees_the_package():
    """The walk finds the package's modules and their real edges (a graph of nothing would pass anything): known
    imports of each layer the rules below look at, one of them only under TYPE_CHECKING, one a lazy import."""
    graph = import_graph()
    assert f"{PACKAGE}.model.thinker" in graph and f"{PACKAGE}.engine.models" in graph
    assert f"{PACKAGE}.model.config" in graph[f"{PACKAGE}.model.thinker"]
    assert sum(map(len, graph.values())) > 100
    assert ENGINE_API in graph[f"{PACKAGE}.session.lifecycle"]  # session -> engine, through its API
    assert f"{PACKAGE}.session.lifecycle" in graph[f"{PACKAGE}.session.session"]  # session's own objects
    assert CHECKPOINT_CHECK in graph[f"{PACKAGE}.server.startup"]  # a lazy import, inside a function
    assert f"{PACKAGE}.model.talker" in graph[ENGINE_API]  # only under TYPE_CHECKING (a cloned voice's prompt)
    assert f"{PACKAGE}.model.talker" not in import_graph(type_checking=False)[ENGINE_API]


def test_type_checking_imports_count_unless_asked_not_to():
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
                     "def f():\n    from d import e\n")

    def names(nodes):
        return sorted(n.names[0].name if isinstance(n, ast.Import) else n.module for n in nodes)

    assert names(_imports(tree)) == ["a", "b", "c", "d"]
    assert names(_imports(tree, type_checking=False)) == ["a", "c", "d"]


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_realtime_ming_has_no_import_cycle():
    """No circle, TYPE_CHECKING edges included."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_session_reaches_the_engine_only_through_its_api_and_never_the_model():
    """session/ is the sans-I/O state machine over `engine/api.py`: no engine internals, no model module (what it
    shares with them, the API re-exports)."""
    outside = _imports_of(import_graph(), f"{PACKAGE}.session")
    assert outside, "session/ not found"
    bad = {m: sorted(t for t in targets if (_under(t, f"{PACKAGE}.engine") and t != ENGINE_API)
                     or _under(t, f"{PACKAGE}.model")) for m, targets in outside.items()}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"session/ imports engine internals or model/: {bad}"


def test_the_server_reaches_the_model_only_through_the_checkpoint_checks():
    """server/ loads no model module itself: its start-up checks go through one entry point."""
    outside = _imports_of(import_graph(), f"{PACKAGE}.server")
    assert outside, "server/ not found"
    bad = {m: sorted(t for t in targets if _under(t, f"{PACKAGE}.model") and t != CHECKPOINT_CHECK)
           for m, targets in outside.items()}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"server/ imports model/ past {CHECKPOINT_CHECK}: {bad}"


def test_the_layer_rules_catch_a_planted_edge(monkeypatch):
    """The layer rules fail on the edges they forbid (each planted in a copy of the real graph)."""
    real = import_graph()
    for module, target, rule in [
        (f"{PACKAGE}.session.lifecycle", f"{PACKAGE}.engine.engine",
         test_the_session_reaches_the_engine_only_through_its_api_and_never_the_model),
        (f"{PACKAGE}.session.content", f"{PACKAGE}.model.image_processing",
         test_the_session_reaches_the_engine_only_through_its_api_and_never_the_model),
        (f"{PACKAGE}.server.startup", f"{PACKAGE}.model.loader",
         test_the_server_reaches_the_model_only_through_the_checkpoint_checks),
        (f"{PACKAGE}.session.items", f"{PACKAGE}.session.session", test_realtime_ming_has_no_import_cycle),
    ]:
        planted = {m: set(t) for m, t in real.items()}
        planted[module].add(target)
        monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda type_checking=True, g=planted: g)
        with pytest.raises(AssertionError):
            rule()
        monkeypatch.undo()


def test_kernels_import_no_model_module():
    """Model code imports kernels, never the other way: `model/kernels` imports only itself (and outside libraries)."""
    graph = import_graph()
    kernels = [m for m in graph if m == KERNELS or m.startswith(KERNELS + ".")]
    if not kernels:
        pytest.fail(f"{KERNELS} not found")
    bad = {m: sorted(t for t in graph[m] if not (t == KERNELS or t.startswith(KERNELS + "."))) for m in kernels}
    assert not {m: t for m, t in bad.items() if t}, bad


def test_the_engine_api_and_the_checkpoint_checks_load_no_torch():
    """What the session and the start-up checks import stays light: a front-end process and a failed start never
    pay for torch (or Pillow) by importing them."""
    code = ("import sys, realtime_ming.engine.api, realtime_ming.model.checkpoint_check, realtime_ming.session.session\n"
            "print(sorted(m for m in ('torch', 'PIL') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
