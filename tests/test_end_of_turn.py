"""Smart Turn v3.2 (the vendored ONNX) and semantic_vad's policy in the session's InputTurns.

The model is checked on espeak-ng speech against its own single-clip predictions (batching, threads)
and on the feature layout it was trained with; the policy is checked with a scripted predictor so
every branch (complete at the decision point, incomplete → fallback, eagerness) is exercised.
"""

from __future__ import annotations

import base64
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from server_support import EnergyVad, espeak, silence, tone

from realtime_ming.audio.end_of_turn import (
    EAGERNESS_POLICY,
    SMART_TURN_WINDOW_SAMPLES,
    SmartTurn,
    smart_turn_features,
)
from realtime_ming.audio.mel import log_mel_spectrogram, slaney_mel_filterbank
from realtime_ming.protocol.audio_input import Eagerness, SemanticVad
from realtime_ming.protocol.values import AudioFormat
from realtime_ming.session.config import VadSettings
from realtime_ming.session.input import InputTurns, SpeechEnded

MODEL_HZ = 16000


@pytest.fixture(scope="module")
def smart_turn() -> SmartTurn:
    return SmartTurn()


@pytest.fixture(scope="module")
def question(tmp_path_factory) -> np.ndarray:
    return espeak("What time is it?", tmp_path_factory.mktemp("eot"), rate_hz=MODEL_HZ)


def test_features_are_the_last_8_s_left_padded_and_normalised():
    """[80, 800]; short audio is padded in front (the end lines up), long audio keeps its last 8 s."""
    rng = np.random.default_rng(0)
    short = rng.normal(0, 0.1, MODEL_HZ).astype(np.float32)
    feats = smart_turn_features(short)
    assert feats.shape == (80, 800) and feats.dtype == np.float32
    padded = np.concatenate([np.zeros(SMART_TURN_WINDOW_SAMPLES - short.size, np.float32), short])
    np.testing.assert_allclose(feats, smart_turn_features(padded), atol=1e-6)
    long = rng.normal(0, 0.1, 2 * SMART_TURN_WINDOW_SAMPLES).astype(np.float32)
    np.testing.assert_allclose(smart_turn_features(long), smart_turn_features(long[-SMART_TURN_WINDOW_SAMPLES:]), atol=1e-6)
    # Whisper's dynamic range: the floor is 8 log10 units below the peak, scaled by 1/4.
    assert feats.max() - feats.min() <= 2.0 + 1e-5


def _window(audio: np.ndarray) -> np.ndarray:
    x = np.asarray(audio, np.float32)[-SMART_TURN_WINDOW_SAMPLES:]
    x = np.pad(x, (SMART_TURN_WINDOW_SAMPLES - x.size, 0))
    return (x - x.mean()) / np.sqrt(x.var() + 1e-7)


def _whisper_frontend_features(audio: np.ndarray) -> np.ndarray:
    """The fixture-checked torch `log_mel_spectrogram` (whisper's frontend, float32) with 80 bins."""
    return log_mel_spectrogram(_window(audio), filters=torch.from_numpy(slaney_mel_filterbank(num_bins=80))).T.numpy()


def _float64_features(audio: np.ndarray) -> np.ndarray:
    """The straightforward computation, in float64 as transformers' WhisperFeatureExtractor does it: dense
    frames x periodic Hann, rfft, power, dense filterbank, log10, floor at max - 8, (x + 4) / 4."""
    padded = np.pad(_window(audio).astype(np.float64), 200, mode="reflect")
    frames = np.stack([padded[i * 160: i * 160 + 400] for i in range(800)])
    power = np.abs(np.fft.rfft(frames * np.hanning(401)[:-1], axis=-1)) ** 2
    log_spec = np.log10(np.maximum(slaney_mel_filterbank(num_bins=80).astype(np.float64) @ power.T, 1e-10))
    return ((np.maximum(log_spec, log_spec.max() - 8.0) + 4.0) / 4.0).astype(np.float32)


