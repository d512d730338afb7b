"""Bounded speculation on the tiny CPU engine (`engine/speculation.py`): an unconfirmed speculative turn pauses once
it holds its audio lookahead, holds a bounded number of events however long its confirm waits, resumes on confirm
into exactly the output of a run that never paused, and is released as a handful of coalesced events."""

from __future__ import annotations

import time

import numpy as np
import pytest
from engine_support import Recorder

from realtime_ming.engine import Engine
from realtime_ming.engine.api import OUTPUT_SAMPLE_RATE_HZ, AudioChunk, Stage, StageMark, TextDelta, TurnRequest
from realtime_ming.engine.config import EngineConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.segmenter import SegmenterConfig
from realtime_ming.engine.speculation import coalesce
from speculation_support import STORY, _assert_same_output, _request, _run, _wait_stats, confirm_paused_turns

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def make(tiny_bundle):
    """Engines over the module's tiny bundle; the first segment never waits for the clock (audio is timing-free)."""
    engines = []

    def make(hooks: EngineHooks | None = None, **cfg) -> Engine:
        bundle = tiny_bundle if hooks is None else tiny_bundle.with_hooks(hooks)
        engines.append(Engine(EngineConfig(segmenter=SegmenterConfig(first_max_wait_ms=60_000.0), **cfg), bundle))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()


def _released(rec: Recorder) -> list:
    """The events a confirm delivered at once: everything before the CONFIRMED mark."""
    marks = [i for i, e in enumerate(rec.events) if isinstance(e, StageMark) and e.stage is Stage.CONFIRMED]
    assert len(marks) == 1
    return rec.events[:marks[0]]


def test_paused_then_confirmed_turn_equals_never_paused_run(make):
    """A speculative turn paused at its lookahead, left paused, then confirmed yields bit for bit its never-paused
    output; its first audio was ready at the confirm. Confirmed while another turn speaks (its stream comes back to
    another row, its thinker row decodes beside another) it yields that output too (batch-size noise aside)."""
    lookahead_ms = 300.0
    engine = make(speculation_lookahead_ms=lookahead_ms)
    normal, other_ref = _run(engine, _request("n")), _run(engine, _request("o", max_tokens=30))
    assert normal.pcm().size > 3 * lookahead_ms * OUTPUT_SAMPLE_RATE_HZ / 1000  # long enough to be paused
    spec = confirm_paused_turns(engine, normal, other_ref, atol=1e-4)
    released = _released(spec)
    held_audio = sum(e.pcm.size for e in released if isinstance(e, AudioChunk))
    assert held_audio >= lookahead_ms * OUTPUT_SAMPLE_RATE_HZ / 1000  # the first audio was ready at confirm
    assert sum(isinstance(e, AudioChunk) for e in released) <= 2 and sum(isinstance(e, TextDelta) for e in released) == 1
    assert all(e.backlog for e in released if isinstance(e, AudioChunk))
    assert not any(e.backlog for e in spec.events[len(released):] if isinstance(e, AudioChunk))
    stats = engine.stats()
    assert (stats.turns, stats.thinker_rows, stats.talker_streams, stats.paused_turns) == (0, 0, 0, 0)


def _deltas_before_first_segment(engine: Engine, request: TurnRequest) -> int:
    """Text deltas a normal run of `request` emits before its first segment goes to the talker (then cancelled)."""
    rec = Recorder()
    engine.submit(request, rec)
    while not any(isinstance(e, StageMark) and e.stage is Stage.FIRST_SEGMENT for e in list(rec.events)):
        time.sleep(0.005)
    engine.cancel(request.turn_id)
    rec.wait()
    return sum(isinstance(e, TextDelta) for e in rec.events[:next(
        i for i, e in enumerate(rec.events) if isinstance(e, StageMark) and e.stage is Stage.FIRST_SEGMENT)])


