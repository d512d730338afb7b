"""server_vad turn detection: 16 kHz float32 audio in, typed speech events out, clocked by samples.

`TurnDetector` cuts the input into the VAD's fixed windows (chunking never changes the result),
runs a hysteresis state machine over the window probabilities and reports times in integer ms of
the input stream (samples fed since construction). It never reads the wall clock.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from realtime_ming.audio.config import TurnDetectorConfig
from realtime_ming.audio.vad import VAD_SAMPLE_RATE_HZ, VadBackend

__all__ = [
    "TurnState",
    "SpeechStarted",
    "SpeechPaused",
    "SpeechResumed",
    "SpeechStopped",
    "TurnEvent",
    "TurnDetector",
]

_SAMPLES_PER_MS = VAD_SAMPLE_RATE_HZ // 1000
_PRE_ROLL_WINDOWS = 3  # windows kept before a candidate's first speech window (Silero's onset lags the sound)
_ONSET_MIN_RMS = 10.0 ** (-50.0 / 20.0)  # a sound onset is at least this loud (-50 dBFS)


class TurnState(enum.Enum):
    """Where the detector is inside a turn."""

    SILENCE = "silence"  # no speech
    PENDING = "pending"  # speech heard, shorter than min_speech_ms so far
    SPEECH = "speech"  # SpeechStarted emitted; possibly inside a short pause
    PAUSED = "paused"  # SpeechPaused emitted; waiting for SpeechResumed or SpeechStopped


@dataclass(slots=True, frozen=True)
class SpeechStarted:
    """Speech confirmed. `audio_start_ms` = speech start − prefix_padding_ms, clamped at 0."""

    audio_start_ms: int
    speech_start_ms: int  # first window with p >= threshold


@dataclass(slots=True, frozen=True)
class SpeechPaused:
    """Silence for speculative_pause_ms inside a turn; `at_ms` is where the silence began."""

    at_ms: int


@dataclass(slots=True, frozen=True)
class SpeechResumed:
    """Speech came back after SpeechPaused: any speculative turn must be discarded."""

    at_ms: int


@dataclass(slots=True, frozen=True)
class SpeechStopped:
    """Silence for silence_duration_ms: the turn is over.

    `audio_end_ms` = `speech_end_ms` + silence_duration_ms (OpenAI's convention: the end of the
    audio committed to the model includes the silence window); `speech_end_ms` is where the
    silence began.
    """

    audio_end_ms: int
    speech_end_ms: int


TurnEvent = SpeechStarted | SpeechPaused | SpeechResumed | SpeechStopped


class TurnDetector:
    """Sample-clocked server_vad state machine over a `VadBackend`.

    Invariants: events come in the order Started (Paused (Resumed | Stopped))* ... ; every
    SpeechStopped is preceded by exactly one SpeechPaused for that pause when speculation is on
    (both may come from the same `feed` call); Stopped is emitted once per turn. Not thread-safe.
    """

    def __init__(self, config: TurnDetectorConfig, vad: VadBackend,
                 command: Callable[[np.ndarray], bool] | None = None) -> None:
        """`command`: reads a short guarded candidate's audio (16 kHz float32, from just before its speech to
        `barge_in_word_gap_ms` into the gap after it: its one word is over) and says whether it is a stop command said
        alone ("Stop.", "Wait.": then it is an interruption, not a backchannel); None (or `config.barge_in_commands`
        off): never asked."""
        self.config = config
        self._vad = vad
        self._command = command if config.barge_in_commands else None
        self._guard = False  # a reply is playing: only a real interruption starts a turn
        self._recent: deque[np.ndarray] = deque(maxlen=_PRE_ROLL_WINDOWS)  # the last windows (pre-roll)
        self._candidate: list[np.ndarray] | None = None  # a guarded candidate's windows (pre-roll first)
        self._window = np.zeros(vad.window_num_samples, dtype=np.float32)  # [window] pending input
        self._num_buffered = 0
        self._num_samples = 0  # samples fed since construction (the stream clock)
        self._rms = 0.0  # the RMS of the window being stepped
        self.reset()

    @property
    def state(self) -> TurnState:
        """Current state."""
        return self._state

    @property
    def position_ms(self) -> int:
        """Milliseconds of audio fed so far."""
        return self._num_samples // _SAMPLES_PER_MS

    def reset(self) -> None:
        """Forget the current turn, buffered samples and VAD state; the stream clock keeps running."""
        self._vad.reset()
        self._state = TurnState.SILENCE
        self._num_buffered = 0
        self._speech_start = 0  # sample index of the first speech window of the turn
        self._num_pending_speech = 0  # speech samples counted while PENDING
        self._pending_gap = 0  # silent samples since the last speech window while PENDING (guarded)
        self._pending_resumed = False  # guarded candidate: speech came back after a gap
        self._quiet_gap = 0  # guarded candidate: samples of the current gap `barge_in_gap_db` below its loudest window
        self._candidate_peak = 0.0  # guarded candidate: its loudest window (RMS)
        self._word_over = False  # guarded candidate of one burst in a gap of `barge_in_word_gap_ms` (read once)
        self._silence_start: int | None = None  # sample index where the current silence began
        self._peak_rms = 0.0  # loudest window of the turn so far
        self._quiet_since: int | None = None  # start of the run of quiet windows ending at the last one
        self._recent.clear()
        self._candidate = None
        self._quiet_rms: float | None = None  # the level of the windows below the onset level (a moving average)
        self._loud = False  # the last window was at or above the onset level
        self._onset_left = 0  # samples a sound onset is still judged as a candidate (guarded, before the VAD's)

    def feed(self, pcm_f32: np.ndarray) -> list[TurnEvent]:
        """Feed float32 16 kHz mono samples [n] (any n); returns the events they complete."""
        samples = np.asarray(pcm_f32, dtype=np.float32).reshape(-1)
        events: list[TurnEvent] = []
        size = self._window.shape[0]
        pos = 0
        while pos < samples.shape[0]:
            take = min(size - self._num_buffered, samples.shape[0] - pos)
            self._window[self._num_buffered : self._num_buffered + take] = samples[pos : pos + take]
            self._num_buffered += take
            self._num_samples += take
            pos += take
            if self._num_buffered == size:
                self._num_buffered = 0
                end = self._num_samples
                rms = float(np.sqrt(np.mean(self._window**2)))
                self._track_quiet(rms, end - size)
                self._track_onset(rms, size)
                self._rms = rms
                self._step(self._vad.speech_prob(self._window), end - size, end, events)
                if self._command is not None:
                    self._recent.append(self._window.copy())
        return events

    @property
    def judging_barge_in(self) -> bool:
        """Guarded and a speech candidate (or a sound onset the VAD has not judged yet) is being judged: a reply
        may be about to be interrupted."""
        return self._guard and (self._state is TurnState.PENDING
                                or (self._state is TurnState.SILENCE and self._onset_left > 0))

    @property
    def barge_in_word_over(self) -> bool:
        """Guarded, the candidate's one burst was followed by a gap of `barge_in_word_gap_ms` and was not a stop
        command: speech now would be a second word (an interruption at once), silence up to `barge_in_max_gap_ms`
        drops it. The output hold is not needed for the word any more, only for a second word
        (`session.barge_in.OutputGate`: it ends once the listener's pause reaches `barge_in_max_pause_ms`)."""
        return self._guard and self._state is TurnState.PENDING and self._word_over

    def guard_barge_in(self, on: bool) -> None:
        """While on (a reply is playing), a turn starts only on a real interruption (see the config)."""
        self._guard = on

    def _pending_step(self, is_speech: bool, is_silence: bool, size: int) -> bool | None:
        """One window of a candidate: True = confirm it, False = drop it, None = keep listening."""
        cfg = self.config
        if not self._guard:
            if is_silence:
                return False
            if is_speech:
                self._num_pending_speech += size
            return self._num_pending_speech >= cfg.min_speech_ms * _SAMPLES_PER_MS or None
        word_gap = max(size, cfg.barge_in_word_gap_ms * _SAMPLES_PER_MS)
        self._candidate_peak = max(self._candidate_peak, self._rms)
        # The gap between two words is a pause in the sound: windows `barge_in_gap_db` below the candidate's loudest,
        # whatever Silero says of them (its probability lags the sound by a window or two after a word, and between the
        # syllables of "uh-huh" it can read windows as loud as the vowels as non-speech for 96 ms). The word after it
        # is speech within `barge_in_word_db` of that level (not the soft release of a final plosive: "perfec-t").
        self._quiet_gap += size if self._rms < self._candidate_peak * 10.0 ** (-cfg.barge_in_gap_db / 20.0) else 0
        if is_speech:
            if self._rms >= self._candidate_peak * 10.0 ** (-cfg.barge_in_word_db / 20.0):
                # a second word: loud speech again after `barge_in_word_gap_ms` (and at least a window) of quiet
                self._pending_resumed |= self._quiet_gap >= word_gap
                self._quiet_gap = 0
            self._pending_gap = 0
            self._num_pending_speech += size
        else:
            self._pending_gap += size
            if self._pending_gap > cfg.barge_in_max_gap_ms * _SAMPLES_PER_MS:
                return False
            if self._pending_gap >= word_gap and not self._word_over and not self._pending_resumed:
                # the one word is over: read it now (a stop command interrupts at once), not at the candidate's end
                self._word_over = True
                if self._is_command():
                    return True
        enough = self._num_pending_speech >= cfg.barge_in_min_speech_ms * _SAMPLES_PER_MS
        second_word = self._pending_resumed and is_speech and self._num_pending_speech >= 2 * cfg.min_speech_ms * _SAMPLES_PER_MS
        return enough or second_word or None

    def _is_command(self) -> bool:
        """A guarded candidate's one short burst is over: is it a stop command said alone?"""
        if self._candidate is None or self._num_pending_speech < 2 * self.config.min_speech_ms * _SAMPLES_PER_MS:
            return False
        assert self._command is not None
        return bool(self._command(np.concatenate(self._candidate)))

    def silence_ms(self) -> int:
        """Length of the silence the current turn is in (0 outside a turn or while speech goes on)."""
        if self._state not in (TurnState.SPEECH, TurnState.PAUSED) or self._silence_start is None:
            return 0
        return (self._num_samples - self._num_buffered - self._silence_start) // _SAMPLES_PER_MS

    def end_turn(self) -> SpeechStopped | None:
        """End the current turn now (an end-of-turn model judged it complete inside its silence).

        `speech_end_ms` is where the silence began, `audio_end_ms` the end of the windows seen so far.
        None (and no change) unless the turn is inside a silence.
        """
        if not self.silence_ms():
            return None
        end = (self._num_samples - self._num_buffered) // _SAMPLES_PER_MS
        assert self._silence_start is not None
        event = SpeechStopped(end, self._silence_start // _SAMPLES_PER_MS)
        self._state = TurnState.SILENCE
        self._silence_start = None
        return event

    def _track_onset(self, rms: float, size: int) -> None:
        """A window that rises `barge_in_onset_db` above the quiet level before it opens `barge_in_onset_ms` of
        candidate (guarded, outside a turn); the quiet level follows the windows below that."""
        cfg = self.config
        quiet = rms if self._quiet_rms is None else self._quiet_rms
        loud = rms >= max(quiet * 10.0 ** (cfg.barge_in_onset_db / 20.0), _ONSET_MIN_RMS)
        if loud and not self._loud and self._guard and self._state is TurnState.SILENCE:
            self._onset_left = cfg.barge_in_onset_ms * _SAMPLES_PER_MS
        else:
            self._onset_left = max(0, self._onset_left - size)
        self._loud = loud
        if not loud:
            self._quiet_rms = rms if self._quiet_rms is None else 0.9 * self._quiet_rms + 0.1 * rms

    def _track_quiet(self, rms: float, start: int) -> None:
        """Follow the run of windows `quiet_db` below the turn's loudest (outside a turn: nothing)."""
        if self._state is TurnState.SILENCE or not self.config.quiet_db:
            self._peak_rms, self._quiet_since = 0.0, None
            return
        self._peak_rms = max(self._peak_rms, rms)
        if rms < self._peak_rms * 10.0 ** (-self.config.quiet_db / 20.0):
            if self._quiet_since is None:
                self._quiet_since = start
        else:
            self._quiet_since = None

    def _silence_began(self, start: int) -> int:
        """Where the silence confirmed at window `start` began: back over the quiet windows just before it."""
        if self._quiet_since is None:
            return start
        return max(min(start, self._quiet_since), start - self.config.max_backdate_ms * _SAMPLES_PER_MS)

    def _step(self, prob: float, start: int, end: int, events: list[TurnEvent]) -> None:
        """Advance the state machine by one window [start, end) (sample indices) of probability `prob`."""
        cfg = self.config
        is_speech = prob >= cfg.threshold
        is_silence = prob < cfg.silence_threshold
        if self._state is TurnState.SILENCE:
            if not is_speech:
                return
            self._state = TurnState.PENDING
            self._speech_start = start
            self._num_pending_speech = 0
            self._pending_gap = 0
            self._pending_resumed = False
            self._quiet_gap = 0
            self._candidate_peak = 0.0
            self._word_over = False
            self._candidate = list(self._recent) if self._guard and self._command is not None else None
        if self._state is TurnState.PENDING:
            if self._candidate is not None:
                self._candidate.append(self._window.copy())
            verdict = self._pending_step(is_speech, is_silence, end - start)
            self._candidate = self._candidate if verdict is None else None
            if verdict is False:
                self._state = TurnState.SILENCE
                return
            if verdict:
                self._state = TurnState.SPEECH
                # a stop command said alone is confirmed in the gap after it: the silence began with the gap
                self._silence_start = None if is_speech else end - self._pending_gap
                start_ms = self._speech_start // _SAMPLES_PER_MS
                events.append(SpeechStarted(max(0, start_ms - cfg.prefix_padding_ms), start_ms))
            return
        # SPEECH or PAUSED. Between the two thresholds the current run (speech or silence) goes on.
        if is_speech:
            if self._state is TurnState.PAUSED:
                events.append(SpeechResumed(start // _SAMPLES_PER_MS))
                self._state = TurnState.SPEECH
            self._silence_start = None
            return
        if self._silence_start is None:
            if not is_silence:
                return
            self._silence_start = self._silence_began(start)
        silence = end - self._silence_start
        silence_start_ms = self._silence_start // _SAMPLES_PER_MS
        if (
            self._state is TurnState.SPEECH
            and cfg.speculative_pause_ms
            and silence >= cfg.speculative_pause_ms * _SAMPLES_PER_MS
        ):
            self._state = TurnState.PAUSED
            events.append(SpeechPaused(silence_start_ms))
        if silence >= cfg.silence_duration_ms * _SAMPLES_PER_MS:
            events.append(SpeechStopped(silence_start_ms + cfg.silence_duration_ms, silence_start_ms))
            self._state = TurnState.SILENCE
            self._silence_start = None
