"""Rewrite .whl/silero_vad-*.whl keeping only what the server loads (`silero_vad/data/silero_vad.onnx`).

The wheel ships eight model variants (11 MB); the device tool sends at most 64 MiB per call, the repository
included, so the carried copy keeps only the ONNX model `realtime_ming.audio.vad.silero_model_path` opens
(2 MB). The RECORD file is rewritten to match, so pip installs the result like the original.

    python3 bench/slim_silero_wheel.py [.whl]
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

KEEP_DATA = {"silero_vad/data/silero_vad.onnx", "silero_vad/data/__init__.py"}


def slim(wheel: Path) -> tuple[int, int]:
    """Rewrite `wheel` in place; returns (bytes before, bytes after)."""
    before = wheel.stat().st_size
    with zipfile.ZipFile(wheel) as src:
        names = [n for n in src.namelist() if not n.startswith("silero_vad/data/") or n in KEEP_DATA]
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        kept = set(names)
        lines = [line for line in src.read(record).decode().splitlines() if line.split(",")[0] in kept]
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for name in names:
                data = "\n".join(lines).encode() + b"\n" if name == record else src.read(name)
                dst.writestr(src.getinfo(name), data)
    tmp.replace(wheel)
    return before, wheel.stat().st_size


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else ".whl")
    wheels = sorted(folder.glob("silero_vad-*.whl"))
    if not wheels:
        print(f"no silero_vad wheel in {folder}", file=sys.stderr)
        return 1
    for wheel in wheels:
        before, after = slim(wheel)
        print(f"{wheel.name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
