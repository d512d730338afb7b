"""When a segment reaches the talker (embedded tiny model, CPU): its first talker step runs in the engine step that
routed it, not one step later, and the thinker's next step is queued before the talker's step starts, so the two
still run side by side on a GPU; a turn's first job catches up its first chunk in that same step, and every
stream's audio stays what it is alone (more of it in test_engine.py)."""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np
import pytest

from bench.talker_admission import AdmissionProbe
from realtime_ming.engine import Engine
from realtime_ming.engine.api import (
    AudioChunk,
    Content,
    Message,
    SamplingParams,
    Stage,
    StageMark,
    TextDelta,
    TurnCancelled,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.engine.config import EngineConfig, TalkerRunnerConfig, ThinkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.segmenter import SegmenterConfig
from realtime_ming.engine.talker_runner import TalkerRunner
from realtime_ming.model.talker_text import talker_job_texts

pytestmark = pytest.mark.timeout(120)

REPLY = "Hello there, my friend. The sea is calm today, and the sky is clear and blue."


@pytest.fixture
def engine(tiny_bundle):
    # the first segment leaves at the first clause mark, never on the clock: segments do not depend on timing
    cfg = EngineConfig(thinker=ThinkerRunnerConfig(max_slots=4, max_seq_len=512),
                       talker=TalkerRunnerConfig(max_streams=4),
                       segmenter=SegmenterConfig(policy="latency", first_max_wait_ms=60_000.0,
                                                 first_mark_wait_ms=60_000.0))
    eng = Engine(cfg, tiny_bundle.with_hooks(EngineHooks(forced_reply=REPLY, steps_per_word=1)))
    yield eng
    eng.close()


class Recorder:
    def __init__(self) -> None:
        self.events: list = []
        self.finished = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, (TurnDone, TurnCancelled, TurnFailed)):
            self.finished.set()


def _spoken(turn_id: str, seed: int) -> TurnRequest:
    return TurnRequest(turn_id, turn_id, (Message("user", (Content.of_text("Tell me about the sea."),)),),
                       with_audio=True, sampling=SamplingParams(max_tokens=16, ignore_eos=True, seed=seed))


def _run(engine: Engine, n: int) -> list[Recorder]:
    recs = [Recorder() for _ in range(n)]
    for i, rec in enumerate(recs):
        engine.submit(_spoken(f"t{i}", i), rec)
    for rec in recs:
        assert rec.finished.wait(90), rec.events[-3:]
        assert isinstance(rec.events[-1], TurnDone), rec.events[-1]
    return recs


@pytest.mark.parametrize("turns", [1, 3])
def test_first_talker_step_runs_in_the_step_that_routed_the_segment(engine, turns):
    probe = AdmissionProbe(engine)
    recs = _run(engine, turns)
    assert len(probe.marks) == turns
    for turn_id, marks in probe.marks.items():
        segment, talker_step = marks[Stage.FIRST_SEGMENT], marks[Stage.FIRST_TALKER_STEP]
        assert talker_step[1] == segment[1], (turn_id, segment, talker_step)  # the same engine step
        assert marks[Stage.FIRST_PCM][1] >= talker_step[1]
    assert len(probe.start_s) >= turns and probe.admit_s  # the probe timed every job started
    for rec in recs:
        # seen by the client: no text of a later thinker step arrives between a turn's first segment and its first
        # talker step (one step late, the next token's text would)
        stages = [e.stage if isinstance(e, StageMark) else type(e) for e in rec.events]
        first, talked = stages.index(Stage.FIRST_SEGMENT), stages.index(Stage.FIRST_TALKER_STEP)
        assert TextDelta not in stages[first:talked]
        assert TextDelta in stages[talked:]  # the reply was still being written: the test could tell
        assert any(isinstance(e, AudioChunk) and e.pcm.size for e in rec.events)


def test_thinker_next_step_is_queued_before_the_talker_step(engine):
    calls: list[str] = []
    thinker, talker = engine._thinker, engine._talker
    for owner, name, label in ((engine, "_step", "step"), (thinker, "collect", "collect"),
                               (thinker, "launch", "thinker"), (talker, "launch", "talker"), (talker, "outputs", "finish")):
        def recorded(*args, _inner=getattr(owner, name), _label=label):
            calls.append(_label)
            return _inner(*args)

        setattr(owner, name, recorded)
    _run(engine, 2)
    steps = [s.split() for s in " ".join(calls).split("step") if "talker" in s]
    assert steps, calls
    # after collecting a thinker step, the next one (if any work is left) is queued before the talker's step starts
    after = [s[s.index("collect"):] for s in steps]
    queued = ["thinker" in s for s in after]
    # steps without thinker work come only before the first admission is through its encoders and after the
    # last token (the talker's tail); between, every step queues the next thinker step before the talker's
    first, last = queued.index(True), len(queued) - 1 - queued[::-1].index(True)
    assert all(queued[first:last + 1]), "|".join(" ".join(s) for s in steps)
    assert sum(queued) >= 8, calls  # enough steps that the test could tell
    for s, q in zip(after, queued):
        if q:
            assert s == ["collect", "thinker", "talker", "finish"], s