@pytest.mark.slow  # ~11 s
def test_held_events_stay_bounded_however_long_the_confirm_waits(make):
    """Confirm delayed by 2 s: unbounded, the held turn keeps generating (its held events grow); bounded, it holds
    what it held at its pause: its text up to its first segment (the thinker runs until the talker has text) or the
    token lookahead, the audio lookahead's chunks and its stage marks."""
    words = EngineHooks(forced_reply=STORY)  # real words: the first segment comes after a few of them
    bounded = make(hooks=words)
    unbounded = make(hooks=words, speculation_lookahead_ms=None, speculation_lookahead_tokens=None)
    before_segment = _deltas_before_first_segment(bounded, _request("ref", max_tokens=400))
    counts, span = {}, None
    for name, engine in (("bounded", bounded), ("unbounded", unbounded)):
        rec = Recorder()
        t0 = time.monotonic()
        engine.submit(_request(name, max_tokens=400, speculative=True), rec)
        if span is None:  # bounded: until its pause, then the confirm waits 1.5 s more
            _wait_stats(engine, lambda s: s.paused_turns == 1)
            engine.stats()  # one more step boundary: the thinker step in flight at the pause is collected
            span = time.monotonic() - t0 + 1.5
        seen = []
        while time.monotonic() < t0 + span:
            seen.append(engine.stats().held_events)
            time.sleep(0.05)
        counts[name] = seen
        if name == "bounded":
            engine.confirm(name)
            engine.cancel(name)  # confirmed: the rest of the story is not needed here
            rec.wait()
            released = _released(rec)
            assert len(released) == len(coalesce(released))  # delivered coalesced
            assert len(released) < 20
        else:
            engine.discard(name)
    cfg = bounded.cfg
    chunks = cfg.speculation_lookahead_ms / 320.0 + 2  # a talker step is 320 ms; a lead's first output is 2
    bound = max(cfg.speculation_lookahead_tokens, before_segment) + 2 + chunks + len(Stage)
    assert max(counts["bounded"]) <= bound and counts["bounded"][-1] == max(counts["bounded"])
    assert counts["bounded"] == [counts["bounded"][0]] * len(counts["bounded"])  # paused: flat for 1.5 s
    assert counts["unbounded"][-1] > counts["unbounded"][len(counts["unbounded"]) // 2]  # still growing
    assert counts["unbounded"][-1] > counts["bounded"][-1]


def test_paused_turn_discarded_frees_everything(make):
    """A paused speculative turn, discarded, emits nothing and frees its row, its parked stream and its slot."""
    engine = make(speculation_lookahead_ms=200.0)
    reference = _run(engine, _request("ref", max_tokens=20))
    rec = Recorder()
    engine.submit(_request("d", speculative=True), rec)
    _wait_stats(engine, lambda s: s.paused_turns == 1)
    engine.discard("d")
    stats = _wait_stats(engine, lambda s: s.turns == 0)
    assert (stats.thinker_rows, stats.talker_streams, stats.held_events, stats.paused_turns) == (0, 0, 0, 0)
    _assert_same_output(reference, _run(engine, _request("after", max_tokens=20)))
    assert rec.events == []


def test_text_only_speculative_turn_pauses_at_its_token_lookahead(make):
    """Without audio the thinker row pauses once it has generated speculation_lookahead_tokens tokens; confirmed,
    its text is exactly a normal turn's."""
    engine = make(speculation_lookahead_tokens=8)
    normal = _run(engine, _request("n", max_tokens=24, with_audio=False))
    rec = Recorder()
    engine.submit(_request("t", max_tokens=24, with_audio=False, speculative=True), rec)
    paused = _wait_stats(engine, lambda s: s.paused_turns == 1)
    time.sleep(0.3)
    assert engine.stats().held_events == paused.held_events <= 8 + 1 + len(Stage)  # + the step in flight
    engine.confirm("t")
    rec.wait()
    assert rec.text() == normal.text() and rec.events[-1].output_tokens == 24
    assert sum(isinstance(e, TextDelta) for e in _released(rec)) == 1


def test_coalesce_keeps_text_audio_and_barriers_exact():
    """Runs of text / audio / marks become one text delta and one backlog chunk per segment; other events stay put."""
    from realtime_ming.engine.api import ToolCallStart

    pcm = [np.full(n, float(n), np.float32) for n in (3, 4, 5, 6)]
    events = [StageMark("t", Stage.FIRST_TOKEN, 1.0), TextDelta("t", "a"), AudioChunk("t", pcm[0], segment_id=0),
              TextDelta("t", "b"), AudioChunk("t", pcm[1], segment_id=0), AudioChunk("t", pcm[2], segment_id=1),
              ToolCallStart("t", "f"), TextDelta("t", "c"), AudioChunk("t", pcm[3], segment_id=1)]
    out = coalesce(events)
    assert [type(e).__name__ for e in out] == ["StageMark", "TextDelta", "AudioChunk", "AudioChunk", "ToolCallStart",
                                               "TextDelta", "AudioChunk"]
    assert (out[1].text, out[5].text) == ("ab", "c")
    assert np.array_equal(out[2].pcm, np.concatenate(pcm[:2])) and out[2].segment_id == 0
    assert np.array_equal(out[3].pcm, pcm[2]) and np.array_equal(out[6].pcm, pcm[3])
    assert all(e.backlog for e in out if isinstance(e, AudioChunk))
