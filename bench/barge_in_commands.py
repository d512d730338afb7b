"""Short barge-in candidates over a playing reply: the guarded `TurnDetector` with and without its command reader, with
other `barge_in_word_gap_ms` and `barge_in_max_pause_ms`, and the pause each one makes the listener hear.

`python3 -m bench.barge_in_commands [--voices all] [--alignments 8] [--word-gap-ms 64,96] [--gap-db 0,25]
[--word-db 10,15] [--max-pause-ms none,650] [--noise-dbfs -60] [--repeat 8]`:
every clip (espeak-ng,
each voice) goes through the server's input path — 24 kHz PCM16 in 20 ms appends, the session's streaming resampler
to 16 kHz, the guarded detector — after `--silence-ms` (320) of silence plus k × 20 ms for each of `--alignments` values of k (a
clip starts at a 20 ms frame; Silero's windows are 32 ms, so 8 alignments cover every phase of the clip against
them), and is counted as an interruption (SpeechStarted) or not. Clip sets: lone stop commands ("Stop.", "Wait.",
"No.", "Hold on."), the barge-in bench's longer interruptions, its backchannels and noise bursts, other short words in
the reader's grammar, and held-out short words that are not (a forced-choice grammar maps those to whichever sounds
closest: the honest false-stop rate). Prints one JSON line per (word gap, reader, set) with the clips x alignments that
interrupted, and the clips that went the wrong way (with how many alignments).

The output hold is the server's (`session.barge_in.OutputGate` on the stream clock, a client that holds `--lead-ms`
of the reply when the hold begins). For the clips that did not interrupt: the pause the listener hears (the hold less
the lead) p50 / max and the clips over `--pause-over-ms`; for the interruptions: those whose hold ended before they
were confirmed (the listener hears the reply resume, then stop at `speech_started`), and onset -> audible stop (the
hold's start plus the lead, or the confirmation after such a resume) p50 / max.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
from collections import Counter
from dataclasses import dataclass

import numpy as np

from bench.barge_in import BACKCHANNELS, INTERRUPTIONS, VOICES, noise_bursts
from bench.end_of_turn import espeak
from realtime_ming.audio.commands import CommandSpotter
from realtime_ming.audio.config import TurnDetectorConfig
from realtime_ming.audio.resample import LOW_LATENCY, StreamResampler
from realtime_ming.audio.turns import SpeechStarted, TurnDetector
from realtime_ming.audio.vad import SileroVad, create_silero_session
from realtime_ming.session.barge_in import OutputGate, max_hold_s, max_pause_s

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
REPEAT_FRAMES = 101  # `repeated`: 2.02 s from clip to clip, an odd number of frames (every phase in 8 clips)


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


class Readings:
    """The command reader, keeping what it heard: each one-word candidate's reading when its word is over."""

    def __init__(self, spotter: CommandSpotter) -> None:
        self.spotter, self.heard = spotter, []

    def __call__(self, pcm16k: np.ndarray) -> bool:
        self.heard.append(self.spotter.heard(pcm16k) or "(nothing)")
        return self.heard[-1] in self.spotter.commands


@dataclass(frozen=True, slots=True)
class Served:
    """One clip over a playing reply (ms after its onset, on the input stream's clock; None: never)."""

    held_ms: int | None  # the output hold began (the first one)
    released_ms: int | None  # the first hold ended with no speech_started yet: the reply goes on
    started_ms: int | None  # speech_started: an interruption
    lead_ms: int  # the reply audio the client held when the hold began

    @property
    def interrupted(self) -> bool:
        return self.started_ms is not None

    @property
    def pause_ms(self) -> int:
        """The silence the listener hears in the reply (a clip that did not interrupt)."""
        if self.held_ms is None or self.released_ms is None:
            return 0
        return max(0, self.released_ms - self.held_ms - self.lead_ms)

    @property
    def resumed(self) -> bool:
        """An interruption whose hold ended before it was confirmed: the reply went on until `speech_started`."""
        return self.interrupted and self.released_ms is not None

    @property
    def stop_ms(self) -> int | None:
        """Onset -> the last reply audio the listener hears (an interruption)."""
        if self.started_ms is None or self.held_ms is None or self.resumed:
            return self.started_ms
        return min(self.started_ms, self.held_ms + self.lead_ms)


def _input_path(cfg: TurnDetectorConfig, vad, reader) -> tuple[TurnDetector, StreamResampler]:
    """The session's input path over a playing reply: the guarded detector and the 24 -> 16 kHz resampler."""
    detector = TurnDetector(cfg, vad, reader)
    detector.guard_barge_in(True)
    return detector, StreamResampler(WIRE_HZ, 16000, LOW_LATENCY)


