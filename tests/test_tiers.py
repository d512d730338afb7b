"""The two test tiers stay consistent: what needs chromium is marked `browser`, what starts Ray is marked `ray`
(both left out of the fast tier), and the fast tier's module check (tests/tier_support.py) sees every module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from tier_support import FULL_TIER_ONLY, package_modules

TESTS = Path(__file__).resolve().parent


def _imports(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _module_marks(tree: ast.Module) -> set[str]:
    """The marker names of the module-level `pytestmark`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}
    return set()


@pytest.mark.parametrize("path", sorted(TESTS.glob("test_*.py")), ids=lambda p: p.name)
def test_browser_and_ray_tests_are_marked(path: Path):
    tree = ast.parse(path.read_text())
    imported, marks = _imports(tree), _module_marks(tree)
    if imported & {"browser_support", "playwright"}:
        assert "browser" in marks, f"{path.name} drives chromium: pytestmark needs pytest.mark.browser"
    serves_replicas = path.name != "test_tiers.py" and re.search(r"realtime_ming\.cluster\.replica\b", path.read_text())
    if "ray" in imported or serves_replicas:
        assert "ray" in marks, f"{path.name} starts Ray: pytestmark needs pytest.mark.ray"


def test_module_check_lists_the_package():
    """tier_support's list is the package's modules (subpackages and plain modules, no `__main__`)."""
    modules = package_modules()
    assert {"realtime_ming", "realtime_ming.engine", "realtime_ming.engine.api", "realtime_ming.cli"} <= modules
    assert not any(name.endswith("__main__") for name in modules)
    assert FULL_TIER_ONLY <= modules, FULL_TIER_ONLY - modules  # a gap that no longer exists is removed from the list
