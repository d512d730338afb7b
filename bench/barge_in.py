"""Barge-in while a reply plays, offline through the guarded `TurnDetector` (Silero VAD, espeak-ng).

Per `barge_in_min_speech_ms`: false barge-in rate on backchannels and noise bursts (any SpeechStarted);
on real interruptions, onset → output held (the session stops sending the reply's audio at the first
window of a guarded speech candidate: the stop latency) and onset → SpeechStarted (the cancel); on
backchannels, how long the reply's output is held before it is released. Input is fed in 20 ms
appends, as a client streams it; times are at the end of the append that produced the event.
Run: `python3 -m bench.barge_in [--runs 3]` (a few seconds a run).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np
import soxr

from bench.end_of_turn import espeak
from realtime_ming.audio.config import TurnDetectorConfig
from realtime_ming.audio.turns import SpeechStarted, TurnDetector
from realtime_ming.audio.vad import SileroVad, create_silero_session

__all__ = ["BACKCHANNELS", "INTERRUPTIONS", "Trace", "main", "measure", "noise_bursts", "trace"]

BACKCHANNELS = ("mm-hmm", "uh-huh", "yeah", "okay", "right", "yes", "sure", "I see")
INTERRUPTIONS = ("Wait, stop.", "No, I meant the other one.", "Hold on, that's wrong.",
                 "Actually, can you repeat that?", "Stop.", "Sorry, one more question.")
VOICES = ("en-us", "en-gb+f3", "en-us+m3")


def noise_bursts(rate_hz: int = 16000) -> list[np.ndarray]:
    """A cough-like decaying noise burst, a click, 400 ms of noise (seeded)."""
    rng = np.random.default_rng(0)
    n = rate_hz * 150 // 1000
    cough = rng.normal(0, 0.3, n) * np.exp(-np.linspace(0, 6, n))
    click = np.zeros(rate_hz // 10)
    click[:48] = 0.8
    return [cough.astype(np.float32), click.astype(np.float32), rng.normal(0, 0.05, rate_hz * 2 // 5).astype(np.float32)]


@dataclass(frozen=True, slots=True)
class Trace:
    """One clip over a playing reply (ms after the clip's onset; None: never)."""

    held_ms: int | None  # the output hold began (the reply's audio stops going out)
    started_ms: int | None  # SpeechStarted: the response is cancelled
    released_ms: int | None  # the candidate was dropped: the held output goes out again


def trace(cfg: TurnDetectorConfig, vad: SileroVad, clip16: np.ndarray) -> Trace:
    """Feed silence, the clip, 1 s of silence in 20 ms appends with the barge-in guard on."""
    lead = 320
    detector = TurnDetector(cfg, vad)
    detector.guard_barge_in(True)
    audio = np.concatenate([np.zeros(16 * lead, np.float32), clip16, np.zeros(16000, np.float32)])
    step = 16 * 20
    held = started = released = None
    for i in range(0, audio.size, step):
        events = detector.feed(audio[i: i + step])
        t = (i + step) // 16 - lead
        if detector.judging_barge_in and held is None:
            held = t
        if any(isinstance(e, SpeechStarted) for e in events):
            started, held = t, t if held is None else held
            break
        if held is not None and released is None and not detector.judging_barge_in:
            released = t
    return Trace(held, started, released)


def _p(values: list[int], q: float) -> float | None:
    values = sorted(values)
    return values[int(q * (len(values) - 1))] if values else None


def measure(cfg: TurnDetectorConfig, vad: SileroVad) -> dict:
    to16 = lambda x: soxr.resample(x, 24000, 16000).astype(np.float32)
    others = [trace(cfg, vad, to16(espeak(t, v))) for t in BACKCHANNELS for v in VOICES]
    others += [trace(cfg, vad, x) for x in noise_bursts()]
    real = [trace(cfg, vad, to16(espeak(t, v))) for t in INTERRUPTIONS for v in VOICES]
    stops = [r.held_ms for r in real if r.started_ms is not None]
    cancels = [r.started_ms for r in real if r.started_ms is not None]
    pauses = [o.released_ms - o.held_ms for o in others if o.started_ms is None and o.held_ms is not None]
    return {
        "barge_in_min_speech_ms": cfg.barge_in_min_speech_ms,
        "false_barge_in_rate": round(sum(o.started_ms is not None for o in others) / len(others), 3),
        "missed_interruptions": sum(r.started_ms is None for r in real),
        "stop_ms_p50": _p(stops, 0.5), "stop_ms_p90": _p(stops, 0.9), "stop_ms_max": _p(stops, 1.0),
        "cancel_ms_p50": _p(cancels, 0.5), "cancel_ms_p90": _p(cancels, 0.9),
        "backchannel_pause_ms_p50": _p(pauses, 0.5), "backchannel_pause_ms_max": _p(pauses, 1.0),
        "backchannels_held": len(pauses),
        "n_backchannel_or_noise": len(others), "n_interruptions": len(real),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1, help="repeat the whole set (Silero is deterministic)")
    parser.add_argument("--min-speech-ms", default="64,300,500,700,900")
    args = parser.parse_args(argv)
    vad = SileroVad(create_silero_session())
    for _ in range(args.runs):
        for min_ms in (int(x) for x in args.min_speech_ms.split(",")):
            print(json.dumps(measure(TurnDetectorConfig(barge_in_min_speech_ms=min_ms), vad)), flush=True)


if __name__ == "__main__":
    main()
