"""`engine.talker.pipeline` with the inline talker (`engine/talker_inline.py`): the engine thread queues this step's
talker step before it finishes the last one. What the client gets is unchanged: the same text, usage, talker steps
and audio of every segment as unpipelined, in every preset voice, three turns at once; a turn's first audio comes
exactly one engine step later; cancels at every stage end each turn cleanly and leave nothing running; a confirmed
speculative turn (paused, then resumed) equals a normal one; a forget or pause with a launch in flight finishes it
first and loses none of its outputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from realtime_ming.engine import Engine
from realtime_ming.engine.api import AudioChunk, StageMark
from realtime_ming.engine.talker_driver import Enqueue
from realtime_ming.engine.talker_inline import InlineTalker
from realtime_ming.engine.talker_runner import TalkerRunner
from engine_support import (  # noqa: F401 - bundle, engines: shared fixtures
    _assert_same_output, bundle, _cancel_waves, _config, engines, PROMPT_A, PROMPT_B, Recorder, _request, _run,
    _wait_stats,
)
from test_engine_talker_process import _assert_same_speech, _speak

pytestmark = pytest.mark.timeout(300)


def _pipelined(fixture_root, **engine):
    cfg = _config(fixture_root, engine or None)
    return dataclasses.replace(cfg, talker=dataclasses.replace(cfg.talker, pipeline=True))


def test_pipelined_inline_talker_speaks_what_the_unpipelined_one_speaks(fixture_root, bundle, engines):
    stepped = Engine(_config(fixture_root), bundle)
    piped = Engine(_pipelined(fixture_root), bundle)
    engines += [stepped, piped]
    assert isinstance(piped._talker, InlineTalker) and piped._talker.pipeline and not stepped._talker.pipeline
    for voice in [None, *sorted(bundle.voices)]:
        tag = f"-{voice}"
        _assert_same_speech(_speak(stepped, "s" + tag, voice), _speak(piped, "p" + tag, voice))
    _wait_stats(piped, lambda s: (s.turns, s.thinker_rows, s.talker_streams) == (0, 0, 0))


def test_a_turns_first_audio_comes_one_engine_step_later(fixture_root, bundle, engines):
    """The same audio, delivered one talker launch later: the unpipelined talker's first chunk leaves in the
    launch that started the job, the pipelined one's at the next engine step's `outputs`."""
    for pipeline in (False, True):
        cfg = _pipelined(fixture_root) if pipeline else _config(fixture_root)
        engine = Engine(cfg, bundle)
        engines.append(engine)
        talker = engine._talker
        launched, finished = [], []
        launch, outputs = talker.launch, talker.outputs

        def counting_launch():
            launch()
            launched.append(len(launched))

        def counting_outputs():
            out = outputs()
            if any(o.pcm is not None and len(o.pcm) for o in out) and not finished:
                finished.append(len(launched))
            return out

        talker.launch, talker.outputs = counting_launch, counting_outputs
        first_job = []
        enqueue = talker.enqueue
        talker.enqueue = lambda op: (first_job.append(len(launched)) if not first_job else None, enqueue(op))[1]
        rec = _run(engine, _request(f"t{pipeline}", PROMPT_A, seed=1))
        assert any(isinstance(e, AudioChunk) for e in rec.events)
        # launches from the one after the segment was enqueued up to the one whose outputs held the first PCM
        assert finished[0] - first_job[0] == (2 if pipeline else 1), (pipeline, first_job, finished)


@pytest.mark.slow
def test_pipelined_inline_cancel_ends_every_turn_cleanly_and_leaks_nothing(fixture_root, bundle, engines):
    """30 turns cancelled at every stage: one terminal event, the last; nothing left running; later turns unchanged
    (a cancel of a turn with a stream in the rows finishes the launch in flight first)."""
    engine = Engine(_pipelined(fixture_root), bundle)
    engines.append(engine)
    reference = _run(engine, _request("ref", PROMPT_A, seed=4))
    _cancel_waves(engine, len(reference.events))
    _wait_stats(engine, lambda s: (s.turns, s.thinker_rows, s.talker_streams) == (0, 0, 0))
    _assert_same_output(reference, _run(engine, _request("after", PROMPT_A, seed=4)))


def test_pipelined_inline_confirmed_speculative_turn_equals_normal_turn(fixture_root, bundle, engines):
    """A speculative turn's talker work is paused (its stream parked with a launch in flight) and resumed on
    confirm: the same text and bit-identical audio as a normal turn."""
    engine = Engine(_pipelined(fixture_root, speculation_lookahead_ms=60_000.0), bundle)
    engines.append(engine)
    normal = _run(engine, _request("n", PROMPT_A, seed=3))
    live = Recorder()
    engine.submit(_request("s1", PROMPT_A, seed=3, speculative=True), live)
    _wait_stats(engine, lambda s: s.talker_streams == 1)
    assert [e for e in live.events if not isinstance(e, StageMark)] == []
    engine.confirm("s1")
    live.wait()
    _assert_same_output(normal, live)


def _drain(talker: InlineTalker, pcm: dict) -> None:
    while talker.has_work():
        talker.launch()
        _take(talker.outputs(), pcm)


def _take(outputs: list, pcm: dict) -> None:
    for o in outputs:
        assert o.error is None, o.error
        if o.pcm is not None:
            pcm.setdefault(o.turn_id, []).append(o.pcm)


def test_ops_with_a_launch_in_flight_finish_it_first_and_lose_nothing(fixture_root, bundle):
    """Driver level: with a launch in flight, a pause or a forget of a turn in the rows finishes it first and its
    outputs come with the next `outputs`; a forget of a turn with no stream in the rows finishes nothing. A turn
    paused with a step in flight and resumed later speaks what it speaks unpaused and unpipelined."""
    text = "Hello there, how are you doing on this fine day"
    reference: dict = {}
    plain = InlineTalker(TalkerRunner(bundle, _config(fixture_root)))
    for turn in ("a", "b"):
        plain.enqueue(Enqueue(turn, 0, text, None, seed=7))
    _drain(plain, reference)

    runner = TalkerRunner(bundle, _config(fixture_root))
    talker = InlineTalker(runner, pipeline=True)
    for turn in ("a", "b", "c"):
        talker.enqueue(Enqueue(turn, 0, text, None, seed=7))
    pcm: dict = {}
    talker.launch()  # starts a, b, c (max_streams 4) and keeps the launch in flight
    assert talker.outputs() == [] and talker.has_work()
    talker.launch()
    first = talker.outputs()  # the first launch: every job's start and first PCM
    assert {o.turn_id for o in first if o.first_step} == {"a", "b", "c"}
    _take(first, pcm)
    assert talker._inflight is not None
    talker.forget("gone")  # nothing of it in the rows: the launch stays in flight
    assert talker._inflight is not None
    talker.pause("b")  # parks b's row: the launch in flight is finished first
    assert talker._inflight is None and runner.num_streams() == 3
    talker.forget("c")
    for _ in range(3):  # b waits, parked, while a goes on
        talker.launch()
        _take(talker.outputs(), pcm)
    assert runner.pending("b") and not runner.pending("c")
    talker.resume("b")
    _drain(talker, pcm)
    for turn in ("a", "b"):
        got, want = (sum(len(x) for x in p[turn]) for p in (pcm, reference))
        assert got == want > 0
        np.testing.assert_allclose(np.concatenate(pcm[turn]), np.concatenate(reference[turn]), rtol=0, atol=1e-4)


def test_a_turn_whose_last_outputs_an_op_finished_early_is_pending_until_they_are_handed_over(fixture_root, bundle):
    """A pause of one turn finishes the launches in flight; another turn's stream may end in them. That turn stays
    `pending` (the engine does not end it) until `outputs` hands its last PCM over, and it gets all of it."""
    reference: dict = {}
    plain = InlineTalker(TalkerRunner(bundle, _config(fixture_root)))
    plain.enqueue(Enqueue("short", 0, "Hi there", None, seed=3))
    _drain(plain, reference)

    talker = InlineTalker(TalkerRunner(bundle, _config(fixture_root)), pipeline=True)
    talker.enqueue(Enqueue("long", 0, "Hello there, how are you doing on this fine day, my friend", None, seed=7))
    talker.enqueue(Enqueue("short", 0, "Hi there", None, seed=3))
    pcm: dict = {}
    held_back = 0
    while talker.pending("short"):
        talker.launch()
        talker.pause("long")  # finishes what is in flight: "short" may end in it
        talker.resume("long")
        if any(o.turn_id == "short" for o in talker._ready):
            held_back += 1
            assert talker.pending("short")  # its last PCM is not handed over yet
        _take(talker.outputs(), pcm)
    assert held_back and not talker.pending("short")
    assert sum(map(len, pcm["short"])) == sum(map(len, reference["short"])) > 0
    np.testing.assert_allclose(np.concatenate(pcm["short"]), np.concatenate(reference["short"]), rtol=0, atol=1e-4)


def test_a_failing_talker_finish_fails_the_turns_in_flight_and_the_engine_goes_on(fixture_root, bundle, engines):
    """The talker's finish raises, with launches in flight, until the turns in flight have ended (a fault that
    outlives one call): those spoken turns end ENGINE_ERROR, no talker stream is left behind, and the next turn
    speaks exactly what it speaks on a fresh engine."""
    from realtime_ming.engine.api import FailureCode, TurnFailed

    engine = Engine(_pipelined(fixture_root), bundle)
    engines.append(engine)
    reference = _run(engine, _request("ref", PROMPT_B, seed=2))
    runner = engine._talker.runner
    finish, armed, fired = runner.finish, [False], []

    def failing_finish(launched):
        if armed[0] and not all(rec.finished.is_set() for rec in recs):
            fired.append(True)
            raise RuntimeError("injected talker fault")
        return finish(launched)

    runner.finish = failing_finish
    recs = []
    for i in range(3):
        recs.append(Recorder(on_event=lambda e: armed.__setitem__(0, armed[0] or isinstance(e, AudioChunk))))
        engine.submit(_request(f"f{i}", PROMPT_A, seed=i, max_tokens=30), recs[-1])
    ends = [rec.wait() for rec in recs]
    assert fired and any(isinstance(e, TurnFailed) and e.code is FailureCode.ENGINE_ERROR for e in ends), ends
    _wait_stats(engine, lambda s: (s.turns, s.thinker_rows, s.talker_streams) == (0, 0, 0))
    _assert_same_output(reference, _run(engine, _request("after", PROMPT_B, seed=2)))
