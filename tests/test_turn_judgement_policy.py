"""semantic_vad's combination of prosody (a scripted Smart Turn) and the words judgement in `InputTurns` (sans-I/O).

The session asks for the judgement at the speculative pause (`expect_judgement`) and hands its answer over
(`on_judgement`); prosody's "complete" ends the turn only when the words agree, waits for them at most
`words_wait_ms` (then `poll`, which the runner's timer calls at `words_deadline`, decides on prosody alone),
prosody's "incomplete" yields only to sure words (`words_override`), and a superseded pause's answer is dropped.
"""

from __future__ import annotations

import base64
import dataclasses
import time

import numpy as np
import pytest
from server_support import EnergyVad, silence, tone

from realtime_ming.audio.end_of_turn import EAGERNESS_POLICY
from realtime_ming.audio.turns import SpeechPaused
from realtime_ming.protocol.audio_input import Eagerness, SemanticVad, ServerVad
from realtime_ming.protocol.values import AudioFormat
from realtime_ming.session.config import VadSettings
from realtime_ming.session.input import InputTurns, SpeechEnded

HZ = 16000
HIGH = EAGERNESS_POLICY["high"]


def _turns(prosody: float, detection=None) -> InputTurns:
    turns = InputTurns(VadSettings(), lambda _kind: EnergyVad(), 60.0, end_of_turn=lambda audio: prosody,
                       decision_wait_s=None)
    turns.configure(AudioFormat(sample_rate_hz=HZ), detection or SemanticVad(eagerness=Eagerness.HIGH))
    return turns


