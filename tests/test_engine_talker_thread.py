"""`engine.talker.own_thread`: the talker steps on a thread of its own (`engine/talker_loop.py`). The client
gets the same text and audio as from the talker stepped once per engine step; cancels, speculation and a failing
talker step keep their guarantees; close stops the thread."""

from __future__ import annotations

import dataclasses
import sys
import threading

import numpy as np
import pytest

from realtime_ming.engine import Engine
from realtime_ming.engine.api import AudioChunk, FailureCode, TextDelta, TurnCancelled, TurnDone, TurnFailed
from realtime_ming.engine.config import TalkerRunnerConfig
from realtime_ming.engine.talker_loop import TalkerLoop
from engine_support import (  # noqa: F401 - bundle, engines: shared fixtures
    _assert_same_output, bundle, _CancelAt, _config, _done_fields, engines, _pcm_by_segment, PROMPT_A, PROMPT_B,
    Recorder, _request, _run, _TERMINAL, _wait_stats,
)

pytestmark = pytest.mark.timeout(180)


def _threaded(fixture_root, thread_steps: int = 1, pipeline: bool = False, **engine):
    cfg = _config(fixture_root, engine or None)
    return dataclasses.replace(cfg, talker=dataclasses.replace(cfg.talker, own_thread=True, thread_steps=thread_steps,
                                                               thread_pipeline=pipeline))


def _engine(engines, cfg, bundle) -> Engine:
    engines.append(Engine(cfg, bundle))
    return engines[-1]


@pytest.mark.parametrize("thread_steps,pipeline", [(1, False), (3, False), (1, True), (2, True)])
def test_threaded_talker_speaks_what_the_stepped_talker_speaks(fixture_root, bundle, engines, thread_steps, pipeline):
    """Three turns at once (greedy and sampled, two prompts): the same text, usage, talker steps and audio of every
    segment from the talker on its own thread as from the talker stepped with the thinker -- also with several
    talker steps queued per launch (`thread_steps`: streams that end between keep nothing of the steps after) and
    pipelined (the next launch queued before the last one is read: rows move between launch and finish)."""
    stepped = _engine(engines, _config(fixture_root), bundle)
    threaded = _engine(engines, _threaded(fixture_root, thread_steps, pipeline), bundle)
    assert isinstance(threaded._talker, TalkerLoop) and not isinstance(stepped._talker, TalkerLoop)
    assert threaded._talker.steps == thread_steps and threaded._talker.pipeline == pipeline
    make = [lambda tag: _request(f"a{tag}", PROMPT_A, seed=1),
            lambda tag: _request(f"b{tag}", PROMPT_B, seed=5, temperature=0.8),
            lambda tag: _request(f"c{tag}", PROMPT_B, seed=2, max_tokens=20)]
    results = []
    for engine, tag in ((stepped, "-s"), (threaded, "-t")):
        recs = [Recorder() for _ in make]
        for m, rec in zip(make, recs):
            engine.submit(m(tag), rec)
        for rec in recs:
            assert isinstance(rec.wait(), TurnDone)
        results.append(recs)
    for a, b in zip(*results):
        assert a.text() == b.text() and a.events[-1].audio_samples > 0
        assert _done_fields(a.events[-1]) == _done_fields(b.events[-1])
        assert a.events[-1].talker_steps == b.events[-1].talker_steps
        pa, pb = _pcm_by_segment(a), _pcm_by_segment(b)
        assert pa.keys() == pb.keys()
        for seg in pa:  # the streams are batched differently: equal within float noise
            np.testing.assert_allclose(pa[seg], pb[seg], rtol=0, atol=1e-4)
        assert [type(e) for e in b.events].count(TurnDone) == 1 and b.events[-1].__class__ is TurnDone


