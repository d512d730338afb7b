"""Short barge-in candidates over a playing reply: the guarded `TurnDetector` with and without its command reader, and
with other `barge_in_word_gap_ms`.

`python3 -m bench.barge_in_commands [--voices all] [--alignments 8] [--word-gap-ms 64,96]`: every clip (espeak-ng,
each voice) goes through the server's input path — 24 kHz PCM16 in 20 ms appends, the session's streaming resampler
to 16 kHz, the guarded detector — after `--silence-ms` (320) of silence plus k × 20 ms for each of `--alignments` values of k (a
clip starts at a 20 ms frame; Silero's windows are 32 ms, so 8 alignments cover every phase of the clip against
them), and is counted as an interruption (SpeechStarted) or not. Clip sets: lone stop commands ("Stop.", "Wait.",
"No.", "Hold on."), the barge-in bench's longer interruptions, its backchannels and noise bursts, other short words in
the reader's grammar, and held-out short words that are not (a forced-choice grammar maps those to whichever sounds
closest: the honest false-stop rate). Prints one JSON line per (word gap, reader, set) with the clips x alignments that
interrupted, and the clips that went the wrong way (with how many alignments).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter

import numpy as np

from bench.barge_in import BACKCHANNELS, INTERRUPTIONS, VOICES, noise_bursts
from bench.end_of_turn import espeak
from realtime_ming.audio.commands import CommandSpotter
from realtime_ming.audio.config import TurnDetectorConfig
from realtime_ming.audio.resample import LOW_LATENCY, StreamResampler
from realtime_ming.audio.turns import SpeechStarted, TurnDetector
from realtime_ming.audio.vad import SileroVad, create_silero_session

LONE = ("Stop.", "Wait.", "No.", "Hold on.")
OTHERS = ("hmm", "oh", "cool", "got it", "nice", "I know", "makes sense", "of course", "perfect", "fine", "uh",
          "wow", "oh really", "ha ha")
HELD_OUT = ("awesome", "seriously", "absolutely", "definitely", "sort of", "that's right", "love it", "uh yeah",
            "sounds fun", "true true", "hmm okay", "oh wow", "oh nice", "wonderful", "fantastic", "gosh", "yikes",
            "aha yes")
MORE_VOICES = ("en-gb-scotland", "en-029", "en-us-nyc", "en+f2", "en-gb-x-rp", "en-gb-x-gbclan", "en+f4",
               "en-us+m1", "en+klatt2")
WIRE_HZ = 24000
_APPEND = WIRE_HZ // 50  # 20 ms


class CachedVad:
    """Silero's probabilities per (input, window) computed once: the detector's verdicts under several configs and
    readers are compared on the same windows (each input is fed from a reset VAD, so its windows are deterministic)."""

    def __init__(self, vad: SileroVad) -> None:
        self._vad, self._cache = vad, {}
        self.window_num_samples = vad.window_num_samples
        self.key, self._index = None, 0

    def speech_prob(self, window: np.ndarray) -> float:
        key = (self.key, self._index)
        self._index += 1
        if key not in self._cache:
            self._cache[key] = self._vad.speech_prob(window)
        return self._cache[key]

    def reset(self) -> None:
        self._vad.reset()
        self._index = 0


def served(clip24: np.ndarray, lead_ms: int, cfg: TurnDetectorConfig, vad, reader=None) -> bool:
    """Whether `clip24` (float32 24 kHz) after `lead_ms` of silence interrupts a playing reply, through the server's
    input path (PCM16 appends of 20 ms, the session's low-latency resampler to 16 kHz, the guarded detector)."""
    detector = TurnDetector(cfg, vad, reader)
    detector.guard_barge_in(True)
    resampler = StreamResampler(WIRE_HZ, 16000, LOW_LATENCY)
    audio = np.concatenate([np.zeros(WIRE_HZ * lead_ms // 1000, np.float32), clip24, np.zeros(WIRE_HZ, np.float32)])
    pcm = np.clip(np.rint(audio * 32767), -32768, 32767).astype(np.float32) / 32768.0
    for i in range(0, pcm.size, _APPEND):
        if any(isinstance(e, SpeechStarted) for e in detector.feed(resampler.process(pcm[i: i + _APPEND]))):
            return True
    return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--voices", default="bench", help="'bench' (the barge-in bench's 3), 'all' (+9 more) or a list")
    parser.add_argument("--wpm", type=int, default=170, help="espeak-ng speaking rate")
    parser.add_argument("--alignments", type=int, default=8, help="onsets SILENCE + k x 20 ms, k < this")
    parser.add_argument("--silence-ms", default="320", help="the silence before each clip (comma-separated: each one "
                        "x every alignment; Silero's state after a longer silence differs)")
    parser.add_argument("--word-gap-ms", default=str(TurnDetectorConfig().barge_in_word_gap_ms),
                        help="barge_in_word_gap_ms values to compare (comma-separated)")
    parser.add_argument("--readers", default="none,pocketsphinx", help="none and/or pocketsphinx")
    args = parser.parse_args(argv)
    voices = {"bench": VOICES, "all": VOICES + MORE_VOICES}.get(args.voices) or tuple(args.voices.split(","))
    subprocess.run(["espeak-ng", "--version"], check=True, capture_output=True)
    vad = CachedVad(SileroVad(create_silero_session()))
    sets = {"lone_commands": LONE, "interruptions": tuple(t for t in INTERRUPTIONS if t != "Stop."),
            "backchannels": BACKCHANNELS, "other_short_words": OTHERS, "held_out_short_words": HELD_OUT}
    clips = {name: [(f"{t} [{v}]", espeak(t, v, wpm=args.wpm)) for t in texts for v in voices]
             for name, texts in sets.items()}
    to24 = lambda x: np.interp(np.arange(x.size * 3 // 2) / 1.5, np.arange(x.size), x).astype(np.float32)
    clips["backchannels"] += [(n, to24(x)) for n, x in zip(("cough", "click", "noise"), noise_bursts())]
    readers = {"none": None, "pocketsphinx": CommandSpotter()}
    for gap in (int(x) for x in args.word_gap_ms.split(",")):
        cfg = TurnDetectorConfig(barge_in_word_gap_ms=gap)
        for reader_name in args.readers.split(","):
            for name, items in clips.items():
                stopped: Counter = Counter()
                for label, x in items:
                    for silence in (int(ms) for ms in args.silence_ms.split(",")):
                        for k in range(args.alignments):
                            vad.key = (label, silence, k)
                            stopped[label] += served(x, silence + 20 * k, cfg, vad, readers[reader_name])
                if name in ("lone_commands", "interruptions"):
                    per_clip = args.alignments * len(args.silence_ms.split(","))
                    wrong = {label: per_clip - stopped[label] for label, _ in items if stopped[label] < per_clip}
                else:
                    wrong = {label: n for label, n in stopped.items() if n}
                print(json.dumps({"word_gap_ms": gap, "reader": reader_name, "set": name,
                                  "trials": len(items) * args.alignments * len(args.silence_ms.split(",")),
                                  "stopped": sum(stopped.values()),
                                  "wrong_way": wrong}), flush=True)


if __name__ == "__main__":
    main()
