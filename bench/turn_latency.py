"""Where the audio-time part of end of speech → turn end goes, per bench turn, offline.

The bench's own turns (`realtime_ming.bench.turns.default_turns`, 24 kHz, the e2e set) are streamed through the
session's `InputTurns` in 20 ms appends followed by silence, as `python -m bench` sends them. For each
turn the time from the last non-silent sample (the bench's end of speech) to the append that ends the
turn is split into: the resampler's delay, the VAD's lag (where the detector dates the silence start,
after the true end), the silence timer or end-of-turn decision point, and what is left (the VAD window
and append granularity). Wall-clock costs (the Smart Turn call, thread hops) are not in here: the
server logs them at DEBUG (`realtime_ming.session.input`, `realtime_ming.session.runner`).
Run: `python3 -m bench.turn_latency [--modes server_vad,high]` (one JSON line per mode and turn).
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics

import numpy as np

from realtime_ming.audio.turns import SpeechStopped
from realtime_ming.audio.vad import VadKind, create_silero_session, create_vad
from realtime_ming.protocol.audio_input import Eagerness, SemanticVad, ServerVad
from realtime_ming.protocol.values import AudioFormat
from realtime_ming.session.config import VadSettings
from realtime_ming.session.input import InputTurns, SpeechEnded

from realtime_ming.bench.turns import default_cache_dir, default_turns

__all__ = ["breakdown", "main"]

_WIRE_HZ = 24000
_CHUNK_MS = 20
_TAIL_MS = 5000


def _modes() -> dict[str, object]:
    return {
        "server_vad 500 ms": ServerVad(),
        "semantic_vad high": SemanticVad(eagerness=Eagerness.HIGH),
        "semantic_vad auto": SemanticVad(eagerness=Eagerness.AUTO),
    }


def breakdown(turns: InputTurns, pcm16: np.ndarray, speech_end_sample: int) -> dict:
    """Stream one turn (+ silence); the audio-time breakdown of its last turn end (ms)."""
    pcm = np.concatenate([pcm16, np.zeros(_WIRE_HZ * _TAIL_MS // 1000, np.int16)])
    detector = turns._detector
    assert detector is not None
    stops: list[SpeechStopped] = []
    feed, end_turn = detector.feed, detector.end_turn

    def spy_feed(samples):
        events = feed(samples)
        stops.extend(e for e in events if isinstance(e, SpeechStopped))
        return events

    def spy_end_turn():
        event = end_turn()
        if event is not None:
            stops.append(event)
        return event

    detector.feed, detector.end_turn = spy_feed, spy_end_turn  # instance attributes shadow the methods
    step = _WIRE_HZ * _CHUNK_MS // 1000
    origin_ms = detector.position_ms
    end_ms = speech_end_sample * 1000 / _WIRE_HZ
    result: dict = {"num_turn_ends": 0}
    try:
        for i in range(0, pcm.size, step):
            signals = turns.append(base64.b64encode(pcm[i: i + step].tobytes()).decode())
            if not any(isinstance(s, SpeechEnded) for s in signals):
                continue
            result["num_turn_ends"] += 1
            stop = stops[-1]
            wire_ms = (i + step) * 1000 / _WIRE_HZ  # audio the client had sent when the turn ended
            fed_ms = detector.position_ms - origin_ms  # 16 kHz samples the detector was fed
            silence_start = stop.speech_end_ms - origin_ms
            timer = stop.audio_end_ms - stop.speech_end_ms
            result.update(
                end_after_speech_ms=round(wire_ms - end_ms, 1),
                resampler_ms=round(wire_ms - fed_ms, 1),
                vad_lag_ms=round(silence_start - end_ms, 1),
                timer_ms=timer,
            )
            result["granularity_ms"] = round(result["end_after_speech_ms"] - result["resampler_ms"]
                                             - result["vad_lag_ms"] - timer, 1)
    finally:
        del detector.feed, detector.end_turn
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--modes", default="", help="comma-separated substrings of mode names (default: all)")
    args = parser.parse_args(argv)
    wanted = [m for m in args.modes.split(",") if m]
    session = create_silero_session()
    spoken = default_turns(default_cache_dir(), wire_rate_hz=_WIRE_HZ)
    for name, td in _modes().items():
        if wanted and not any(w in name for w in wanted):
            continue
        rows = []
        for turn in spoken:
            turns = InputTurns(VadSettings(), lambda _kind: create_vad(VadKind.SILERO, silero_session=session), 60.0,
                               decision_wait_s=None)  # faster than real time: wait for each answer
            turns.configure(AudioFormat(), td)
            row = {"mode": name, "turn": turn.name, **breakdown(turns, turn.pcm16, turn.speech_end_sample)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        ends = [r["end_after_speech_ms"] for r in rows if r.get("end_after_speech_ms") is not None]
        summary = {"mode": name, "summary": True, "end_after_speech_ms_p50": statistics.median(ends)}
        for key in ("resampler_ms", "vad_lag_ms", "timer_ms", "granularity_ms"):
            values = [r[key] for r in rows if r.get(key) is not None]
            summary[f"{key}_p50"] = statistics.median(values) if values else None
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