@pytest.mark.parametrize("pipeline", [False, True])
def test_threaded_talker_cancel_ends_every_turn_cleanly_and_leaks_nothing(fixture_root, bundle, engines, pipeline):
    """30 turns cancelled at every stage: the terminal event is the last, nothing is left running, later turns
    are unchanged (pipelined too: a cancel finishes the launch in flight first)."""
    engine = _engine(engines, _threaded(fixture_root, pipeline=pipeline), bundle)
    reference = _run(engine, _request("ref", PROMPT_A, seed=4))
    events = len(reference.events)
    hooks, recorders = [], []
    for wave in range(3):
        for index in range(wave * 10, wave * 10 + 10):
            hooks.append(_CancelAt(engine, f"c{index}", (index * 7) % (events - 1)))
            recorders.append(Recorder(hooks[-1]))
            engine.submit(_request(f"c{index}", PROMPT_A, seed=4), recorders[-1])
        for rec in recorders[-10:]:
            rec.wait()
    for rec in recorders:
        assert sum(isinstance(e, _TERMINAL) for e in rec.events) == 1 and isinstance(rec.events[-1], _TERMINAL)
        if isinstance(rec.events[-1], TurnCancelled):
            assert rec.events[-1].text == rec.text()
    for hook in hooks:  # the talker's thread stops delivering at the cancel call, not at the engine's next step
        assert sum(isinstance(e, AudioChunk) for e in hook.late[:-1]) <= 1
    _wait_stats(engine, lambda s: (s.turns, s.thinker_rows, s.talker_streams) == (0, 0, 0))
    after = _run(engine, _request("after", PROMPT_A, seed=4))
    _assert_same_output(reference, after)


@pytest.mark.parametrize("pipeline", [False, True])
def test_threaded_talker_confirmed_speculative_turn_equals_normal_turn(fixture_root, bundle, engines, pipeline):
    engine = _engine(engines, _threaded(fixture_root, pipeline=pipeline, speculation_lookahead_ms=60_000.0), bundle)
    normal = _run(engine, _request("n", PROMPT_A, seed=3))
    live = Recorder()
    engine.submit(_request("s1", PROMPT_A, seed=3, speculative=True), live)
    _wait_stats(engine, lambda s: s.talker_streams == 1)
    assert live.events == []
    engine.confirm("s1")
    live.wait()
    _assert_same_output(normal, live)


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_failing_threaded_talker_step_fails_its_turns_and_the_engine_goes_on(fixture_root, bundle, engines,
                                                                               pipeline):
    engine = _engine(engines, _threaded(fixture_root, pipeline=pipeline), bundle)
    inner = engine._talker.talker
    launch, calls = inner.launch, []

    def flaky(steps=1, keep=False):
        calls.append(steps)
        if len(calls) == 3:
            raise RuntimeError("injected talker fault")
        return launch(steps, keep)

    inner.launch = flaky
    rec = _run(engine, _request("f", PROMPT_A, seed=4))
    assert isinstance(rec.events[-1], TurnFailed) and rec.events[-1].code is FailureCode.ENGINE_ERROR
    assert "injected talker fault" in rec.events[-1].message
    _wait_stats(engine, lambda s: (s.turns, s.thinker_rows, s.talker_streams) == (0, 0, 0))
    ok = _run(engine, _request("ok", PROMPT_A, seed=4))
    assert isinstance(ok.events[-1], TurnDone) and ok.events[-1].audio_samples > 0
    assert engine.health().alive


def test_threaded_talker_thread_stops_on_close(fixture_root, bundle):
    engine = Engine(_threaded(fixture_root), bundle)
    rec = _run(engine, _request("x", PROMPT_B, seed=1))
    assert any(isinstance(e, TextDelta) for e in rec.events)
    loop = engine._talker
    engine.close()
    assert not loop._thread.is_alive()
    assert not any(t.name == "realtime-ming-talker" and t is loop._thread for t in threading.enumerate())


def test_own_thread_excludes_steps_while_thinking():
    with pytest.raises(ValueError, match="own_thread"):
        TalkerRunnerConfig(own_thread=True, steps_while_thinking=2)


def test_thread_steps_needs_own_thread_and_a_sane_count():
    with pytest.raises(ValueError, match="own_thread"):
        TalkerRunnerConfig(thread_steps=2)
    with pytest.raises(ValueError, match="own_thread"):
        TalkerRunnerConfig(thread_pipeline=True)
    for bad in (0, 9):
        with pytest.raises(ValueError, match="thread_steps"):
            TalkerRunnerConfig(own_thread=True, thread_steps=bad)


def test_switch_interval_is_set_while_the_engine_runs_and_set_back_on_close(fixture_root, bundle):
    before = sys.getswitchinterval()
    engine = Engine(dataclasses.replace(_threaded(fixture_root), switch_interval_ms=0.5), bundle)
    try:
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        assert isinstance(_run(engine, _request("si", PROMPT_B, seed=1)).events[-1], TurnDone)
    finally:
        engine.close()
    assert sys.getswitchinterval() == before
    for bad in (0.0, float("nan"), 1000.0):
        with pytest.raises(ValueError, match="switch_interval_ms"):
            dataclasses.replace(_config(fixture_root), switch_interval_ms=bad)
