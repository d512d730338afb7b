"""Is this Python ready to serve and benchmark? Checks run by `bench/gpu_setup.sh` (GPU machines) or by hand.

`python3 -m bench.env_check [--turns-dir .turns] [--verbose]` prints each failed check (every check
with --verbose) and a summary line, and exits 1 when any check fails:

* every runtime requirement of pyproject.toml (markers applied) is installed at a version in range;
* every `realtime_ming` submodule and every `bench` module imports;
* the native pieces work: libsndfile reads back a wav, soxr resamples, webrtcvad classifies a frame,
  Silero's ONNX model (from the silero-vad wheel) runs on onnxruntime, inflect spells a number;
* the espeak-ng turn cache holds a wav for every default utterance (only with `--turns-dir`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import io
import sys
import tomllib
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def requirement_problems(pyproject: Path = REPO / "pyproject.toml") -> list[tuple[str, str]]:
    """(requirement, problem) for each runtime requirement that is missing or out of range; "" = fine."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return [("packaging", "not installed: requirement versions not checked")]

    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    results = []
    for text in deps:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            results.append((str(req), "not installed"))
            continue
        ok = req.specifier.contains(version.split("+")[0], prereleases=True)
        results.append((f"{req.name}=={version}", "") if ok else (str(req), f"installed {version}, out of range"))
    return results


def module_names() -> list[str]:
    """Every module of the `realtime_ming` and `bench` packages, sorted (found on disk, not imported)."""
    names = []
    for package in ("realtime_ming", "bench"):
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(set(names) - {"bench.__main__"})


def import_problems(names: list[str]) -> list[tuple[str, str]]:
    """(module, problem) for each name; problem "" when it imported, else the exception's first line."""
    results = []
    for name in names:
        try:
            importlib.import_module(name)
            results.append((name, ""))
        except Exception as exc:  # noqa: BLE001 - report every kind of import failure
            results.append((name, f"{type(exc).__name__}: {exc}".splitlines()[0]))
    return results


def _probe_soundfile() -> str:
    import soundfile as sf

    tone = np.sin(np.arange(1600) * 0.1).astype(np.float32)  # [1600]
    buffer = io.BytesIO()
    sf.write(buffer, tone, 16000, format="WAV", subtype="PCM_16")
    buffer.seek(0)
    back, rate = sf.read(buffer, dtype="float32")
    assert rate == 16000 and np.abs(back - tone).max() < 1e-3, "wav round trip differs"
    return sf.__libsndfile_version__


def _probe_soxr() -> str:
    import soxr

    out = soxr.resample(np.zeros(2400, np.float32), 24000, 16000)
    assert out.shape == (1600,), f"24k→16k gave {out.shape}"
    return soxr.__version__


def _probe_webrtcvad() -> str:
    import webrtcvad

    assert webrtcvad.Vad(2).is_speech(b"\x00\x00" * 320, 16000) is False, "silence classified as speech"
    return "silence → not speech"


def _probe_silero() -> str:
    from realtime_ming.audio.vad import SileroVad, create_silero_session, silero_model_path

    vad = SileroVad(create_silero_session())
    prob = vad.speech_prob(np.zeros(vad.window_num_samples, np.float32))
    assert 0.0 <= prob < 0.5, f"silence prob {prob}"
    return f"{silero_model_path().name} silence p={prob:.3f}"


def _probe_inflect() -> str:
    import inflect

    words = inflect.engine().number_to_words(21)
    assert words == "twenty-one", words
    return words


PROBES: dict[str, Callable[[], str]] = {
    "soundfile": _probe_soundfile,
    "soxr": _probe_soxr,
    "webrtcvad": _probe_webrtcvad,
    "silero-vad": _probe_silero,
    "inflect": _probe_inflect,
}


def probe_problems() -> list[tuple[str, str, str]]:
    """(name, result, problem) for each native-dependency probe."""
    results = []
    for name, probe in PROBES.items():
        try:
            results.append((name, probe(), ""))
        except Exception as exc:  # noqa: BLE001
            results.append((name, "", f"{type(exc).__name__}: {exc}".splitlines()[0]))
    return results


def turn_problems(folder: Path) -> list[tuple[str, str]]:
    """(utterance, problem) for each default espeak-ng utterance: a `<name>-*.wav` must be in `folder`."""
    from realtime_ming.bench.turns import DEFAULT_UTTERANCES

    return [(name, "" if any(folder.glob(f"{name}-*.wav")) else f"no {name}-*.wav in {folder}")
            for name, *_ in DEFAULT_UTTERANCES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns-dir", help="also check the espeak-ng turn cache in this folder")
    parser.add_argument("--verbose", action="store_true", help="print the passing checks too")
    args = parser.parse_args(argv)
    failed = 0

    def show(kind: str, name: str, problem: str, detail: str = "") -> None:
        nonlocal failed
        failed += bool(problem)
        if problem or args.verbose:
            print(f"{'FAIL' if problem else 'ok':4} {kind:8} {name}  {problem or detail}")

    print(f"python {sys.version.split()[0]} at {sys.executable}")
    for name, problem in requirement_problems():
        show("require", name, problem)
    names = module_names()
    imports = import_problems(names)
    for name, problem in imports:
        show("import", name, problem)
    for name, detail, problem in probe_problems():
        show("probe", name, problem, detail)
    if args.turns_dir:
        for name, problem in turn_problems(Path(args.turns_dir)):
            show("turns", name, problem)
    imported = sum(not p for _, p in imports)
    print(f"env_check: {imported}/{len(names)} modules imported, {failed} failed checks")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - the check itself broke: say where
        traceback.print_exc()
        sys.exit(2)
