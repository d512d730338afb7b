"""Spoken turns for the benchmark: espeak-ng utterances (cached) and a user folder of wavs.

Every turn becomes PCM16 mono at the wire rate; `speech_end_sample` is one past the last sample
whose magnitude exceeds the silence threshold, measured on exactly the samples that are sent,
so the end of the user's speech is known to the sample.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

__all__ = ["DEFAULT_UTTERANCES", "SpokenTurn", "default_cache_dir", "default_turns", "load_turns", "wav_dir_turns"]

# (name, espeak-ng voice, words per minute, text): three lengths, four voices.
DEFAULT_UTTERANCES: tuple[tuple[str, str, int, str], ...] = (
    ("short-us", "en-us", 175, "What time is it?"),
    ("short-gb-f", "en-gb+f3", 160, "Hi, can you hear me?"),
    ("medium-us-f", "en-us+f2", 170, "Can you tell me a quick fact about the moon?"),
    ("medium-rp", "en-gb-x-rp", 185, "Please remind me what the weather will be like tomorrow morning."),
    ("long-us", "en-us+m3", 180,
     "I am planning a trip to the mountains next weekend, what should I pack for cold and rainy weather?"),
    ("long-gb-f", "en-gb+f4", 170,
     "My flight lands late in the evening, so which is faster to get downtown, the train or a taxi?"),
)


@dataclass(frozen=True, slots=True)
class SpokenTurn:
    """One utterance as sent on the wire: PCM16 mono at `sample_rate_hz`."""

    name: str
    pcm16: np.ndarray  # [num_samples] int16
    sample_rate_hz: int
    speech_end_sample: int  # one past the last non-silent sample
    text: str | None = None  # what was said, when known
    source: str = ""

    @property
    def speech_end_s(self) -> float:
        return self.speech_end_sample / self.sample_rate_hz

    @property
    def duration_s(self) -> float:
        return self.pcm16.size / self.sample_rate_hz

    def describe(self) -> dict:
        """JSON record of the turn (no samples)."""
        return {
            "name": self.name,
            "text": self.text,
            "source": self.source,
            "duration_s": round(self.duration_s, 4),
            "speech_end_s": round(self.speech_end_s, 6),
        }


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/realtime-ming/bench-turns` (default `~/.cache/...`)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "realtime-ming" / "bench-turns"


def _to_pcm16(samples: np.ndarray, rate_hz: int, wire_rate_hz: int) -> np.ndarray:
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim == 2:
        x = x.mean(axis=1)
    if rate_hz != wire_rate_hz:
        x = soxr.resample(x, rate_hz, wire_rate_hz, quality="HQ")
    return np.clip(np.rint(x * 32768.0), -32768, 32767).astype(np.int16)


def _speech_bounds(pcm16: np.ndarray, silence_dbfs: float) -> tuple[int, int]:
    """[first, one past last) non-silent sample; raises ValueError when all of it is silence."""
    threshold = 32768.0 * 10.0 ** (silence_dbfs / 20.0)
    loud = np.flatnonzero(np.abs(pcm16.astype(np.int32)) > threshold)
    if loud.size == 0:
        raise ValueError(f"no sample above {silence_dbfs} dBFS")
    return int(loud[0]), int(loud[-1]) + 1


def _make_turn(name: str, samples: np.ndarray, rate_hz: int, *, wire_rate_hz: int, silence_dbfs: float,
               trim: bool, text: str | None, source: str) -> SpokenTurn:
    pcm16 = _to_pcm16(samples, rate_hz, wire_rate_hz)
    start, end = _speech_bounds(pcm16, silence_dbfs)
    if trim:
        pcm16 = pcm16[start:end]
        start, end = 0, end - start
    return SpokenTurn(name, pcm16, wire_rate_hz, end, text, source)


def _espeak_version() -> str:
    run = subprocess.run(["espeak-ng", "--version"], check=True, capture_output=True, text=True)
    return run.stdout.strip()


def default_turns(cache_dir: Path, *, wire_rate_hz: int = 24000, silence_dbfs: float = -50.0) -> list[SpokenTurn]:
    """The espeak-ng set, synthesised once into `cache_dir` (keyed by text, voice, speed, version).

    Raises RuntimeError when espeak-ng is missing and the cache lacks a file.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    has_espeak = shutil.which("espeak-ng") is not None
    version = _espeak_version() if has_espeak else ""
    turns = []
    for name, voice, wpm, text in DEFAULT_UTTERANCES:
        key = hashlib.sha256(f"{voice}|{wpm}|{text}|{version}".encode()).hexdigest()[:12]
        cached = sorted(cache_dir.glob(f"{name}-*.wav"))
        path = cache_dir / f"{name}-{key}.wav"
        if not path.exists() and not has_espeak and cached:
            path = cached[-1]  # no espeak to check the version against: use what is there
        if not path.exists():
            if not has_espeak:
                raise RuntimeError("espeak-ng is not installed (apt-get install -y espeak-ng) and the turn cache is empty")
            tmp = path.with_suffix(".tmp.wav")
            subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(tmp), text], check=True,
                           capture_output=True)
            tmp.replace(path)
        samples, rate_hz = sf.read(path, dtype="float32")
        turns.append(_make_turn(name, samples, rate_hz, wire_rate_hz=wire_rate_hz, silence_dbfs=silence_dbfs,
                                trim=True, text=text, source=f"espeak-ng {voice} {wpm} wpm"))
    return turns


def wav_dir_turns(folder: Path, *, wire_rate_hz: int = 24000, silence_dbfs: float = -50.0) -> list[SpokenTurn]:
    """Every `*.wav` in `folder` (sorted), kept as recorded: leading and trailing silence stay.

    A `<name>.txt` next to a wav is read as its transcript.
    """
    turns = []
    for path in sorted(Path(folder).glob("*.wav")):
        samples, rate_hz = sf.read(path, dtype="float32")
        transcript = path.with_suffix(".txt")
        text = transcript.read_text().strip() if transcript.exists() else None
        turns.append(_make_turn(path.stem, samples, rate_hz, wire_rate_hz=wire_rate_hz, silence_dbfs=silence_dbfs,
                                trim=False, text=text, source=str(path)))
    if not turns:
        raise ValueError(f"no *.wav files in {folder}")
    return turns


def load_turns(*, use_default: bool, wav_dir: str | None, cache_dir: str | None, wire_rate_hz: int,
               silence_dbfs: float, max_turn_s: float | None) -> list[SpokenTurn]:
    """The turn set of a run: the default set and/or a wav folder, minus turns over `max_turn_s`."""
    turns: list[SpokenTurn] = []
    if use_default:
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        turns += default_turns(folder, wire_rate_hz=wire_rate_hz, silence_dbfs=silence_dbfs)
    if wav_dir is not None:
        turns += wav_dir_turns(Path(wav_dir), wire_rate_hz=wire_rate_hz, silence_dbfs=silence_dbfs)
    if max_turn_s is not None:
        turns = [t for t in turns if t.speech_end_s <= max_turn_s]
    if not turns:
        raise ValueError("no turns left (check --max-turn-s)")
    return turns
