"""The session's input side: wire audio → uncommitted 16 kHz buffer → server_vad turn signals.

`InputTurns` owns the decoder, the buffer and the turn detector, all on one sample clock
(16 kHz samples appended since the session started), and reports what the session acts on:
speech began (with the future user item id), paused, resumed, ended (with the turn's audio).

semantic_vad combines two judgements at a pause's decision point: Smart Turn's (prosody, on the decision
threads) and, where the engine offers it, the thinker's reading of the words (`TurnTask.JUDGE_TURN`, asked by
the session with the speculative reply: `expect_judgement`, answered by `on_judgement`). Prosody's "complete"
ends the turn only when the words agree (or their judgement is not in within the policy's `words_wait_ms`:
`words_deadline`, `poll`); words saying "not finished" leave the turn to the silence fallback. Prosody's
"incomplete" is overruled only by words that are sure (P >= the policy's `words_override`), at the decision point
or when their answer comes while the pause lasts; a judgement belongs to its pause (`expect_judgement`'s turn id)
and is forgotten when the pause ends, so a later pause never acts on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace

import numpy as np

from ..audio.commands import is_stop_command
from ..audio.denoise import Denoiser, suppression_level
from ..audio.end_of_turn import (
    EAGERNESS_POLICY,
    EndOfTurnPolicy,
    decision_pool,
    shared_smart_turn,
)
from ..audio.pcm import b64decode_audio
from ..audio.turns import (
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    TurnState,
)
from ..audio.vad import VadBackend
from ..protocol.audio_input import NoiseReduction, NoiseReductionType, ServerVad, TurnDetection
from ..protocol.ids import IdPrefix, new_id
from ..protocol.values import AudioFormat
from .audio_io import MODEL_SAMPLE_RATE_HZ, InputAudioBuffer, InputDecoder
from .config import VadSettings

__all__ = ["BufferFull", "InputTurns", "SpeechBegan", "SpeechEnded", "TurnSignal"]

log = logging.getLogger(__name__)
_SAMPLES_PER_MS = MODEL_SAMPLE_RATE_HZ // 1000
# Input kept before a possible speech start while the detector hears silence (prefix padding + slack).
_SILENCE_KEEP_MS = 500
# The most an append waits at the decision point for a running end-of-turn call (~ one 20-50 ms append):
# under load the session-audio threads, shared by every session, must not queue behind the model.
_DECISION_WAIT_S = 0.05


class BufferFull(Exception):
    """An append would exceed the buffer limit; nothing was buffered."""


@dataclass(frozen=True, slots=True)
class SpeechBegan:
    """Speech confirmed; `audio_start_ms` (session clock) includes prefix padding."""

    item_id: str
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechEnded:
    """The silence window completed: the turn's audio [16 kHz float32] and where it ends."""

    item_id: str
    audio_end_ms: int
    audio: np.ndarray


TurnSignal = SpeechBegan | SpeechPaused | SpeechResumed | SpeechEnded