def test_features_equal_the_whisper_frontend_and_so_do_the_probabilities(smart_turn, question):
    """The single-threaded numpy features equal the whisper frontend (to float32 rounding) on espeak-ng
    speech and noise, and the model's probabilities on them equal those on float64 features within 1e-3.
    (The int8 model turns ~1e-5 feature differences into up to ~0.04 of probability on some clips: the
    torch float32 frontend gives 0.32 where float64 gives 0.36 on the 8-sentence clip; ours gives 0.36.)"""
    rng = np.random.default_rng(1)
    clips = [
        np.concatenate([question, silence(0.2, MODEL_HZ)]),
        question[: question.size // 2],
        np.concatenate([silence(1.0, MODEL_HZ)] + [question, silence(0.1, MODEL_HZ)] * 8),
        rng.normal(0, 0.05, 3 * MODEL_HZ).astype(np.float32),
    ]
    assert clips[2].size > SMART_TURN_WINDOW_SAMPLES  # one clip is cut to its last 8 s
    ours = np.stack([smart_turn_features(c) for c in clips])
    np.testing.assert_allclose(ours, np.stack([_whisper_frontend_features(c) for c in clips]), atol=1e-4)
    exact = np.stack([_float64_features(c) for c in clips])
    np.testing.assert_allclose(ours, exact, atol=2e-5)
    np.testing.assert_allclose(smart_turn._run(ours), smart_turn._run(exact), atol=1e-3)


def test_complete_question_scores_complete_and_batches_agree(smart_turn, question):
    """A finished question with 200 ms of trailing silence scores above 0.5; batch == single calls."""
    clip = np.concatenate([question, silence(0.2, MODEL_HZ)])
    p = smart_turn.predict(clip)
    assert 0.5 < p <= 1.0
    cut = question[: question.size // 3]
    batch = smart_turn.predict_batch([clip, cut])
    np.testing.assert_allclose(batch, [p, smart_turn.predict(cut)], atol=1e-4)


def test_concurrent_predicts_get_the_single_clip_answer(question):
    """Threads calling predict at once (two runs in parallel, late callers batched) each get, within 1e-3,
    the probability a lone one-clip ONNX call gives their own clip (real espeak-ng speech)."""
    model = SmartTurn(max_concurrent=2, max_batch=2)
    clips = [np.concatenate([question[: question.size * k // 4], silence(0.2, MODEL_HZ)]) for k in range(1, 5)]
    expected = [float(model.predict_batch([c])[0]) for c in clips]
    got: dict[int, float] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, model.predict(clips[i]))) for i in range(len(clips))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    np.testing.assert_allclose([got[i] for i in range(len(clips))], expected, atol=1e-3)
    assert max(expected) - min(expected) > 0.1  # the clips differ: a mixed-up answer would show


def _turns(eagerness: Eagerness, prob: float, calls: list[int]) -> InputTurns:
    def judge(audio: np.ndarray) -> float:
        calls.append(audio.size)
        return prob

    turns = InputTurns(VadSettings(), lambda _kind: EnergyVad(), 60.0, end_of_turn=judge)
    turns.configure(AudioFormat(sample_rate_hz=MODEL_HZ), SemanticVad(eagerness=eagerness))
    return turns


def _timed_appends(turns: InputTurns, audio: np.ndarray, chunk_ms: int = 20):
    """Stream 16 kHz audio as PCM16 appends; yields (end sample of the chunk, its signals, seconds the append took)."""
    step = MODEL_HZ * chunk_ms // 1000
    for i in range(0, audio.size, step):
        pcm = (np.clip(audio[i: i + step], -1, 1) * 32767).astype(np.int16)
        started = time.monotonic()
        signals = turns.append(base64.b64encode(pcm.tobytes()).decode())
        yield i + step, signals, time.monotonic() - started


def _ends_ms(turns: InputTurns, audio: np.ndarray, chunk_ms: int = 20) -> list[int]:
    """Stream 16 kHz audio; ms (from the start of `audio`) at which each SpeechEnded is reported."""
    return [end * 1000 // MODEL_HZ for end, signals, _ in _timed_appends(turns, audio, chunk_ms)
            for signal in signals if isinstance(signal, SpeechEnded)]


@pytest.mark.parametrize("eagerness", list(Eagerness))
def test_semantic_vad_complete_ends_at_the_decision_point(eagerness):
    """P(complete) >= threshold: the turn ends decide_after_ms into the silence, one model call."""
    policy = EAGERNESS_POLICY[eagerness.value]
    calls: list[int] = []
    turns = _turns(eagerness, 0.99, calls)
    ends = _ends_ms(turns, np.concatenate([silence(0.3, MODEL_HZ), tone(0.6, MODEL_HZ), silence(9.0, MODEL_HZ)]))
    assert len(ends) == 1 and len(calls) == 1
    assert 900 + policy.decide_after_ms <= ends[0] <= 900 + policy.decide_after_ms + 100
    assert turns.last_decision is not None and turns.last_decision[0] == 0.99


@pytest.mark.parametrize("eagerness", list(Eagerness))
def test_semantic_vad_incomplete_waits_for_the_eagerness_fallback(eagerness):
    """P(complete) below threshold: the turn ends only after OpenAI's max wait (8 / 4 / 2 s)."""
    policy = EAGERNESS_POLICY[eagerness.value]
    assert policy.fallback_ms == {"low": 8000, "medium": 4000, "auto": 4000, "high": 2000}[eagerness.value]
    calls: list[int] = []
    turns = _turns(eagerness, 0.0, calls)
    ends = _ends_ms(turns, np.concatenate([silence(0.3, MODEL_HZ), tone(0.6, MODEL_HZ), silence(9.0, MODEL_HZ)]))
    assert len(ends) == 1 and len(calls) == 1
    assert 900 + policy.fallback_ms <= ends[0] <= 900 + policy.fallback_ms + 100


def test_semantic_vad_pause_then_more_speech_is_one_turn():
    """An incomplete judgement in a mid-sentence pause, then speech: one turn, judged again at its end."""
    calls: list[int] = []
    turns = _turns(Eagerness.HIGH, 0.0, calls)
    audio = np.concatenate([tone(0.6, MODEL_HZ), silence(0.7, MODEL_HZ), tone(0.6, MODEL_HZ), silence(3.0, MODEL_HZ)])
    ends = _ends_ms(turns, audio)
    assert len(ends) == 1 and ends[0] >= 1900 + EAGERNESS_POLICY["high"].fallback_ms
    assert len(calls) == 2


def test_semantic_vad_low_never_judges_a_pause_shorter_than_800_ms():
    """eagerness low asks only after 800 ms of silence: a 700 ms pause is never a turn end."""
    calls: list[int] = []
    turns = _turns(Eagerness.LOW, 1.0, calls)
    audio = np.concatenate([tone(0.6, MODEL_HZ), silence(0.7, MODEL_HZ), tone(0.6, MODEL_HZ), silence(1.5, MODEL_HZ)])
    ends = _ends_ms(turns, audio)
    assert len(ends) == 1 and len(calls) == 1
    assert 1900 + 800 <= ends[0] <= 1900 + 900


def test_semantic_vad_model_failure_falls_back_to_silence(caplog):
    """An end-of-turn model that raises costs one log line; the turn still ends at the fallback."""
    def broken(audio: np.ndarray) -> float:
        raise RuntimeError("onnxruntime failed")

    turns = InputTurns(VadSettings(), lambda _kind: EnergyVad(), 60.0, end_of_turn=broken)
    turns.configure(AudioFormat(sample_rate_hz=MODEL_HZ), SemanticVad(eagerness=Eagerness.HIGH))
    ends = _ends_ms(turns, np.concatenate([tone(0.6, MODEL_HZ), silence(2.5, MODEL_HZ)]))
    assert len(ends) == 1 and 600 + 2000 <= ends[0] <= 600 + 2100
    assert "end-of-turn model failed" in caplog.text


def test_semantic_vad_model_call_starts_early_ms_before_the_decision_on_another_thread():
    """The pause's call starts at start_after_ms of silence (audio heard by then) on a decision thread,
    and its answer is taken at decide_after_ms: the model's CPU overlaps the rest of the wait."""
    policy = EAGERNESS_POLICY["auto"]
    seen: list[tuple[int, str]] = []

    def judge(audio: np.ndarray) -> float:
        seen.append((audio.size, threading.current_thread().name))
        return 0.99

    turns = InputTurns(VadSettings(), lambda _kind: EnergyVad(), 60.0, end_of_turn=judge)
    turns.configure(AudioFormat(sample_rate_hz=MODEL_HZ), SemanticVad(eagerness=Eagerness.AUTO))
    ends = _ends_ms(turns, np.concatenate([silence(0.3, MODEL_HZ), tone(0.6, MODEL_HZ), silence(2.0, MODEL_HZ)]))
    assert len(ends) == 1 and 900 + policy.decide_after_ms <= ends[0] <= 900 + policy.decide_after_ms + 100
    ((size, thread),) = seen
    assert thread != threading.current_thread().name and thread.startswith("end-of-turn")
    # the clip is the turn (with its prefix padding) up to start_after_ms into the silence, not decide_after_ms
    heard_silence_ms = size // 16 - (600 + 300)
    assert policy.start_after_ms - 50 <= heard_silence_ms < policy.decide_after_ms


class _GatedPool:
    """A one-thread decision pool whose thread is first held by a gate: calls queue behind it until `open`."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="end-of-turn-test")
        self._gate = threading.Event()
        self.pool.submit(self._gate.wait, 60)

    def open(self) -> None:
        self._gate.set()

    def drain(self) -> None:
        """Wait until everything queued so far has run (or was cancelled)."""
        self.pool.submit(lambda: None).result(timeout=60)


def _gated_turns(prob: float, calls: list[int], gate: _GatedPool, **kw) -> InputTurns:
    def judge(audio: np.ndarray) -> float:
        calls.append(audio.size)
        return prob

    turns = InputTurns(VadSettings(), lambda _kind: EnergyVad(), 60.0, end_of_turn=judge, decisions=gate.pool, **kw)
    turns.configure(AudioFormat(sample_rate_hz=MODEL_HZ), SemanticVad(eagerness=Eagerness.AUTO))
    return turns


def test_semantic_vad_clear_mid_pause_drops_the_early_call():
    """input_audio_buffer.clear between the early start and the decision: the queued call never runs;
    the next turn gets its own call."""
    calls: list[int] = []
    gate = _GatedPool()
    turns = _gated_turns(0.99, calls, gate)
    policy = EAGERNESS_POLICY["auto"]
    pre = np.concatenate([tone(0.6, MODEL_HZ), silence((policy.start_after_ms + 40) / 1000, MODEL_HZ)])
    assert _ends_ms(turns, pre) == []
    turns.clear()
    gate.open()
    gate.drain()
    assert calls == []  # the cleared pause's call was shed before it ran
    ends = _ends_ms(turns, np.concatenate([silence(0.3, MODEL_HZ), tone(0.6, MODEL_HZ), silence(1.0, MODEL_HZ)]))
    assert len(ends) == 1 and len(calls) == 1


def test_semantic_vad_resumed_speech_sheds_the_queued_call():
    """A call queued for a pause the user talks through is dropped before it runs (a loaded decision pool
    serves only live pauses); the real end of the turn gets one call on the whole turn's audio."""
    calls: list[int] = []
    gate = _GatedPool()
    turns = _gated_turns(0.99, calls, gate, decision_wait_s=None)
    policy = EAGERNESS_POLICY["auto"]
    gap_s = (policy.start_after_ms + 60) / 1000  # past the early start, before the decision point
    assert _ends_ms(turns, np.concatenate([tone(0.6, MODEL_HZ), silence(gap_s, MODEL_HZ), tone(0.6, MODEL_HZ)])) == []
    gate.open()
    gate.drain()
    assert calls == []
    ends = _ends_ms(turns, silence(1.0, MODEL_HZ))
    assert len(ends) == 1 and len(calls) == 1
    assert calls[0] >= round((1.2 + gap_s) * MODEL_HZ)  # both tones: the turn as heard at its end


def _complete_tone_then_pause(wait_s: float, past_decision_ms: int):
    """Gated turns whose Smart Turn says "complete" (0.99) once the gate opens, and 0.6 s of tone followed by
    silence running `past_decision_ms` past semantic_vad auto's decision point: (turns, calls, gate, policy, audio)."""
    calls: list[int] = []
    gate = _GatedPool()
    turns = _gated_turns(0.99, calls, gate, decision_wait_s=wait_s)
    policy = EAGERNESS_POLICY["auto"]
    audio = np.concatenate([tone(0.6, MODEL_HZ), silence((policy.decide_after_ms + past_decision_ms) / 1000, MODEL_HZ)])
    return turns, calls, gate, policy, audio


def test_semantic_vad_decision_still_running_does_not_block_the_append():
    """At the decision point a call still queued costs the append at most decision_wait_s; the answer is
    taken by a later append (a late "complete" still ends the turn, well before the silence fallback)."""
    wait_s = 0.02
    turns, calls, gate, policy, audio = _complete_tone_then_pause(wait_s, past_decision_ms=200)
    slowest = 0.0
    for _, signals, took in _timed_appends(turns, audio):
        slowest = max(slowest, took)
        assert not any(isinstance(s, SpeechEnded) for s in signals)
    assert slowest < wait_s + 0.5 and calls == []
    pending = turns.pending_decision
    assert pending is not None and turns.poll() == []  # not answered yet: nothing, at once
    gate.open()
    pending.result(timeout=60)
    (ended,) = turns.poll()  # the client sent nothing more: the runner polls when the call is done
    assert isinstance(ended, SpeechEnded) and len(calls) == 1
    # the turn ends at the decision point of the audio, not where the audio stream was when the answer came
    assert abs(ended.audio_end_ms - (600 + policy.decide_after_ms)) <= 40  # 32 ms VAD windows
    assert turns.pending_decision is None and turns.last_decision is not None and turns.last_decision[0] == 0.99
    assert _ends_ms(turns, silence(0.1, MODEL_HZ)) == [] and turns.poll() == []


def test_semantic_vad_waits_for_a_running_call_once_a_pause_not_on_every_append():
    """Past the decision point with the call still running, only the first append waits the full
    decision_wait_s; the ones after it wait only while the audio is ahead of real time: a 20 ms stream that
    waited 50 ms on each append used to fall ever further behind real time (measured: the append that
    ended the turn had queued 60-500 ms on the server)."""
    wait_s = 0.25
    turns, calls, gate, policy, audio = _complete_tone_then_pause(wait_s, past_decision_ms=240)
    durations = []
    for _, signals, took in _timed_appends(turns, audio):
        assert not any(isinstance(s, SpeechEnded) for s in signals)
        durations.append(took)
    assert turns.pending_decision is not None  # ten appends past the decision point, the call still queued
    assert sum(d >= 0.9 * wait_s for d in durations) == 1
    gate.open()
    turns.pending_decision.result(timeout=60)
    (ended,) = turns.poll()
    assert isinstance(ended, SpeechEnded) and len(calls) == 1


def test_semantic_vad_burst_client_still_gets_the_late_complete_before_the_fallback():
    """Audio sent faster than real time: appends past the decision point wait (while the audio is ahead of the
    wall clock) so a slow call's "complete" ends the turn at the decision point, not at the 2 s fallback."""
    policy = EAGERNESS_POLICY["high"]

    def slow_judge(audio: np.ndarray) -> float:
        time.sleep(0.3)
        return 0.99

    turns = InputTurns(VadSettings(), lambda _kind: EnergyVad(), 60.0, end_of_turn=slow_judge, decision_wait_s=0.05)
    turns.configure(AudioFormat(sample_rate_hz=MODEL_HZ), SemanticVad(eagerness=Eagerness.HIGH))
    ends = _ends_ms(turns, np.concatenate([tone(0.6, MODEL_HZ), silence(2.5, MODEL_HZ)]))
    assert len(ends) == 1 and ends[0] < 600 + policy.fallback_ms


def test_semantic_vad_late_answer_is_also_taken_by_the_next_append():
    """A late answer is used by whichever comes first, a poll or the next append."""
    calls: list[int] = []
    gate = _GatedPool()
    turns = _gated_turns(0.99, calls, gate, decision_wait_s=0.0)
    policy = EAGERNESS_POLICY["auto"]
    audio = np.concatenate([tone(0.6, MODEL_HZ), silence((policy.decide_after_ms + 100) / 1000, MODEL_HZ)])
    assert _ends_ms(turns, audio) == []
    gate.open()
    gate.drain()
    assert _ends_ms(turns, silence(0.1, MODEL_HZ)) == [20] and len(calls) == 1


def test_decision_wait_must_not_be_negative():
    with pytest.raises(ValueError, match="decision_wait_s"):
        InputTurns(VadSettings(), lambda _kind: EnergyVad(), 60.0, decision_wait_s=-1.0)