def _wire(audio: np.ndarray, noise_dbfs: float | None, seed: int) -> np.ndarray:
    """`audio` as the wire carries it (PCM16 values), under white noise at `noise_dbfs` (seeded) if given."""
    if noise_dbfs is not None:
        audio = audio + np.random.default_rng(seed).standard_normal(audio.size).astype(np.float32) * 10 ** (noise_dbfs / 20)
    return np.clip(np.rint(audio * 32767), -32768, 32767).astype(np.float32) / 32768.0


def served(clip24: np.ndarray, silence_ms: int, cfg: TurnDetectorConfig, vad, reader=None, lead_ms: int = 150,
           noise_dbfs: float | None = None) -> Served:
    """`clip24` (float32 24 kHz) after `silence_ms` of silence over a playing reply, through the server's input path
    (PCM16 appends of 20 ms, the session's low-latency resampler to 16 kHz, the guarded detector) and its output hold
    (the session's `OutputGate`, fed after every append; the client holds `lead_ms` of the reply when the hold begins,
    the reply plays again from its release). `noise_dbfs`: white noise at that level under the whole input (a
    microphone's floor; the same noise for the same `silence_ms`), else digital silence around the clip."""
    detector, resampler = _input_path(cfg, vad, reader)
    gate = OutputGate(max_hold_s(cfg), max_pause_s(cfg))
    audio = np.concatenate([np.zeros(WIRE_HZ * silence_ms // 1000, np.float32), clip24, np.zeros(WIRE_HZ, np.float32)])
    pcm = _wire(audio, noise_dbfs, silence_ms)
    held = released = silent_since = None
    for i in range(0, pcm.size, _APPEND):
        started = any(isinstance(e, SpeechStarted) for e in detector.feed(resampler.process(pcm[i: i + _APPEND])))
        t = (i + _APPEND) * 1000 // WIRE_HZ - silence_ms
        if started:
            return Served(held, released, t, lead_ms)
        ended = gate.sync(detector.judging_barge_in, "reply", t / 1000.0, detector.barge_in_word_over, silent_since)
        if gate.active and held is None:
            held, silent_since = t, (t + lead_ms) / 1000.0
        if ended:
            released = t if released is None else released
            silent_since = None
    return Served(held, released, None, lead_ms)


def repeated(clip24: np.ndarray, silence_ms: int, cfg: TurnDetectorConfig, vad, reader=None, times: int = 8,
             noise_dbfs: float | None = None) -> int:
    """How many of `times` copies of `clip24` interrupt a playing reply when they come one input stream, after
    `silence_ms` of silence and then every `REPEAT_FRAMES` 20 ms frames (a phase of Silero's windows each when
    `times` <= 8), with Silero's state carried from clip to clip: it drifts over digital silence, so a clip is read
    differently after the ones before it. After an interruption the detector starts over, still guarded."""
    detector, resampler = _input_path(cfg, vad, reader)
    audio = np.zeros(WIRE_HZ * silence_ms // 1000 + _APPEND * (REPEAT_FRAMES * times + 50), np.float32)
    for i in range(times):
        start = WIRE_HZ * silence_ms // 1000 + _APPEND * REPEAT_FRAMES * i
        audio[start: start + clip24.size] += clip24
    pcm = _wire(audio, noise_dbfs, silence_ms)
    count = 0
    for i in range(0, pcm.size, _APPEND):
        if any(isinstance(e, SpeechStarted) for e in detector.feed(resampler.process(pcm[i: i + _APPEND]))):
            count += 1
            detector.reset()
    return count


def _p(values: list[int], q: float) -> int | None:
    values = sorted(values)
    return values[round(q * (len(values) - 1))] if values else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--voices", default="bench", help="'bench' (the barge-in bench's 3), 'all' (+9 more) or a list")
    parser.add_argument("--wpm", type=int, default=170, help="espeak-ng speaking rate")
    parser.add_argument("--alignments", type=int, default=8, help="onsets SILENCE + k x 20 ms, k < this")
    parser.add_argument("--silence-ms", default="320", help="the silence before each clip (comma-separated: each one "
                        "x every alignment; Silero's state after a longer silence differs)")
    parser.add_argument("--word-gap-ms", default=str(TurnDetectorConfig().barge_in_word_gap_ms),
                        help="barge_in_word_gap_ms values to compare (comma-separated)")
    parser.add_argument("--gap-db", default=str(TurnDetectorConfig().barge_in_gap_db),
                        help="barge_in_gap_db values to compare (comma-separated)")
    parser.add_argument("--word-db", default=str(TurnDetectorConfig().barge_in_word_db),
                        help="barge_in_word_db values to compare (comma-separated)")
    parser.add_argument("--noise-dbfs", type=float, default=None, help="white noise at this level under every input "
                        "(default: digital silence around the clips)")
    parser.add_argument("--repeat", type=int, default=1, help="each clip this many times in one input stream, "
                        "2.02 s apart (Silero's state carried over; `repeated`): only the interruptions are counted")
    parser.add_argument("--readers", default="none,pocketsphinx", help="none and/or pocketsphinx")
    parser.add_argument("--max-pause-ms", default=str(TurnDetectorConfig().barge_in_max_pause_ms),
                        help="barge_in_max_pause_ms values to compare (comma-separated; 'none': no pause bound)")
    parser.add_argument("--sets", default="", help="only these clip sets (comma-separated names; default all)")
    parser.add_argument("--lead-ms", type=int, default=150, help="the reply audio the client holds when a hold begins")
    parser.add_argument("--pause-over-ms", type=int, default=700, help="list the clips that pause the reply longer")
    parser.add_argument("--readings", action="store_true", help="also what the reader heard per clip (the early "
                        "reading of a one-word candidate: could its words tell a backchannel from an interruption's "
                        "first word?)")
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
    if args.sets:
        clips = {name: items for name, items in clips.items() if name in args.sets.split(",")}
    readers = {"none": None, "pocketsphinx": Readings(CommandSpotter())}
    for gap, gap_db, word_db, pause in itertools.product(
            (int(x) for x in args.word_gap_ms.split(",")), (float(x) for x in args.gap_db.split(",")),
            (float(x) for x in args.word_db.split(",")), args.max_pause_ms.split(",")):
        # no pause bound: longer than any hold (`max_hold_s` ends it first)
        cfg = TurnDetectorConfig(barge_in_word_gap_ms=gap, barge_in_gap_db=gap_db, barge_in_word_db=word_db,
                                 barge_in_max_pause_ms=60000 if pause == "none" else int(pause))
        for reader_name in args.readers.split(","):
            for name, items in clips.items():
                print(json.dumps({"word_gap_ms": gap, "gap_db": gap_db, "word_db": word_db, "max_pause_ms": pause,
                                  "reader": reader_name, "set": name,
                                  **_judge(name, items, cfg, vad, readers[reader_name], args)}), flush=True)


def _judge(name: str, items: list, cfg: TurnDetectorConfig, vad: CachedVad, reader, args) -> dict:
    """One clip set under one configuration: what interrupted, the pauses, the resumes, the audible stops."""
    stopped: Counter = Counter()
    resumed: Counter = Counter()
    over: Counter = Counter()
    pauses: list[int] = []
    stops: list[int] = []
    readings: dict[str, Counter] = {}
    silences = [int(ms) for ms in args.silence_ms.split(",")]
    for label, x in items:
        for silence in silences:
            for k in range(args.alignments):
                vad.key = (label, silence, k)
                if reader is not None:
                    reader.heard.clear()
                if args.repeat > 1:
                    stopped[label] += repeated(x, silence + 20 * k, cfg, vad, reader, args.repeat, args.noise_dbfs)
                    continue
                r = served(x, silence + 20 * k, cfg, vad, reader, args.lead_ms, args.noise_dbfs)
                if reader is not None:
                    readings.setdefault(label, Counter()).update(reader.heard or ["(not read)"])
                stopped[label] += r.interrupted
                resumed[label] += r.resumed
                if r.interrupted and r.stop_ms is not None:
                    stops.append(r.stop_ms)
                if not r.interrupted:
                    pauses.append(r.pause_ms)
                    over[label] += r.pause_ms > args.pause_over_ms
    per_clip = args.alignments * len(silences) * args.repeat
    interruptions = name in ("lone_commands", "interruptions")
    if interruptions:
        wrong = {label: per_clip - stopped[label] for label, _ in items if stopped[label] < per_clip}
    else:
        wrong = {label: n for label, n in stopped.items() if n}
    return {"trials": len(items) * per_clip, "stopped": sum(stopped.values()), "wrong_way": wrong,
            "pause_ms_p50": _p(pauses, 0.5), "pause_ms_max": _p(pauses, 1.0),
            f"pause_over_{args.pause_over_ms}": {label: n for label, n in over.items() if n},
            **({"resumed": sum(resumed.values()), "resumed_clips": {k: n for k, n in resumed.items() if n},
                "stop_ms_p50": _p(stops, 0.5), "stop_ms_max": _p(stops, 1.0)} if interruptions else {}),
            **({"readings": {k: dict(c.most_common()) for k, c in readings.items()}} if args.readings else {})}


if __name__ == "__main__":
    main()
