"""A stop command said alone over a playing reply: the guarded `TurnDetector` with and without its command reader.

`python3 -m bench.barge_in_commands [--voices all]`: every clip (espeak-ng, each voice) fed after 320 ms of
silence in 20 ms appends with the barge-in guard on (`bench.barge_in.trace`), and counted as an interruption
(SpeechStarted) or not. Clip sets: lone stop commands ("Stop.", "Wait.", "No.", "Hold on."), the barge-in bench's
longer interruptions, its backchannels and noise bursts, other short words in the reader's grammar, and held-out
short words that are not (a forced-choice grammar maps those to whichever sounds closest: the honest false-stop
rate). Prints one JSON line per (set, reader) with the interruption rate, and the clips that went the wrong way.
"""

from __future__ import annotations

import argparse
import json
import subprocess

import numpy as np
import soxr

from bench.barge_in import BACKCHANNELS, INTERRUPTIONS, VOICES, noise_bursts, trace
from bench.end_of_turn import espeak
from realtime_ming.audio.commands import CommandSpotter
from realtime_ming.audio.config import TurnDetectorConfig
from realtime_ming.audio.vad import SileroVad, create_silero_session

LONE = ("Stop.", "Wait.", "No.", "Hold on.")
OTHERS = ("hmm", "oh", "cool", "got it", "nice", "I know", "makes sense", "of course", "perfect", "fine", "uh",
          "wow", "oh really", "ha ha")
HELD_OUT = ("awesome", "seriously", "absolutely", "definitely", "sort of", "that's right", "love it", "uh yeah",
            "sounds fun", "true true", "hmm okay", "oh wow", "oh nice", "wonderful", "fantastic", "gosh", "yikes",
            "aha yes")
MORE_VOICES = ("en-gb-scotland", "en-029", "en-us-nyc", "en+f2", "en-gb-x-rp", "en-gb-x-gbclan", "en+f4",
               "en-us+m1", "en+klatt2")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--voices", default="bench", help="'bench' (the barge-in bench's 3), 'all' (+9 more) or a list")
    parser.add_argument("--wpm", type=int, default=170, help="espeak-ng speaking rate")
    args = parser.parse_args(argv)
    voices = {"bench": VOICES, "all": VOICES + MORE_VOICES}.get(args.voices) or tuple(args.voices.split(","))
    subprocess.run(["espeak-ng", "--version"], check=True, capture_output=True)
    vad, cfg = SileroVad(create_silero_session()), TurnDetectorConfig()
    to16 = lambda x: soxr.resample(x, 24000, 16000).astype(np.float32)
    sets = {"lone_commands": LONE, "interruptions": tuple(t for t in INTERRUPTIONS if t != "Stop."),
            "backchannels": BACKCHANNELS, "other_short_words": OTHERS, "held_out_short_words": HELD_OUT}
    clips = {name: [(f"{t} [{v}]", to16(espeak(t, v, wpm=args.wpm))) for t in texts for v in voices]
             for name, texts in sets.items()}
    clips["backchannels"] += list(zip(("cough", "click", "noise"), noise_bursts()))
    for reader_name, reader in (("none", None), ("pocketsphinx", CommandSpotter())):
        for name, items in clips.items():
            stopped = [label for label, x in items if trace(cfg, vad, x, reader).started_ms is not None]
            wrong = ([label for label, _ in items if label not in stopped] if name in ("lone_commands", "interruptions")
                     else stopped)
            print(json.dumps({"reader": reader_name, "set": name, "clips": len(items), "stopped": len(stopped),
                              "wrong_way": wrong}), flush=True)


if __name__ == "__main__":
    main()
