"""The fast tier covers every module: after a plain `pytest` (the whole fast tier: pyproject's testpaths and
marker selection, nothing narrowed) every `realtime_ming` module must have been imported by its tests, in this
process or, under pytest-xdist, in one of the workers. Narrowed runs (files, -k, --lf, other markers, -x) are not
checked; REALTIME_MING_CHECK_MODULES=1 checks any run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "realtime_ming"
KEY = "realtime_ming_modules"
# Modules that only full-tier tests (or server processes the fast tier starts) import: each is a known gap of the
# fast tier, named here so that a new one fails the run. Remove a name once a fast test imports the module.
FULL_TIER_ONLY = {
    "realtime_ming.cluster.registry",  # Ray Serve replicas (tests/test_cluster.py, marker ray)
    "realtime_ming.rtc.call",  # WebRTC calls: aiortc clients (slow) and chromium (browser)
    "realtime_ming.rtc.media",
    "realtime_ming.server.frontend_process",  # front-end processes: imported in the served process only
    "realtime_ming.server.frontends",
    "realtime_ming.session.mcp_client",  # a real MCP server over HTTP (slow)
}


def package_modules() -> set[str]:
    """Every module of the package, from its files (`__main__` entry points are run, not imported)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imported_modules() -> set[str]:
    return {name for name in sys.modules if name == "realtime_ming" or name.startswith("realtime_ming.")}


def whole_fast_tier(config: pytest.Config) -> bool:
    """True when this run is the plain `pytest` of the README: the fast tier, every file, nothing narrowed."""
    if os.environ.get("REALTIME_MING_CHECK_MODULES") == "1":
        return True
    addopts = config.getini("addopts")
    default_markers = addopts[addopts.index("-m") + 1] if "-m" in addopts else ""
    narrowing = ("keyword", "deselect", "maxfail", "lf", "failedfirst", "ignore", "ignore_glob")
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS and config.option.markexpr == default_markers
            and not any(getattr(config.option, name, None) for name in narrowing))


def report_missing(session: pytest.Session, imported: set[str]) -> None:
    """Fail the session (listing them) when a package module was imported by no test of the run."""
    missing = sorted(package_modules() - imported - FULL_TIER_ONLY)
    if not missing or session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("=", f"fast tier: {len(missing)} realtime_ming module(s) imported by no test", red=True)
        for name in missing:
            reporter.write_line(f"  {name}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
