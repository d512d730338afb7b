"""Rewrite carried wheels in .whl/ keeping only the files the server loads.

The device tool sends at most 64 MiB per call, the repository included. Two wheels ship data the server never
opens: silero_vad (eight model variants, 11 MB; the server opens only the ONNX model
`realtime_ming.audio.vad.silero_model_path` loads, 2 MB) and pocketsphinx (29 MB, of which 28 MB are the n-gram
language models; the stop-command reader `realtime_ming.audio.commands` decodes with a JSGF grammar and `lm=None`,
so only the acoustic model and the pronunciation dictionary are read). The RECORD file is rewritten to match, so
pip installs the result like the original.

    python3 bench/slim_wheels.py [.whl]
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

def _silero_keeps(name: str) -> bool:
    return not name.startswith("silero_vad/data/") or name in {"silero_vad/data/silero_vad.onnx",
                                                               "silero_vad/data/__init__.py"}


def _pocketsphinx_keeps(name: str) -> bool:
    return not (name.startswith("pocketsphinx/model/") and name.endswith(".lm.bin"))


# wheel file name pattern -> which of its files the carried copy keeps
KEEPS = {"silero_vad-*.whl": _silero_keeps, "pocketsphinx-*.whl": _pocketsphinx_keeps}


def slim(wheel: Path, keeps=_silero_keeps) -> tuple[int, int]:
    """Rewrite `wheel` in place; returns (bytes before, bytes after)."""
    before = wheel.stat().st_size
    with zipfile.ZipFile(wheel) as src:
        names = [n for n in src.namelist() if keeps(n)]
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
    wheels = [(wheel, keeps) for pattern, keeps in KEEPS.items() for wheel in sorted(folder.glob(pattern))]
    if not wheels:
        print(f"no wheel to slim in {folder} ({', '.join(KEEPS)})", file=sys.stderr)
        return 1
    for wheel, keeps in wheels:
        before, after = slim(wheel, keeps)
        print(f"{wheel.name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
