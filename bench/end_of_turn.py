"""Turn-detection modes on espeak-ng speech, offline through the session's own `InputTurns`.

For each mode: split-turn rate on utterances with a mid-sentence pause (more than one SpeechEnded),
end-of-speech → turn-end delay on complete sentences, and Smart Turn CPU ms per decision.
Run: `python3 -m bench.end_of_turn [--pause-ms 700]` (synthesises with espeak-ng; ~1 min on one core).
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess

import numpy as np
import soxr

from realtime_ming.audio.vad import VadKind, create_silero_session, create_vad
from realtime_ming.protocol.session import Eagerness, SemanticVad, ServerVad
from realtime_ming.protocol.values import AudioFormat
from realtime_ming.session.config import VadSettings
from realtime_ming.session.input import InputTurns, SpeechEnded

__all__ = ["COMPLETE", "PAUSED", "VOICES", "espeak", "main", "run_turn"]

# "<p>" marks the mid-sentence pause.
PAUSED = (
    "I'd like to book a table for <p> four people at eight.",
    "Can you tell me <p> what the weather will be tomorrow?",
    "My flight lands late in the evening, so <p> which is faster, the train or a taxi?",
    "I was wondering if <p> you could help me with my homework.",
    "Please remind me to call <p> my sister on Sunday.",
)
COMPLETE = (
    "What time is it?",
    "Can you tell me a quick fact about the moon?",
    "Please remind me what the weather will be like tomorrow morning.",
    "I need a taxi to the airport.",
    "Thank you, that is all.",
)
VOICES = ("en-us", "en-gb+f3", "en-us+m3")
_WIRE_HZ = 24000
_CHUNK_MS = 20


def espeak(text: str, voice: str, pause_ms: int = 0, wpm: int = 170) -> np.ndarray:
    """float32 24 kHz speech; `<p>` becomes an SSML break of `pause_ms`."""
    ssml = "<speak>" + text.replace("<p>", f'<break time="{pause_ms}ms"/>') + "</speak>"
    raw = subprocess.run(["espeak-ng", "-m", "-v", voice, "-s", str(wpm), "--stdout", ssml],
                         check=True, capture_output=True).stdout
    pcm = np.frombuffer(raw[44:], dtype=np.int16).astype(np.float32) / 32768.0  # espeak: 22.05 kHz wav
    loud = np.flatnonzero(np.abs(pcm) > 0.003)
    return soxr.resample(pcm[loud[0]: loud[-1] + 1], 22050, _WIRE_HZ).astype(np.float32)


def run_turn(turns: InputTurns, speech: np.ndarray, tail_ms: int = 9000) -> tuple[list[int], list[float]]:
    """Stream speech + silence in 20 ms appends; (turn-end delays after the speech end in ms, CPU ms)."""
    audio = np.concatenate([speech, np.zeros(_WIRE_HZ * tail_ms // 1000, np.float32)])
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    step = _WIRE_HZ * _CHUNK_MS // 1000
    ends, cpu = [], []
    for i in range(0, pcm.size, step):
        turns.last_decision = None
        for signal in turns.append(base64.b64encode(pcm[i: i + step].tobytes()).decode()):
            if isinstance(signal, SpeechEnded):
                ends.append((i + step) * 1000 // _WIRE_HZ - speech.size * 1000 // _WIRE_HZ)
        if turns.last_decision is not None:
            cpu.append(turns.last_decision[1])
    return ends, cpu


def _modes() -> dict[str, object]:
    return {
        "server_vad 500 ms": ServerVad(),
        "server_vad 200 ms": ServerVad(silence_duration_ms=200),
        **{f"semantic_vad {e.value}": SemanticVad(eagerness=e) for e in (Eagerness.HIGH, Eagerness.AUTO, Eagerness.LOW)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pause-ms", type=int, default=700)
    parser.add_argument("--modes", default="", help="comma-separated substrings of mode names (default: all)")
    args = parser.parse_args(argv)
    wanted = [m for m in args.modes.split(",") if m]
    session = create_silero_session()
    paused = [espeak(t, v, args.pause_ms) for t in PAUSED for v in VOICES]
    complete = [espeak(t, v) for t in COMPLETE for v in VOICES]
    results = {}
    for name, td in _modes().items():
        if wanted and not any(w in name for w in wanted):
            continue
        turns = InputTurns(VadSettings(), lambda _kind: create_vad(VadKind.SILERO, silero_session=session), 60.0)
        turns.configure(AudioFormat(), td)
        splits, delays, cpu = 0, [], []
        for speech in paused:
            ends, c = run_turn(turns, speech)
            splits += len(ends) != 1
            cpu += c
        for speech in complete:
            ends, c = run_turn(turns, speech)
            delays += ends[-1:]
            cpu += c
        results[name] = {
            "split_rate": round(splits / len(paused), 3),
            "turn_end_after_speech_ms_p50": statistics.median(delays),
            "turn_end_after_speech_ms_p90": sorted(delays)[int(0.9 * (len(delays) - 1))],
            "turn_end_after_speech_ms_max": max(delays),
            "smart_turn_cpu_ms_p50": round(statistics.median(cpu), 1) if cpu else None,
            "n_paused": len(paused), "n_complete": len(complete),
        }
        print(name, json.dumps(results[name]), flush=True)


if __name__ == "__main__":
    main()
