"""The OpenAI Agents JS SDK (`@openai/agents-realtime`, from npm) bundled for a browser page.

`agents_bundle()` installs the pinned package (with zod and esbuild) into a cache folder under the temp dir and
bundles it once into one IIFE script that sets `window.AgentsRealtime = {OpenAIRealtimeWebRTC, RealtimeAgent,
RealtimeSession, tool, z}`; later runs reuse it. A test is skipped only when node or npm is not installed
(named); an npm registry that does not answer fails the test, as a broken client would.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

__all__ = ["AGENTS_REALTIME_VERSION", "agents_bundle"]

AGENTS_REALTIME_VERSION = "0.20.0"
_PACKAGES = (f"@openai/agents-realtime@{AGENTS_REALTIME_VERSION}", "zod@4", "esbuild@0.25")
_ENTRY = """import { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession, tool } from "@openai/agents-realtime";
import { z } from "zod";
window.AgentsRealtime = { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession, tool, z };
"""


def agents_bundle() -> Path:
    """The bundled SDK script (built on first use, cached in the temp dir)."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: the Agents JS SDK test needs Node.js and npm (apt-get install -y nodejs npm)")
    folder = Path(tempfile.gettempdir()) / f"realtime-ming-agents-js-{AGENTS_REALTIME_VERSION}"
    folder.mkdir(exist_ok=True)
    bundle = folder / "bundle.js"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (parallel test runs)
        if not bundle.is_file():
            (folder / "package.json").write_text('{"name": "agents-bundle", "private": true}\n')
            (folder / "entry.mjs").write_text(_ENTRY)
            _run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", *_PACKAGES], folder)
            _run([str(folder / "node_modules" / ".bin" / "esbuild"), "entry.mjs", "--bundle", "--format=iife",
                  "--platform=browser", "--log-level=warning", "--outfile=bundle.tmp.js"], folder)
            (folder / "bundle.tmp.js").replace(bundle)
    return bundle


def _run(command: list[str], folder: Path) -> None:
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command[:3])} failed ({done.returncode}):\n{done.stderr[-2000:]}")
