"""Lazy package exports (PEP 562): a package names where each public name lives, and the module is
imported on first use, so importing a light submodule (a config, the startup checks) does not load
torch and every model module."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[list[str], Callable[[str], object], Callable[[], list[str]]]:
    """`(__all__, __getattr__, __dir__)` for `package`, whose public names live in the relative modules `where`."""
    names = sorted(where)

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    def __dir__() -> list[str]:
        return names

    return names, __getattr__, __dir__
