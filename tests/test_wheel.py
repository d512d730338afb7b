"""The built wheel serves everything: it holds the browser demo, and installed into a fresh venv it
serves `GET /` from another directory through its `realtime-ming` script.

The wheel is built from a copy of the sources (the checkout stays clean), without build isolation
when setuptools is importable here (offline), else with it (pip fetches setuptools). The venv
borrows this interpreter's site-packages for torch and the other dependencies (`--no-deps`), so
only the package itself comes from the wheel.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from server_support import seconds, served_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
WEB = REPO / "realtime_ming" / "web"


def _web_files() -> set[str]:
    """The demo's files as wheel member names."""
    return {
        path.relative_to(REPO).as_posix()
        for path in WEB.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of pyproject.toml, README.md and realtime_ming/."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "realtime_ming", src / "realtime_ming",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    dist = work / "dist"
    # "./src", not "src": pip reads a bare word as a project name on the index.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(dist), f".{os.sep}src"],
        cwd=work, check=True, timeout=seconds(300),
    )
    (built,) = dist.glob("realtime_ming-*.whl")
    return built


def test_wheel_holds_the_browser_demo(wheel):
    """Every file of realtime_ming/web/ is in the wheel, next to the package's code and assets."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        index = archive.read("realtime_ming/web/index.html")
    web = _web_files()
    assert "realtime_ming/web/index.html" in web and "realtime_ming/web/js/main.js" in web
    assert web <= names, sorted(web - names)
    assert index == (WEB / "index.html").read_bytes()
    assert "realtime_ming/server/http.py" in names


def test_installed_wheel_serves_the_demo_from_another_directory(wheel, tmp_path):
    """pip install <wheel> into a fresh venv; `realtime-ming serve` run elsewhere answers GET / with the demo,
    and `realtime-ming bench` says in one line where the benchmark is."""
    venv = tmp_path / "venv"
    # --without-pip: this interpreter's pip (seen through --system-site-packages) installs into the venv.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=seconds(120))
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, env=env, timeout=seconds(120))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import realtime_ming; print(realtime_ming.__file__)"],
                           check=True, env=env, cwd=elsewhere, capture_output=True, text=True).stdout.strip()
    assert Path(where).resolve().is_relative_to(venv.resolve()), where

    realtime_ming = [str(bindir / "realtime-ming")]
    with served_cli("--host", "127.0.0.1", program=realtime_ming, env=env, cwd=elsewhere, start_timeout=240) as server:
        assert server.url == f"ws://127.0.0.1:{server.port}/v1/realtime"
        assert "browser demo not found" not in server.startup
        status, headers, body = server.get("/")
        assert status == 200
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert body == (WEB / "index.html").read_bytes()
        status, _, body = server.get("/js/main.js")
        assert status == 200 and body == (WEB / "js" / "main.js").read_bytes()
        # The benchmark lives in the checkout: the installed script says so in one line.
        bench = subprocess.run([*realtime_ming, "bench", "--url", f"ws://127.0.0.1:{server.port}"],
                               cwd=elsewhere, env=env, capture_output=True, text=True, timeout=seconds(60))
        assert bench.returncode == 2 and bench.stdout == ""
        assert len(bench.stderr.splitlines()) == 1 and "python -m bench" in bench.stderr, bench.stderr