def _stream(turns: InputTurns, audio: np.ndarray, on_pause=None) -> list[tuple[int, object]]:
    """20 ms appends; -> (ms at the chunk's end, signal) of every signal. `on_pause(turns, k)` runs at the k-th
    SpeechPaused (as the session asks the engine there) and its signals count too."""
    out, pauses, step = [], 0, HZ // 50
    for i in range(0, audio.size, step):
        pcm = (np.clip(audio[i: i + step], -1, 1) * 32767).astype(np.int16)
        signals = turns.append(base64.b64encode(pcm.tobytes()).decode())
        if on_pause is not None and any(isinstance(s, SpeechPaused) for s in signals):
            signals += on_pause(turns, pauses)
            pauses += 1
        out += [((i + step) * 1000 // HZ, s) for s in signals]
    return out


def _ends(signals) -> list[int]:
    return [ms for ms, s in signals if isinstance(s, SpeechEnded)]


PAUSED = np.concatenate([tone(0.6, HZ), silence(0.7, HZ), tone(0.6, HZ), silence(3.0, HZ)])


def test_words_not_finished_keep_a_prosody_complete_pause_open():
    """Prosody says complete at both pauses; the words say "not finished" at the first, "finished" at the end."""
    def answer(turns, k):
        assert turns.expect_judgement(f"j{k}")
        return turns.on_judgement(f"j{k}", 0.1 if k == 0 else 0.9)

    ends = _ends(_stream(_turns(0.99), PAUSED, answer))
    assert len(ends) == 1 and 1900 + HIGH.decide_after_ms <= ends[0] <= 1900 + HIGH.decide_after_ms + 100


def test_prosody_alone_splits_the_same_pause():
    assert len(_ends(_stream(_turns(0.99), PAUSED))) == 2


def test_words_not_finished_at_the_end_leave_it_to_the_fallback():
    audio = np.concatenate([tone(0.6, HZ), silence(3.0, HZ)])
    ends = _ends(_stream(_turns(0.99), audio, lambda t, k: t.expect_judgement("j") and t.on_judgement("j", 0.0)))
    assert len(ends) == 1 and 600 + HIGH.fallback_ms <= ends[0] <= 600 + HIGH.fallback_ms + 100


SENTENCE = np.concatenate([tone(0.6, HZ), silence(3.0, HZ)])


def test_sure_words_overrule_prosody_incomplete_at_the_decision_point():
    """Smart Turn calls a finished sentence incomplete; the words are sure: the turn ends at the decision point,
    not after the 2 s fallback."""
    turns = _turns(0.0)
    ends = _ends(_stream(turns, SENTENCE, lambda t, k: t.expect_judgement("j") and t.on_judgement("j", 1.0)))
    assert len(ends) == 1 and 600 + HIGH.decide_after_ms <= ends[0] <= 600 + HIGH.decide_after_ms + 100
    assert turns.last_words == (1.0, True)


def test_where_words_are_judged_the_earlier_decision_point_is_in_force():
    assert HIGH.words_decide_after_ms is not None and HIGH.words_decide_after_ms < HIGH.decide_after_ms
    turns = _turns(0.0)
    turns.words_judged = True
    ends = _ends(_stream(turns, SENTENCE, lambda t, k: t.expect_judgement("j") and t.on_judgement("j", 1.0)))
    assert len(ends) == 1 and ends[0] < 600 + HIGH.decide_after_ms
    turns.words_judged = False  # no words judged: prosody's own (later) decision point again
    ends = _ends(_stream(turns, SENTENCE, lambda t, k: t.expect_judgement("j") and t.on_judgement("j", 1.0)))
    assert len(ends) == 1 and 600 + HIGH.decide_after_ms <= ends[0] <= 600 + HIGH.decide_after_ms + 100


def test_words_decision_point_must_leave_room_for_the_early_call():
    with pytest.raises(ValueError, match="words_decide_after_ms"):
        dataclasses.replace(HIGH, words_decide_after_ms=HIGH.early_ms)


def test_sure_words_arriving_after_the_decision_point_end_the_turn_when_they_come():
    turns = _turns(0.0)
    signals = _stream(turns, np.concatenate([tone(0.6, HZ), silence(0.6, HZ)]), lambda t, k: [t.expect_judgement("j")])
    assert not _ends(signals) and turns.words_deadline is None  # prosody said incomplete: no wait, the pause goes on
    (ended,) = turns.on_judgement("j", HIGH.words_override)
    assert isinstance(ended, SpeechEnded) and ended.audio_end_ms <= 600 + HIGH.decide_after_ms + 40


@pytest.mark.parametrize("eagerness", ["high", "auto", "medium", "low"])
def test_weak_words_complete_do_not_overrule_prosody_incomplete(eagerness):
    """P(complete) above the agreement threshold but below `words_override`: prosody's "incomplete" stands."""
    policy = EAGERNESS_POLICY[eagerness]
    assert policy.words_override is not None and policy.words_threshold < policy.words_override
    weak = (policy.words_threshold + policy.words_override) / 2
    audio = np.concatenate([tone(0.6, HZ), silence(policy.fallback_ms / 1000 + 0.3, HZ)])
    ends = _ends(_stream(_turns(0.0, SemanticVad(eagerness=Eagerness(eagerness))), audio,
                         lambda t, k: t.expect_judgement("j") and t.on_judgement("j", weak)))
    assert len(ends) == 1 and 600 + policy.fallback_ms <= ends[0] <= 600 + policy.fallback_ms + 100


def test_a_stale_sure_judgement_is_ignored_by_the_next_pause():
    """The first pause's words were sure (answered in it, and again late during the second pause); the user went
    on, and the second pause's own judgement never came: prosody's "incomplete" stands until the fallback."""
    audio = np.concatenate([tone(0.6, HZ), silence(0.15, HZ), tone(0.6, HZ), silence(2.5, HZ)])

    def ask(t, k):
        t.expect_judgement(f"j{k}")
        return t.on_judgement("j0", 1.0)  # in the first pause: taken; in the second: stale, dropped

    ends = _ends(_stream(_turns(0.0), audio, ask))
    assert len(ends) == 1 and ends[0] >= 1350 + HIGH.fallback_ms


def test_a_stale_sure_judgement_does_not_overrule_a_pause_nobody_asked_about():
    audio = np.concatenate([tone(0.6, HZ), silence(0.15, HZ), tone(0.6, HZ), silence(2.5, HZ)])
    ends = _ends(_stream(_turns(0.0), audio,
                         lambda t, k: t.expect_judgement("j0") and t.on_judgement("j0", 1.0) if k == 0 else []))
    assert len(ends) == 1 and ends[0] >= 1350 + HIGH.fallback_ms


def test_words_asked_after_prosody_said_incomplete_may_still_overrule(monkeypatch):
    """A decision point at the speculative pause: Smart Turn answered before the session asked for the words."""
    monkeypatch.setitem(EAGERNESS_POLICY, "high", dataclasses.replace(HIGH, decide_after_ms=120, early_ms=60))
    ends = _ends(_stream(_turns(0.0), SENTENCE, lambda t, k: t.expect_judgement("j") and t.on_judgement("j", 0.99)))
    assert len(ends) == 1 and ends[0] <= 600 + 120 + 100


def test_a_decision_point_reached_with_the_pause_waits_for_the_words_to_be_asked(monkeypatch):
    """Silence that passes the 120 ms pause and the decision point in one append: with words judged (the session
    sets `words_judged`), prosody's "complete" does not end the turn before the session asked the words; their
    "not finished" keeps a paused sentence whole."""
    monkeypatch.setitem(EAGERNESS_POLICY, "high", dataclasses.replace(HIGH, decide_after_ms=120, early_ms=60))
    turns = _turns(0.99)
    turns.words_judged = True

    def answer(t, k):
        assert t.expect_judgement(f"j{k}")
        return t.on_judgement(f"j{k}", 0.1 if k == 0 else 0.9)

    ends = _ends(_stream(turns, PAUSED, answer))
    assert len(ends) == 1 and ends[0] >= 1900 + 120


def test_prosody_alone_is_unchanged_without_a_words_judgement():
    assert _ends(_stream(_turns(0.0), SENTENCE))[0] >= 600 + HIGH.fallback_ms
    assert _ends(_stream(_turns(0.99), SENTENCE))[0] <= 600 + HIGH.decide_after_ms + 100


def test_words_override_must_not_be_weaker_than_the_agreement_threshold():
    with pytest.raises(ValueError, match="words_override"):
        dataclasses.replace(HIGH, words_threshold=0.6, words_override=0.5)


def test_a_late_judgement_ends_the_turn_where_the_decision_point_was():
    """The answer comes after the decision point (audio streamed faster than real time): the turn ends when it
    comes, its audio end at the decision point."""
    turns = _turns(0.99)
    signals = _stream(turns, np.concatenate([tone(0.6, HZ), silence(0.5, HZ)]), lambda t, k: [t.expect_judgement("j")])
    assert not _ends(signals) and turns.words_deadline is not None  # prosody said complete; waiting for the words
    (ended,) = turns.on_judgement("j", 0.8)
    assert isinstance(ended, SpeechEnded)
    assert ended.audio_end_ms <= 600 + HIGH.decide_after_ms + 40


def test_no_judgement_within_the_wait_means_prosody_alone():
    turns = _turns(0.99)
    signals = _stream(turns, np.concatenate([tone(0.6, HZ), silence(0.5, HZ)]), lambda t, k: [t.expect_judgement("j")])
    assert not _ends(signals)
    deadline = turns.words_deadline
    assert deadline is not None and turns.poll() == []  # not yet
    time.sleep(max(0.0, deadline - time.monotonic()) + 0.01)
    (ended,) = turns.poll()  # the runner's timer: prosody decides alone
    assert isinstance(ended, SpeechEnded) and turns.words_deadline is None
    assert turns.on_judgement("j", 0.0) == []  # too late: dropped


def test_a_failed_judgement_lets_prosody_decide_at_once():
    turns = _turns(0.99)
    _stream(turns, np.concatenate([tone(0.6, HZ), silence(0.5, HZ)]), lambda t, k: [t.expect_judgement("j")])
    (ended,) = turns.on_judgement("j", None)
    assert isinstance(ended, SpeechEnded)


def test_a_superseded_pauses_judgement_is_dropped():
    """The user went on: the first pause's answer (arriving late) changes nothing; the second pause decides."""
    turns = _turns(0.99)
    audio = np.concatenate([tone(0.6, HZ), silence(0.15, HZ), tone(0.6, HZ), silence(0.5, HZ)])
    asked: list[str] = []

    def ask(t, k):
        asked.append(f"j{k}")
        t.expect_judgement(f"j{k}")
        return t.on_judgement("j0", 1.0) if k == 1 else []  # the first pause's answer comes during the second

    signals = _stream(turns, audio, ask)
    assert asked == ["j0", "j1"] and not _ends(signals)  # j0 dropped; j1 still awaited
    (ended,) = turns.on_judgement("j1", 0.9)
    assert isinstance(ended, SpeechEnded)


def test_server_vad_takes_no_judgement():
    turns = _turns(0.99, ServerVad())
    seen = []
    _stream(turns, np.concatenate([tone(0.6, HZ), silence(1.0, HZ)]), lambda t, k: seen.append(t.expect_judgement("j")) or [])
    assert seen == [False]
