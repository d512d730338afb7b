"""The built wheel serves everything: it holds the browser demo, and installed into a fresh venv it
serves `GET /` from another directory through its `realtime-ming` script, and its `realtime-ming bench`
measures that server.

The wheel is built from a copy of the sources (the checkout stays clean), without build isolation
when setuptools is importable here (offline), else with it (pip fetches setuptools). The venv
borrows this interpreter's site-packages for torch and the other dependencies (`--no-deps`), so
only the package itself comes from the wheel: `--system-site-packages` alone would give it the *base*
interpreter's when this one is itself a venv (the README's setup), so a `.pth` adds this interpreter's
own site directories after the venv's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from served_cli_support import served_cli
from server_support import seconds

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


_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _venv(path: Path, wheel: Path, *, borrow: bool) -> Path:
    """A fresh venv at `path` with `wheel` installed (`--no-deps`); `borrow`: it also sees this interpreter's
    site-packages (torch and the other dependencies), after its own. Returns its bin directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *(["--system-site-packages"] if borrow else []),
                    str(path)], check=True, timeout=seconds(120))
    bindir = path / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, env=_ENV, capture_output=True, text=True).stdout.strip()
    if borrow:  # this interpreter's site directories (a venv's own, not only its base's), .pth files included
        dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
        # one line, run by `site` in a scope where a comprehension could not see `site`: hence map
        line = f"import site; list(map(site.addsitedir, {[d for d in dirs if os.path.isdir(d)]!r}))\n"
        (Path(purelib) / "zz_borrowed_site.pth").write_text(line)
    # This interpreter's pip installs into the venv (`--python`), so the venv needs none of its own.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, env=_ENV, timeout=seconds(120))
    return bindir


def test_installed_wheel_serves_the_demo_and_benchmarks_itself(wheel, tmp_path):
    """pip install <wheel> into a fresh venv; `realtime-ming serve` run elsewhere answers GET / with the demo,
    and the wheel's own `realtime-ming bench --url` measures that server: real-time paced espeak-ng turns, every
    one ok, the tables and the plots written where it was run."""
    venv = tmp_path / "venv"
    bindir = _venv(venv, wheel, borrow=True)
    python = bindir / "python"
    env = _ENV
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import realtime_ming.bench; print(realtime_ming.bench.__file__)"],
                           check=True, env=env, cwd=elsewhere, capture_output=True, text=True).stdout.strip()
    assert Path(where).resolve().is_relative_to(venv.resolve()), where

    realtime_ming = [str(bindir / "realtime-ming")]
    # The tiny model's random weights rarely say anything speakable: the thinker speaks these words instead.
    forced = "forced_reply=Sure. The weather today looks sunny. "
    with served_cli("--host", "127.0.0.1", "--hook", forced, program=realtime_ming, env=env, cwd=elsewhere,
                    start_timeout=240) as server:
        assert server.url == f"ws://127.0.0.1:{server.port}/v1/realtime"
        assert "browser demo not found" not in server.startup
        status, headers, body = server.get("/")
        assert status == 200
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert body == (WEB / "index.html").read_bytes()
        status, _, body = server.get("/js/main.js")
        assert status == 200 and body == (WEB / "js" / "main.js").read_bytes()
        if shutil.which("espeak-ng") is None:
            pytest.skip("espeak-ng not installed: the benchmark's default turns cannot be synthesised")
        bench = subprocess.run(
            [*realtime_ming, "bench", "--url", server.url, "-c", "1,2", "--turns", "1", "--warmup", "0",
             "--max-output-tokens", "8", "--max-turn-s", "1.5", "--turns-cache", str(tmp_path / "turns"),
             "--no-progress"],
            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=seconds(300))
    assert bench.returncode == 0, bench.stdout + bench.stderr
    (run,) = (elsewhere / "bench" / "out").iterdir()  # the default output folder, under the current directory
    assert f"results: {run.resolve()}" in bench.stdout
    results = json.loads((run / "results.json").read_text())
    samples = [s for level in results["levels"] for s in level["samples"]]
    assert [level["concurrency"] for level in results["levels"]] == [1, 2] and len(samples) == 3
    assert all(s["ok"] for s in samples), [s["failure"] for s in samples]
    assert results["client"]["realtime_ming"] and results["client"]["git_commit"] is None  # an installed wheel
    assert results["command"].startswith("realtime-ming bench --url ")
    summary = (run / "summary.md").read_text()
    assert "| A | 1 | 1/1 |" in summary and "| A | 2 | 2/2 |" in summary
    plots = sorted(p.name for p in run.glob("*.png"))
    assert plots == ["stages.png", "ttfa_cdf.png", "ttfa_vs_concurrency.png"]
    assert all((run / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for name in plots)


def test_installed_wheel_without_torch_fails_in_one_line(wheel, tmp_path):
    """In a venv where torch cannot be imported, `realtime-ming serve` ends with one stderr line that names
    torch and how to install it (exit status 2), not a traceback."""
    bindir = _venv(tmp_path / "venv", wheel, borrow=True)
    hidden = tmp_path / "no_torch"
    (hidden / "torch").mkdir(parents=True)  # first on the path: importing it fails as a missing torch does
    (hidden / "torch" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    env = {**_ENV, "PYTHONPATH": str(hidden)}
    run = subprocess.run([str(bindir / "realtime-ming"), "serve", "--port", "0"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=seconds(120))
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith("realtime-ming: ") and "torch" in run.stderr and "pip install" in run.stderr
