"""Smart Turn v3.2 (the vendored ONNX) and semantic_vad's policy in the session's InputTurns.

The model is checked on espeak-ng speech against its own single-clip predictions (batching, threads)
and on the feature layout it was trained with; the policy is checked with a scripted predictor so
every branch (complete at the decision point, incomplete → fallback, eagerness) is exercised.
"""

from __future__ import annotations

import base64
import threading

import numpy as np
import pytest
from server_support import EnergyVad, espeak, silence, tone

from realtime_ming.audio.end_of_turn import (
    EAGERNESS_POLICY,
    SMART_TURN_WINDOW_SAMPLES,
    SmartTurn,
    smart_turn_features,
)
from realtime_ming.protocol.session import Eagerness, SemanticVad
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


def test_complete_question_scores_complete_and_batches_agree(smart_turn, question):
    """A finished question with 200 ms of trailing silence scores above 0.5; batch == single calls."""
    clip = np.concatenate([question, silence(0.2, MODEL_HZ)])
    p = smart_turn.predict(clip)
    assert 0.5 < p <= 1.0
    cut = question[: question.size // 3]
    batch = smart_turn.predict_batch([clip, cut])
    np.testing.assert_allclose(batch, [p, smart_turn.predict(cut)], atol=1e-4)


def test_concurrent_predicts_share_batches_and_get_their_own_answers(smart_turn, question):
    """Threads calling predict at once each get the probability of their own clip."""
    clips = [np.concatenate([question[: question.size * k // 4], silence(0.2, MODEL_HZ)]) for k in (1, 2, 3, 4)]
    expected = smart_turn.predict_batch(clips)
    got: dict[int, float] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, smart_turn.predict(clips[i]))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    np.testing.assert_allclose([got[i] for i in range(4)], expected, atol=1e-4)


def _turns(eagerness: Eagerness, prob: float, calls: list[int]) -> InputTurns:
    def judge(audio: np.ndarray) -> float:
        calls.append(audio.size)
        return prob

    turns = InputTurns(VadSettings(), lambda _kind: EnergyVad(), 60.0, end_of_turn=judge)
    turns.configure(AudioFormat(sample_rate_hz=MODEL_HZ), SemanticVad(eagerness=eagerness))
    return turns


def _ends_ms(turns: InputTurns, audio: np.ndarray, chunk_ms: int = 20) -> list[int]:
    """Stream 16 kHz audio; ms (from the start of `audio`) at which each SpeechEnded is reported."""
    step = MODEL_HZ * chunk_ms // 1000
    ends = []
    for i in range(0, audio.size, step):
        pcm = (np.clip(audio[i: i + step], -1, 1) * 32767).astype(np.int16)
        for signal in turns.append(base64.b64encode(pcm.tobytes()).decode()):
            if isinstance(signal, SpeechEnded):
                ends.append((i + step) * 1000 // MODEL_HZ)
    return ends


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


def test_semantic_vad_clear_mid_pause_drops_the_early_call():
    """input_audio_buffer.clear between the early start and the decision: the stale answer is never used;
    the next turn gets its own call."""
    calls: list[int] = []
    turns = _turns(Eagerness.AUTO, 0.99, calls)
    policy = EAGERNESS_POLICY["auto"]
    pre = np.concatenate([tone(0.6, MODEL_HZ), silence((policy.start_after_ms + 40) / 1000, MODEL_HZ)])
    assert _ends_ms(turns, pre) == [] and len(calls) <= 1
    turns.clear()
    ends = _ends_ms(turns, np.concatenate([silence(0.3, MODEL_HZ), tone(0.6, MODEL_HZ), silence(1.0, MODEL_HZ)]))
    assert len(ends) == 1 and len(calls) == 2
