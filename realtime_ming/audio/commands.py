"""A spoken stop command said alone ("Stop.", "Wait.", "Hold on."): the words of a short barge-in candidate.

While a reply plays, the turn detector lets only speech that lasts (`barge_in_min_speech_ms`) or a second word
interrupt it, so that "mm-hmm", "yeah" and "okay" do not. A lone "Stop." is one short burst like them: by duration,
energy and voicing (Silero's windows) it cannot be told from "yeah" or "right" (docs/barge_in.md, measured). What
tells them apart is the word, so a short candidate the detector would drop is read by `CommandSpotter`: a small
closed-vocabulary recogniser (PocketSphinx with its bundled US English acoustic model and a JSGF grammar of stop
commands against backchannels and other short words). The grammar is a forced choice between the two lists, so the
second list is broad: a word that is in neither maps to whichever sounds closest, and every listed short word that
is not a command makes a false stop less likely.

`shared_command_spotter()` is the process-wide instance (built on first use, 0.2-1 s; a decode of a one-second
candidate takes ~10-30 ms of CPU, under a lock). Without the `pocketsphinx` package it returns None and a lone stop
word is treated as before (not an interruption), with one warning in the log.
"""

from __future__ import annotations

import logging
import os
import threading
from functools import lru_cache

import numpy as np

__all__ = ["COMMANDS", "NOT_COMMANDS", "CommandSpotter", "is_stop_command", "shared_command_spotter"]

log = logging.getLogger(__name__)

# What a person says alone to make a speaker stop (every word is in the model's pronunciation dictionary). Not
# "no": espeak-ng's "No." is read as "oh" (0 of 15 through the server's input path) while "mm-hmm" was read as "no"
# (2 of 15): measured, it only added false stops (docs/barge_in.md).
COMMANDS = ("stop", "wait", "hold on", "hang on")
# Backchannels, acknowledgements and other short words a listener says while a reply goes on.
NOT_COMMANDS = (
    "mhm", "uh-huh", "hmm", "hm", "mm", "uh", "um", "huh", "oh", "ah", "ooh", "aha", "wow",
    "yeah", "yes", "yep", "yup", "okay", "alright", "right", "sure", "true", "exactly", "totally", "really",
    "i see", "i know", "got it", "gotcha", "cool", "nice", "great", "good", "interesting", "go on", "of course",
    "fine", "makes sense", "sounds good", "fair enough", "for sure", "sweet", "super", "thanks", "ha ha",
)

# Pronunciations the dictionary lacks: "stop" with its final /p/ unreleased (common at the end of an utterance) and
# with the rounded vowel of British English.
_VARIANTS = (("stop(2)", "S T AA"), ("stop(3)", "S T AO P"), ("stop(4)", "S T AO"))


def _grammar(commands: tuple[str, ...], others: tuple[str, ...]) -> str:
    return ("#JSGF V1.0;\ngrammar barge_in;\npublic <utterance> = <command> | <other>;\n"
            f"<command> = {' | '.join(commands)};\n<other> = {' | '.join(others)};\n")


def trim(pcm16k: np.ndarray, below_peak_db: float = 40.0, margin_ms: int = 100) -> np.ndarray:
    """The audio from `margin_ms` before its first to `margin_ms` after its last 10 ms frame within `below_peak_db`
    of the loudest."""
    x = np.asarray(pcm16k, dtype=np.float32).reshape(-1)
    frames = x[: x.size // 160 * 160].reshape(-1, 160)
    if not frames.size:
        return x
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = np.flatnonzero(rms >= rms.max() * 10.0 ** (-below_peak_db / 20.0))
    margin = margin_ms // 10
    return frames[max(0, loud[0] - margin): loud[-1] + 1 + margin].reshape(-1)


class CommandSpotter:
    """Is a short utterance a stop command? Thread-safe (one decoder under a lock)."""

    def __init__(self, commands: tuple[str, ...] = COMMANDS, others: tuple[str, ...] = NOT_COMMANDS) -> None:
        """Raises ImportError without `pocketsphinx`, ValueError for a word not in its dictionary."""
        from pocketsphinx import Decoder, get_model_path

        model = os.path.join(get_model_path(), "en-us")
        words = {w for phrase in commands + others for w in phrase.split()}
        self._decoder = Decoder(hmm=os.path.join(model, "en-us"), dict=os.path.join(model, "cmudict-en-us.dict"),
                                lm=None, loglevel="FATAL", bestpath=False)  # a grammar search: no n-gram model
        missing = sorted(w for w in words if self._decoder.lookup_word(w) is None)
        if missing:
            raise ValueError(f"not in the pronunciation dictionary: {missing}")
        for word, phones in _VARIANTS:
            self._decoder.add_word(word, phones, False)
        self._decoder.add_jsgf_string("barge_in", _grammar(commands, others))
        self._decoder.activate_search("barge_in")
        self.commands = frozenset(commands)
        self._lock = threading.Lock()

    def heard(self, pcm16k: np.ndarray) -> str:
        """The grammar's best reading of float32 16 kHz mono audio ("" when nothing matched). The audio is cut to
        the sound (`trim`): long silence around a short word skews the decoder's cepstral mean."""
        pcm = np.clip(np.rint(trim(pcm16k) * 32767.0), -32768, 32767).astype("<i2")
        with self._lock:
            self._decoder.start_utt()
            self._decoder.process_raw(pcm.tobytes(), full_utt=True)
            self._decoder.end_utt()
            hyp = self._decoder.hyp()
        return "" if hyp is None else hyp.hypstr.strip()

    def __call__(self, pcm16k: np.ndarray) -> bool:
        """Whether the audio is one of the commands."""
        return self.heard(pcm16k) in self.commands


@lru_cache(maxsize=1)
def shared_command_spotter() -> CommandSpotter | None:
    """The process-wide spotter, or None when `pocketsphinx` is not installed (logged once)."""
    try:
        return CommandSpotter()
    except ImportError:
        log.warning("pocketsphinx is not installed: a stop word said alone over a reply is not an interruption")
        return None


def is_stop_command(pcm16k: np.ndarray) -> bool:
    """The shared spotter's answer (built on first use); False without `pocketsphinx`."""
    spotter = shared_command_spotter()
    return spotter is not None and spotter(pcm16k)