class InputTurns:
    """Input buffer plus turn detection for one session (not thread-safe)."""

    def __init__(
        self,
        vad: VadSettings,
        make_vad: Callable[[str], VadBackend],
        max_buffer_s: float,
        end_of_turn: Callable[[np.ndarray], float] | None = None,
        decision_wait_s: float | None = _DECISION_WAIT_S,
        decisions: Executor | None = None,
    ) -> None:
        """`end_of_turn`: turn audio → P(complete) for semantic_vad (default: the shared Smart Turn), called on
        `decisions` (default: the process-wide `decision_pool`).

        `decision_wait_s`: how long `append` may wait at the decision point for a model call still running;
        past it `pending_decision` is that call, and its answer is taken by `poll` once it is done (or by a
        later append): the thread, shared by every session's audio, moves on. None waits for the answer."""
        if decision_wait_s is not None and decision_wait_s < 0:
            raise ValueError(f"decision_wait_s: must be >= 0 or None, got {decision_wait_s}")
        self._vad = vad
        self._end_of_turn = end_of_turn
        self._decision_wait_s = decision_wait_s
        self._decisions = decisions
        self._eagerness_policy: EndOfTurnPolicy | None = None  # semantic_vad only
        self._policy: EndOfTurnPolicy | None = None  # the one in force (`with_words()` where words are judged)
        self._decided = False  # Smart Turn already answered during the current pause
        self._call: Future | None = None  # the current pause's one Smart Turn call (started early_ms ahead)
        self.last_decision: tuple[float, float] | None = None  # (P(complete), CPU ms) of the latest call
        self._call_at: tuple[float, int] = (0.0, 0)  # (monotonic s, silence ms) when the current call started
        self._due_at: float | None = None  # monotonic s when the current pause reached its decision point
        self._judge_id: str | None = None  # the words judgement asked for the current pause (its turn id)
        self._words: float | None = None  # its P(complete), once in
        self._prosody_complete = False  # Smart Turn said complete; the turn waits for the words judgement
        self._prosody_incomplete = False  # Smart Turn said incomplete; sure words may still end the turn
        self.last_words: tuple[float | None, bool] | None = None  # (P(complete) or None if not in, turn ended)
        self._words_judged = False
        self._make_vad = make_vad
        self._max_buffer_ms = max_buffer_s * 1000.0
        self._buffer = InputAudioBuffer()
        self._decoder: InputDecoder | None = None
        self._denoiser: Denoiser | None = None  # audio.input.noise_reduction
        self._detector: TurnDetector | None = None
        self._origin = 0  # session sample index where the detector's clock starts
        self._speech_item_id: str | None = None  # id announced with SpeechBegan
        self._speech_start = 0  # session sample index of the turn's audio start (with padding)

    @property
    def buffered_ms(self) -> float:
        """Uncommitted audio held."""
        return self._buffer.num_samples / _SAMPLES_PER_MS

    @property
    def position_ms(self) -> int:
        """The session's input clock: ms of 16 kHz audio received since the session started."""
        return self._buffer.end_sample // _SAMPLES_PER_MS

    @property
    def in_speech(self) -> bool:
        """The detector is inside a (possible) turn."""
        return self._detector is not None and self._detector.state is not TurnState.SILENCE

    @property
    def words_judged(self) -> bool:
        """The session asks a words judgement at each pause (the engine offers JUDGE_TURN; set by the session): the
        policy's `words_decide_after_ms` is in force, and a decision point reached in the append that announced the
        pause waits for the next append or `poll`, so the judgement is asked first (Silero's silence can pass both
        the 120 ms pause and the decision point in one 20 ms append)."""
        return self._words_judged

    @words_judged.setter
    def words_judged(self, on: bool) -> None:
        self._words_judged = on
        self._set_policy()

    def _set_policy(self) -> None:
        base = self._eagerness_policy
        self._policy = None if base is None else base.with_words() if self._words_judged else base

    @property
    def judging_barge_in(self) -> bool:
        """A guarded speech candidate is being judged (the reply's output is held meanwhile)."""
        return self._detector is not None and self._detector.judging_barge_in

    @property
    def barge_in_word_over(self) -> bool:
        """That candidate's one word is over (`TurnDetector.barge_in_word_over`)."""
        return self._detector is not None and self._detector.barge_in_word_over

    def configure(self, fmt: AudioFormat, turn_detection: TurnDetection) -> None:
        """Set the input format and turn detection (a new detector starts on the current clock)."""
        if self._decoder is None or self._decoder.format != fmt:
            self._decoder = InputDecoder(fmt)
        self._speech_item_id = None
        self._drop_call()
        if turn_detection is None:
            self._detector = None
            return
        base = self._vad.detector
        if isinstance(turn_detection, ServerVad):
            self._eagerness_policy = None
            self._set_policy()
            threshold, prefix_ms = turn_detection.threshold, turn_detection.prefix_padding_ms
            silence_ms = turn_detection.silence_duration_ms
        else:
            self._eagerness_policy = EAGERNESS_POLICY[turn_detection.eagerness.value]
            self._set_policy()
            threshold, prefix_ms = base.threshold, base.prefix_padding_ms
            silence_ms = self._policy.fallback_ms
            if self._end_of_turn is None:
                self._end_of_turn = shared_smart_turn().predict
        silence_ms = max(silence_ms, 1)
        cfg = replace(
            base,
            threshold=threshold,
            prefix_padding_ms=prefix_ms,
            silence_duration_ms=silence_ms,
            speculative_pause_ms=min(base.speculative_pause_ms, silence_ms - 1),
        )
        self._detector = TurnDetector(cfg, self._make_vad(self._vad.backend), is_stop_command)
        self._origin = self._buffer.end_sample

    def set_noise_reduction(self, setting: NoiseReduction | None) -> None:
        """Denoise the input (`audio/denoise.py`) before VAD and the buffer, or stop (`None`); a changed
        setting starts a fresh denoiser. Raises denoise.DenoiserUnavailable (nothing changes then)."""
        if setting is None:
            self._denoiser = None
            return
        strength = 1.0 if setting.strength is None else setting.strength
        self._denoiser = Denoiser(suppression_level(strength), auto_gain=setting.type is NoiseReductionType.FAR_FIELD)

    def guard_barge_in(self, on: bool) -> None:
        """A reply is playing (and may be interrupted): backchannels must not start a turn."""
        if self._detector is not None:
            self._detector.guard_barge_in(on)

    def append(self, b64: str) -> list[TurnSignal]:
        """Decode and buffer one base64 append; raises pcm.AudioFormatError or BufferFull."""
        assert self._decoder is not None
        data = b64decode_audio(b64)
        if self.buffered_ms + self._decoder.duration_ms(len(data)) > self._max_buffer_ms:
            raise BufferFull
        samples = self._decoder.decode(data)
        return self._append(samples if self._denoiser is None else self._denoiser.process(samples))

    def _append(self, samples: np.ndarray) -> list[TurnSignal]:
        # Every buffered sample is fed to the detector, so its clock stays aligned with the buffer's.
        self._buffer.append(samples)
        if self._detector is None:
            return []
        signals = [self._signal(event) for event in self._detector.feed(samples)]
        if not self._detector.silence_ms() or any(
            isinstance(signal, SpeechResumed | SpeechBegan | SpeechEnded) for signal in signals
        ):
            self._drop_call()  # the pause is over (speech came back, or the turn ended): its call is obsolete
        self._start_end_of_turn()
        if self.words_judged and any(isinstance(signal, SpeechPaused) for signal in signals):
            stopped = None  # the session asks the words first; `pending_decision` / the next append decide
        else:
            stopped = self._judge_end_of_turn() or self._words_decision()
        if stopped is not None:
            signals.append(self._signal(stopped))
        if self._detector.state is TurnState.SILENCE:
            keep = (self._detector.config.prefix_padding_ms + _SILENCE_KEEP_MS) * _SAMPLES_PER_MS
            self._buffer.drop_before(self._buffer.end_sample - keep)
        return signals

    @property
    def pending_decision(self) -> Future | None:
        """The end-of-turn call a past decision point still waits for (call `poll` when it is done)."""
        detector, policy, call = self._detector, self._policy, self._call
        if call is None or self._decided or policy is None or detector is None:
            return None
        return call if detector.silence_ms() >= policy.decide_after_ms else None

    def poll(self) -> list[TurnSignal]:
        """Take a pending decision's answer if it is there, or give up waiting for a words judgement whose
        `words_deadline` passed (never waits): [SpeechEnded] if it ends the turn."""
        stopped = None
        if self._call is not None and self._call.done():
            stopped = self._judge_end_of_turn()
        stopped = stopped or self._words_decision()
        return [] if stopped is None else [self._signal(stopped)]

    # ---- the words judgement (semantic_vad, where the engine offers it) ----------------------------------
    def expect_judgement(self, turn_id: str) -> bool:
        """The session may ask the engine to judge the words of the current pause (turn `turn_id`): True when
        that judgement will be used (semantic_vad, a pause going on, its decision not taken yet or prosody's
        "incomplete", which sure words may still overrule while the pause lasts)."""
        detector = self._detector
        if (self._policy is None or detector is None or not self.in_speech or not detector.silence_ms()
                or (self._decided and not self._prosody_incomplete)):
            return False
        self._judge_id, self._words = turn_id, None
        return True

    def on_judgement(self, turn_id: str, p_complete: float | None) -> list[TurnSignal]:
        """The words judgement `turn_id` answered (None: it failed, or was cancelled): [SpeechEnded] if the turn
        ends now. A superseded pause's judgement is dropped."""
        if turn_id != self._judge_id or self._words is not None:
            log.debug("turn judgement %s dropped: its pause is over", turn_id)
            return []
        if p_complete is None:  # no words judgement after all: prosody decides alone
            self._judge_id = None
        else:
            self._words = p_complete
        stopped = self._words_decision()
        return [] if stopped is None else [self._signal(stopped)]

    @property
    def words_deadline(self) -> float | None:
        """Monotonic s at which prosody's "complete" stops waiting for the words judgement (None: not waiting)."""
        if (not self._prosody_complete or self._judge_id is None or self._words is not None or self._due_at is None
                or self._policy is None):
            return None
        return self._due_at + self._policy.words_wait_ms / 1e3

    def _words_decision(self) -> SpeechStopped | None:
        """Prosody said complete: end the turn if the words agree, or their judgement was not asked for or did not
        come in time; keep it going if they say the user is not finished. Prosody said incomplete: end it only if
        the words are sure it is complete."""
        detector, policy = self._detector, self._policy
        if detector is None or policy is None:
            return None
        if self._prosody_incomplete:
            return self._words_overrule(policy)
        if not self._prosody_complete:
            return None
        deadline = self.words_deadline
        if deadline is not None:
            if time.monotonic() < deadline:
                return None
            log.debug("turn judgement %s not in %d ms after the decision point: prosody decides alone",
                      self._judge_id, policy.words_wait_ms)
        self._prosody_complete = False
        if self._words is not None and self._words < policy.words_threshold:
            log.debug("turn judgement %s: the words are not finished (p=%.2f < %.2f); waiting for the user or the "
                      "%d ms silence fallback", self._judge_id, self._words, policy.words_threshold, policy.fallback_ms)
            self.last_words = (self._words, False)
            return None
        self.last_words = (self._words, True)
        return self._end_turn(policy)

    def _words_overrule(self, policy: EndOfTurnPolicy) -> SpeechStopped | None:
        """Prosody said incomplete: the words end the turn if their P(complete) >= `words_override`."""
        if policy.words_override is None or self._words is None or self._words < policy.words_override:
            return None
        log.debug("turn judgement %s overrules prosody's \"incomplete\" (p=%.2f >= %.2f)", self._judge_id,
                  self._words, policy.words_override)
        self._prosody_incomplete = False
        self.last_words = (self._words, True)
        return self._end_turn(policy)

    def _end_turn(self, policy: EndOfTurnPolicy) -> SpeechStopped | None:
        assert self._detector is not None
        stopped = self._detector.end_turn()
        if stopped is None:
            return None
        # A late answer (audio came faster than real time, or a model was slow) ends the turn where it would
        # have ended on time: the audio after the decision point is this pause's silence.
        return replace(stopped, audio_end_ms=min(stopped.audio_end_ms, stopped.speech_end_ms + policy.decide_after_ms))

    def _drop_call(self) -> None:
        """Forget the current pause's call and words judgement; a call not started yet never runs (the decision
        threads only ever serve pauses still going on: under load, obsolete work is shed instead of queued)."""
        if self._call is not None:
            self._call.cancel()
        self._decided, self._call, self._due_at = False, None, None
        self._judge_id, self._words, self._prosody_complete, self._prosody_incomplete = None, None, False, False

    def _start_end_of_turn(self) -> None:
        """semantic_vad: at `start_after_ms` of silence, start the pause's one Smart Turn call (off this thread)."""
        detector, policy = self._detector, self._policy
        if policy is None or detector is None or self._decided or self._call is not None or self._end_of_turn is None:
            return
        if detector.silence_ms() >= policy.start_after_ms:
            self._call = self._submit_call()

    def _submit_call(self) -> Future:
        assert self._end_of_turn is not None
        pool = self._decisions or decision_pool()
        assert self._detector is not None
        self._call_at = (time.monotonic(), self._detector.silence_ms())
        return pool.submit(self._timed_call, self._end_of_turn, self.speech_so_far())

    @staticmethod
    def _timed_call(model: Callable[[np.ndarray], float], audio: np.ndarray) -> tuple[float, float, float, float]:
        """(P(complete), CPU ms, monotonic s when the call left the queue, when it ended)."""
        began, started = time.monotonic(), time.thread_time()
        prob = model(audio)
        return prob, (time.thread_time() - started) * 1000.0, began, time.monotonic()

    def _judge_end_of_turn(self) -> SpeechStopped | None:
        """semantic_vad: once per pause, from `decide_after_ms` of silence on, take the end-of-turn model's
        answer: waiting up to `decision_wait_s` for the call started `early_ms` before, else on `poll` or a later
        append once the call is done (a late "complete" still ends the turn; the silence fallback ends it whatever
        the model says). Later appends wait again only while the audio past the decision point runs ahead of the
        wall time since it (a burst client): a real-time 20 ms stream that waited 50 ms on each fell ever further
        behind real time."""
        detector, policy = self._detector, self._policy
        if policy is None or detector is None or self._decided or self._end_of_turn is None:
            return None
        if detector.silence_ms() < policy.decide_after_ms:
            return None
        first = self._due_at is None
        if first:
            self._due_at = time.monotonic()
        if self._call is None:  # the silence reached both points in one append
            self._call = self._submit_call()
        call = self._call
        if not call.done():
            timeout = self._decision_wait_s
            if not first and timeout is not None:
                # waited once already: wait again only while the audio runs ahead of real time (a burst
                # client), so its audio-time semantics hold; a real-time stream never waits twice
                ahead_s = (detector.silence_ms() - policy.decide_after_ms) / 1e3 - (time.monotonic() - self._due_at)
                timeout = min(timeout, ahead_s)
                if timeout <= 0:
                    return None
            try:
                call.exception(timeout=timeout)
            except TimeoutError:
                return None
        self._decided, self._call = True, None
        try:
            prob, cpu_ms, began, ended = call.result()
        except Exception:  # the silence fallback still ends the turn; one log line, never a lost session
            log.exception("end-of-turn model failed; waiting for the %d ms silence fallback", policy.fallback_ms)
            return None
        self.last_decision = (prob, cpu_ms)
        if log.isEnabledFor(logging.DEBUG):
            now, (submitted, at_ms) = time.monotonic(), self._call_at
            log.debug("end-of-turn decision p=%.2f: call started at %d ms of silence, queued %.1f ms, ran %.1f ms "
                      "(%.1f CPU ms), answer taken %.1f ms after it; %.1f ms after the %d ms decision point's audio",
                      prob, at_ms, (began - submitted) * 1e3, (ended - began) * 1e3, cpu_ms, (now - ended) * 1e3,
                      (now - (self._due_at or now)) * 1e3, policy.decide_after_ms)
        if prob < policy.threshold:
            self._prosody_incomplete = True  # the silence fallback ends the turn, unless the words are sure
            return self._words_decision()
        self._prosody_complete = True  # ends the turn unless the words judgement says otherwise
        return self._words_decision()

    def _abs_sample(self, ms: int) -> int:
        return self._origin + ms * _SAMPLES_PER_MS

    def _signal(self, event) -> TurnSignal:
        if isinstance(event, SpeechStarted):
            self._speech_item_id = new_id(IdPrefix.ITEM)
            self._speech_start = self._abs_sample(event.audio_start_ms)
            return SpeechBegan(self._speech_item_id, self._speech_start // _SAMPLES_PER_MS)
        if isinstance(event, SpeechStopped):
            item_id = self._speech_item_id or new_id(IdPrefix.ITEM)
            end = self._abs_sample(event.audio_end_ms)
            audio = self._buffer.take(self._speech_start, end)
            self._buffer.drop_before(end)
            self._speech_item_id = None
            return SpeechEnded(item_id, end // _SAMPLES_PER_MS, audio)
        return event

    def speech_so_far(self) -> np.ndarray:
        """The current turn's audio from its (padded) start to now (for a speculative turn)."""
        return self._buffer.take(self._speech_start, self._buffer.end_sample)

    def flush(self) -> None:
        """End of the input stream (a manual commit): buffer what the resampler still holds.

        Detector events of this tail are moot: a commit resets turn detection.
        """
        assert self._decoder is not None
        tail = self._decoder.flush()
        if self._denoiser is not None:
            tail = np.concatenate([self._denoiser.process(tail), self._denoiser.flush()])
        self._append(tail)

    def commit(self) -> tuple[str, np.ndarray]:
        """Take everything buffered as one user turn: (item id, 16 kHz audio); resets detection.

        The item id is the one announced by speech_started, if speech is in progress.
        """
        item_id = self._speech_item_id or new_id(IdPrefix.ITEM)
        audio = self._buffer.take(0, self._buffer.end_sample)
        self.clear()
        return item_id, audio

    def clear(self, *, reset_decoder: bool = False) -> None:
        """Drop buffered audio and restart turn detection (the sample clock keeps running)."""
        self._buffer.clear()
        self._speech_item_id = None
        self._drop_call()
        if self._detector is not None:
            self._detector.reset()
        if reset_decoder and self._decoder is not None:
            self._decoder.reset()
        if reset_decoder and self._denoiser is not None:
            self._denoiser.reset()
