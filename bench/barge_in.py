"""Barge-in while a reply plays, offline through the guarded `TurnDetector` (Silero VAD, espeak-ng).

False barge-in rate on backchannels and noise bursts (any SpeechStarted), and onset → SpeechStarted
latency on real interruptions, for a range of `barge_in_min_speech_ms`.
Run: `python3 -m bench.barge_in` (a few seconds).
"""

from __future__ import annotations

import json
import statistics

import numpy as np
import soxr

from bench.end_of_turn import espeak
from realtime_ming.audio.config import TurnDetectorConfig
from realtime_ming.audio.turns import SpeechStarted, TurnDetector
from realtime_ming.audio.vad import SileroVad, create_silero_session

__all__ = ["BACKCHANNELS", "INTERRUPTIONS", "main", "measure", "noise_bursts"]

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


def _first_start_ms(cfg: TurnDetectorConfig, vad: SileroVad, clip16: np.ndarray) -> int | None:
    """ms after the clip's onset at which SpeechStarted is emitted (guard on), None if never."""
    lead = 320
    detector = TurnDetector(cfg, vad)
    detector.guard_barge_in(True)
    audio = np.concatenate([np.zeros(16 * lead, np.float32), clip16, np.zeros(16000, np.float32)])
    step = 16 * 20
    for i in range(0, audio.size, step):
        if any(isinstance(e, SpeechStarted) for e in detector.feed(audio[i: i + step])):
            return (i + step) // 16 - lead
    return None


def measure(cfg: TurnDetectorConfig, vad: SileroVad) -> dict:
    to16 = lambda x: soxr.resample(x, 24000, 16000).astype(np.float32)
    false_ = [_first_start_ms(cfg, vad, to16(espeak(t, v))) is not None for t in BACKCHANNELS for v in VOICES]
    false_ += [_first_start_ms(cfg, vad, x) is not None for x in noise_bursts()]
    stops = [_first_start_ms(cfg, vad, to16(espeak(t, v))) for t in INTERRUPTIONS for v in VOICES]
    hit = sorted(s for s in stops if s is not None)
    return {
        "barge_in_min_speech_ms": cfg.barge_in_min_speech_ms,
        "false_barge_in_rate": round(sum(false_) / len(false_), 3),
        "missed_interruptions": sum(s is None for s in stops),
        "stop_ms_p50": statistics.median(hit) if hit else None,
        "stop_ms_p90": hit[int(0.9 * (len(hit) - 1))] if hit else None,
        "n_backchannel_or_noise": len(false_), "n_interruptions": len(stops),
    }


def main() -> None:
    vad = SileroVad(create_silero_session())
    for min_ms in (64, 300, 500, 700, 900):
        print(json.dumps(measure(TurnDetectorConfig(barge_in_min_speech_ms=min_ms), vad)), flush=True)


if __name__ == "__main__":
    main()
