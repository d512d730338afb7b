"""Speculative-turn helpers shared by the CPU and GPU speculation-bound tests."""

from __future__ import annotations

import time

import numpy as np
from engine_support import Recorder

from realtime_ming.engine import Engine
from realtime_ming.engine.api import AudioChunk, Content, Message, SamplingParams, TurnDone, TurnRequest

STORY = "Once upon a time the sea was calm, and a small boat sailed out at dawn. "  # cycled: no end token
PROMPT = "Tell me a long story about the sea."


def _request(turn_id: str, max_tokens: int = 40, **kw) -> TurnRequest:
    sampling = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens, seed=3, ignore_eos=True)
    return TurnRequest(turn_id, turn_id, (Message("user", (Content.of_text(PROMPT),)),), sampling=sampling, **kw)


def _run(engine: Engine, request: TurnRequest) -> Recorder:
    rec = Recorder()
    engine.submit(request, rec)
    rec.wait()
    return rec


def confirm_paused_turns(engine: Engine, normal: Recorder, other_ref: Recorder, atol: float) -> Recorder:
    """A paused speculative turn confirmed alone equals `normal` exactly; one confirmed while another turn speaks
    equals `normal` and leaves the other turn as `other_ref` (within `atol`). -> the turn confirmed alone."""
    spec = _paused_speculative(engine, "s")
    engine.confirm("s")
    spec.wait()
    _assert_same_output(normal, spec)
    beside, other = _paused_speculative(engine, "s2"), Recorder()
    engine.submit(_request("o2", max_tokens=30), other)
    while not any(isinstance(e, AudioChunk) for e in other.events):
        time.sleep(0.002)
    engine.confirm("s2")
    beside.wait(), other.wait()
    _assert_same_output(normal, beside, atol=atol)
    _assert_same_output(other_ref, other, atol=atol)
    return spec


def _assert_same_output(a: Recorder, b: Recorder, atol: float = 0.0) -> None:
    """Same text, same usage, bit-identical audio of every segment (`atol`: the CPU kernels' batch-size noise, for
    turns that shared steps with another, as in test_engine's concurrency test)."""
    da, db = a.events[-1], b.events[-1]
    assert isinstance(da, TurnDone) and isinstance(db, TurnDone)
    assert a.text() == b.text() and (da.output_tokens, da.audio_samples, da.talker_steps) == (
        db.output_tokens, db.audio_samples, db.talker_steps)
    for seg in {e.segment_id for r in (a, b) for e in r.events if isinstance(e, AudioChunk)}:
        pa, pb = ([e.pcm for e in r.events if isinstance(e, AudioChunk) and e.segment_id == seg] for r in (a, b))
        assert pa and pb
        np.testing.assert_allclose(np.concatenate(pa), np.concatenate(pb), rtol=0, atol=atol, err_msg=str(seg))


def _paused_speculative(engine: Engine, turn_id: str) -> Recorder:
    """Submit a speculative turn and wait until it is paused and stays so (nothing more held for 0.5 s)."""
    spec = Recorder()
    engine.submit(_request(turn_id, speculative=True), spec)
    paused = _wait_stats(engine, lambda s: s.paused_turns == 1)
    time.sleep(0.5)  # nothing of it is stepped meanwhile: nothing more is held
    still = engine.stats()
    assert (still.paused_turns, still.held_events, still.talker_streams) == (1, paused.held_events, 1)
    assert spec.events == []
    return spec


def _wait_stats(engine: Engine, predicate, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = engine.stats()
        if predicate(stats):
            return stats
        time.sleep(0.005)
    raise AssertionError(f"engine never reached the expected state: {engine.stats()}")
