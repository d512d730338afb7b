"""Audio stage configuration: turn-detection parameters (server_vad names, docs/protocol.md §3.3).

Frozen dataclasses; `__post_init__` raises ValueError naming the bad field. The session builds a
`TurnDetectorConfig` from its own settings and the client's `turn_detection` object.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TurnDetectorConfig"]


@dataclass(slots=True, frozen=True)
class TurnDetectorConfig:
    """Parameters of `TurnDetector` (all durations in ms of input audio)."""

    threshold: float = 0.5  # speech when the VAD probability is >= threshold
    # Silence when the probability is < max(threshold - hysteresis, 0.01) (Silero's own iterator rule).
    hysteresis: float = 0.15
    prefix_padding_ms: int = 300  # audio kept before the detected speech start
    silence_duration_ms: int = 500  # silence that ends the turn
    # A pause this long inside speech emits SpeechPaused (start a speculative turn); 0 disables.
    speculative_pause_ms: int = 120
    # Speech windows (p >= threshold) needed before SpeechStarted: clicks and coughs are not turns.
    min_speech_ms: int = 64
    # While a reply plays (`TurnDetector.guard_barge_in`), speech must be a real interruption before
    # SpeechStarted: `barge_in_min_speech_ms` of speech windows, or speech that resumes after a gap
    # (a second word); a gap longer than `barge_in_max_gap_ms` ends the candidate unheard. Measured on
    # espeak-ng (bench/barge_in.py): backchannels ("mm-hmm", "yeah", "okay") are one burst of 288-640 ms.
    barge_in_min_speech_ms: int = 700
    barge_in_max_gap_ms: int = 300
    # The gap that makes the speech after it a second word: at least this much below the speech threshold. A
    # two-syllable backchannel ("o-kay", "uh-huh") dips for one or two 32 ms Silero windows depending on where the
    # windows fall, the pause after a comma ("Wait, stop.", "Sorry, ...") lasts three or more. Through the server's
    # input path (the bench's 27 backchannel / noise clips at 8 alignments): a one-window gap let 10 of 135 start a
    # turn (5 alignments), 64 ms 5 of 216, 96 ms none, every longer interruption still interrupting
    # (bench/barge_in_commands.py, docs/barge_in.md).
    barge_in_word_gap_ms: int = 96
    # The word gap is a pause in the sound: it counts the windows this far below the candidate's loudest, whatever
    # Silero says of them (its state drifts over digital silence: after some histories it read the loud middle of
    # "uh-huh" [en-us+m3], -14 to -35 dBFS against -13 for its vowels, as a 96 ms gap, and the reply was cancelled).
    barge_in_gap_db: float = 25.0
    # A second word is speech this close to the candidate's loudest window after the word gap: the soft release of a
    # final plosive after its silent closure ("perfec-t", 23 dB down) is not one (docs/barge_in.md).
    barge_in_word_db: float = 15.0
    # A lone stop command ("Stop.", "Wait.", "Hold on.") is one short burst like a backchannel: when a
    # guarded candidate of one burst ends, its words are read (`audio/commands.py`, a closed-vocabulary
    # recogniser) and a stop command interrupts the reply. False: a lone stop word is a backchannel too.
    barge_in_commands: bool = True
    # The longest pause a candidate that is not (yet) an interruption makes the listener hear in a reply, once its one
    # word is over (a gap of `barge_in_word_gap_ms` after it, not a stop command): the output hold ends then, the
    # candidate stays open until `barge_in_max_gap_ms`, so a second word still interrupts (after the reply resumed for
    # a moment). Counted from when the client runs out of reply audio (the session's playback clock). Without it a
    # backchannel is held for its length plus the gap: "mm-hmm" (576-704 ms of speech) paused the reply 801-876 ms at
    # a 150 ms lead. Through the server's input path (bench/barge_in_commands.py, 12 voices x 8 phases): 700 let 4 of
    # 480 interruptions resume before their second word ("Hold on, that's wrong."), 750 none (docs/barge_in.md).
    barge_in_max_pause_ms: int = 750
    # While guarded, a sound onset (a window `barge_in_onset_db` above the quiet level before it, and above
    # -50 dBFS) is judged as a candidate for up to `barge_in_onset_ms` before the VAD calls it speech, so the
    # reply is held from the first window of a fricative or soft onset: Silero's first speech window of "Stop."
    # comes with the vowel, up to ~150 ms after the "s". A hold shorter than the client's lead is not heard.
    # With 96 ms the hold of "Stop." let go for up to 40 ms before Silero's first speech window at 53 of 96 clips
    # (12 voices x 8 alignments, the server's input path), and the reply's output caught up meanwhile: the listener
    # heard up to ~120 ms more (bench/barge_in.py --listener); with 128 ms never. 0 disables.
    barge_in_onset_ms: int = 128
    barge_in_onset_db: float = 12.0
    # Silero's probability decays for ~30-100 ms after speech ends. When it confirms silence, the silence
    # is dated back over the run of windows just before it that are this many dB below the turn's loudest
    # window (at most max_backdate_ms): the silence window then counts from where the sound stopped.
    # 0 disables (the silence starts at the first window below the silence threshold).
    quiet_db: float = 40.0
    max_backdate_ms: int = 150

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold: must be in [0, 1], got {self.threshold}")
        if not 0.0 <= self.hysteresis < 1.0:
            raise ValueError(f"hysteresis: must be in [0, 1), got {self.hysteresis}")
        for name in ("barge_in_gap_db", "barge_in_word_db"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.quiet_db < 0:
            raise ValueError(f"quiet_db: must be >= 0, got {self.quiet_db}")
        for name in ("prefix_padding_ms", "speculative_pause_ms", "min_speech_ms", "max_backdate_ms",
                     "barge_in_min_speech_ms", "barge_in_max_gap_ms", "barge_in_word_gap_ms", "barge_in_onset_ms",
                     "barge_in_max_pause_ms",
                     "barge_in_onset_db"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.silence_duration_ms <= 0:
            raise ValueError(f"silence_duration_ms: must be > 0, got {self.silence_duration_ms}")
        if self.speculative_pause_ms >= self.silence_duration_ms:
            raise ValueError(
                f"speculative_pause_ms: must be below silence_duration_ms ({self.silence_duration_ms}), "
                f"got {self.speculative_pause_ms}"
            )

    @property
    def silence_threshold(self) -> float:
        """Probability below which a window counts as silence."""
        return max(self.threshold - self.hysteresis, 0.01)
