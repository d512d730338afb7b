"""The repository is self-contained: nothing cites documents or paths outside it, and every relative
link in the README and docs/ resolves to a file of the repository (issue 22)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("realtime_ming", "tests", "bench", "docs", "web", "configs", "examples", "README.md")
# The names of reference documents that only existed beside the repository, and the folder that held
# them and the golden fixtures. Spelled in pieces so that this file does not match itself.
FORBIDDEN = re.compile(
    "|".join(("shared" + "/", "ming_model" + ".md", "realtime_protocol" + ".md", "style" + ".md",
              "peers_and" + "_targets", "engine" + "_layout")).replace(".", r"\.").encode()
)
SKIPPED_PARTS = {"__pycache__", ".pytest_cache", "node_modules"}
# [text](target) and ![alt](target), and reference definitions `[label]: target`.
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _repo_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files under SCANNED (what a clone has), else a walk."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SCANNED],
                             cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
        paths = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        paths = [p for name in SCANNED for p in ((ROOT / name).rglob("*") if (ROOT / name).is_dir() else [ROOT / name])]
    return sorted(p for p in paths if p.is_file() and not SKIPPED_PARTS & set(p.relative_to(ROOT).parts))


def test_nothing_refers_outside_the_repository():
    files = _repo_files()
    assert any(p.name == "README.md" and p.parent == ROOT for p in files)
    hits = []
    for path in files:
        data = path.read_bytes()
        for m in FORBIDDEN.finditer(data):
            line = data.count(b"\n", 0, m.start()) + 1
            hits.append(f"{path.relative_to(ROOT)}:{line}: {m.group().decode()}")
    assert not hits, "references to documents or paths outside the repository:\n" + "\n".join(hits)


def test_forbidden_pattern_catches_what_it_should():
    for text in ("see ../" "shared" "/fixtures", "ming_model" ".md §1.4", "realtime_protocol" ".md §3",
                 "style" ".md §6.12", "peers_and" "_targets §5.1", "engine" "_layout.md"):
        assert FORBIDDEN.search(text.encode()), text
    for text in ("docs/model.md §1.4", "docs/protocol.md §3", "shared experts", "shared_experts"):
        assert not FORBIDDEN.search(text.encode()), text


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _relative_links(text: str) -> list[str]:
    text = FENCE.sub("", text)  # links inside code blocks are examples, not links
    targets = INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_markdown_links_resolve(doc: Path):
    assert doc.is_file(), doc
    broken = []
    for target in _relative_links(doc.read_text(encoding="utf-8")):
        rel = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (doc.parent / rel).resolve()
        if not resolved.exists() or ROOT.resolve() not in (resolved, *resolved.parents):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: links to missing files or outside the repository: {broken}"


def test_link_parser_finds_relative_links():
    text = "[a](docs/model.md) ![b](docs/screenshot.png \"t\") [c](https://x.y/z) [d](#top)\n[e]: bench/README.md\n"
    assert _relative_links(text) == ["docs/model.md", "docs/screenshot.png", "bench/README.md"]


MAX_TRACKED_BYTES = 10 << 20  # the largest source asset, the smart-turn ONNX model, is 8.7 MB


def test_no_build_output_or_large_binary_is_tracked():
    """Build outputs carried to GPU machines (.whl, .raypack, .turns, bench/out) and bench results' raw files stay
    out of git: nothing tracked is ignored by .gitignore or larger than MAX_TRACKED_BYTES (a clone pays for every
    tracked byte forever)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
        ignored = subprocess.run(["git", "ls-files", "-z", "--cached", "--ignored", "--exclude-standard"], cwd=ROOT,
                                 capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"not a git checkout: {exc}")
    tracked = [p for p in listed.stdout.decode().split("\0") if p]
    assert tracked, "git lists no tracked file"
    assert [p for p in ignored.stdout.decode().split("\0") if p] == []
    large = [(p, (ROOT / p).stat().st_size) for p in tracked
             if (ROOT / p).is_file() and (ROOT / p).stat().st_size > MAX_TRACKED_BYTES]
    assert large == []