def _speak(runner, plan: dict[int, list[tuple[str, str, int]]], steps: int = 1) -> tuple[dict, dict]:
    """Step `runner` until idle (`steps` talker steps per launch), enqueueing plan[step] = [(turn, text, seed)] before
    that step; per turn its PCM and the (step, pcm samples, talker steps) of each output."""
    pcm, outs, step = defaultdict(list), defaultdict(list), 0
    while runner.has_work() or any(k >= step for k in plan):
        for turn_id, text, seed in plan.get(step, []):
            runner.enqueue(turn_id, 0, text, None, seed=seed)
        for out in runner.finish(runner.launch(steps)):
            assert out.error is None
            if out.pcm is not None:
                pcm[out.turn_id].append(out.pcm)
                outs[out.turn_id].append((step, out.pcm.size, out.steps))
        step += 1
    for turn_id in pcm:
        runner.forget(turn_id)  # a turn's job count (its noise seeds) starts over
    return {t: np.concatenate(p) for t, p in pcm.items()}, outs


@pytest.mark.slow
def test_a_turns_first_job_speaks_in_the_step_that_starts_it_with_unchanged_audio(tiny_bundle):
    """A turn's first talker job runs two talker steps in its first engine step (the VAE holds each chunk until the
    next one: one step would give no audio), so its first PCM leaves in that step; later jobs run one step per
    engine step. Turns joining beside running streams (their rows taken from them, at the front) speak exactly as alone."""
    cfg = EngineConfig(talker=TalkerRunnerConfig(max_streams=4, silence_holder=False))
    runner = TalkerRunner(tiny_bundle.with_hooks(EngineHooks(steps_per_word=2)), cfg)
    texts = {"a": ("Hello there, how are you? Fine, thanks.", 7), "b": ("The sea is calm.", 11), "c": ("Ok then.", 3)}
    assert len(talker_job_texts(texts["a"][0])) >= 2  # a second job of "a" runs while "b" and "c" join
    alone = {t: _speak(runner, {0: [(t, text, seed)]})[0][t] for t, (text, seed) in texts.items()}
    moves, move = [], runner.rows.move
    runner.rows.move = lambda src, dst: (moves.append((src, dst)), move(src, dst))
    together, outs = _speak(runner, {0: [("a", *texts["a"])], 3: [("b", *texts["b"]), ("c", *texts["c"])]})
    assert moves  # a lead took the row of a stream already running (moved to the next free row)
    for turn_id, pcm in alone.items():
        assert together[turn_id].shape == pcm.shape
        np.testing.assert_allclose(together[turn_id], pcm, rtol=0, atol=1e-4)
    for turn_id, joined in (("a", 0), ("b", 3), ("c", 3)):
        first = outs[turn_id][0]
        assert first[0] == joined and first[1] > 0 and first[2] == 2, outs[turn_id]  # audio in the starting step
    # "a"'s later job started fresh beside the leads but ran one step per engine step
    assert sum(k == 2 for _, _, k in outs["a"]) == 1
    assert sum(k for _, _, k in outs["a"]) == len(outs["a"]) + 1


@pytest.mark.slow
def test_first_chunk_catch_up_off_speaks_one_step_later_with_the_same_audio(tiny_bundle):
    """The first-chunk catch-up off (`TalkerRunner.catch_up`): one talker step per engine step from the start, so
    the first engine step gives no audio (the VAE holds the chunk); the audio itself is the same."""
    audio, first = {}, {}
    for on in (True, False):
        cfg = EngineConfig(talker=TalkerRunnerConfig(max_streams=2, silence_holder=False))
        runner = TalkerRunner(tiny_bundle.with_hooks(EngineHooks(steps_per_word=2)), cfg)
        runner.catch_up = on
        pcm, outs = _speak(runner, {0: [("b", "The sea is calm.", 11)]})
        audio[on], first[on] = pcm["b"], outs["b"][:2]
    assert first[False] == [(0, 0, 1), (1, first[True][0][1], 1)] and first[True][0][2] == 2, first
    np.testing.assert_allclose(audio[False], audio[True], rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_word", [2, 0])  # a fixed length, or the stop head and the duration cap
def test_several_talker_steps_per_launch_speak_the_same_audio(tiny_bundle, steps_per_word):
    """`launch(steps)` queues that many steps of every stream back to back (the engine asks for more while the
    thinker's step runs on other GPUs): each turn's audio is what one step per launch gives, streams that end at
    an earlier step of a launch keep nothing of the later ones, and turns joining mid-way are unaffected."""
    cfg = EngineConfig(talker=TalkerRunnerConfig(max_streams=4))
    runner = TalkerRunner(tiny_bundle.with_hooks(EngineHooks(steps_per_word=steps_per_word)), cfg)
    plan = {0: [("a", "Hello there, how are you? Fine, thanks.", 7)],
            1: [("b", "The sea is calm.", 11), ("c", "Ok then.", 3)], 4: [("d", "Good night.", 5)]}
    one, outs_one = _speak(runner, plan, steps=1)
    for k in (2, 3):
        several, outs = _speak(runner, plan, steps=k)
        assert several.keys() == one.keys()
        for turn_id, pcm in one.items():
            assert several[turn_id].shape == pcm.shape, (k, turn_id)
            np.testing.assert_allclose(several[turn_id], pcm, rtol=0, atol=1e-4)
        assert max(n for o in outs.values() for _, _, n in o) == k  # launches did run k steps
        # fewer launches than with one step each
        assert max(s for o in outs.values() for s, _, _ in o) < max(s for o in outs_one.values() for s, _, _ in o)
    assert not runner.has_work() and not runner.streams
