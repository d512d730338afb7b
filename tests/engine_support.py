"""Engine test helpers on the fixture checkpoint: a config, a request, a recorder of a turn's outputs, runs and waits,
and the talker-driver tests' shared fixtures."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import fixture_tokenizers

from realtime_ming.engine import Engine
from realtime_ming.engine.api import (
    AudioChunk,
    Content,
    Message,
    SamplingParams,
    StageMark,
    TextDelta,
    TurnCancelled,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.engine.config import EngineConfig, TalkerRunnerConfig, ThinkerRunnerConfig
from realtime_ming.engine.models import ModelBundle
from realtime_ming.engine.segmenter import SegmenterConfig

_TERMINAL = (TurnDone, TurnCancelled, TurnFailed)
PROMPT_A = "Hello, how are you today?"
PROMPT_B = "Tell me something about the sea."
# A spoken turn starts with a forced, speakable prefix (engine/forced.py), then the model goes on with its own
# tokens: what the random weights write may decode to control characters on another fixture set, which the
# segmenter rightly does not speak. Tests of the talker need speech whatever the set. No punctuation: the
# reply stays one segment (one talker job) as the random reply alone was, so the audio of a turn does not
# depend on when a second job starts beside the first.
SPOKEN_PREFIX = {PROMPT_A: "Hi there ", PROMPT_B: "The sea "}


def _config(fixture_root, engine: dict | None = None, **thinker) -> EngineConfig:
    # the first segment waits for text, never for the clock, so segments (hence audio) do not depend on timing;
    # every talker job prefills its whole prompt (voice_head_cache=0): a job prefilled from a cached voice head
    # equals a full prefill to ~1e-7, not bit for bit (test_talker_voice_head checks that), and these tests
    # compare a turn's audio bit for bit with that of a turn run earlier or later in the same engine
    return EngineConfig(**(engine or {}), model_path=str(fixture_root), tokenizer_path=fixture_tokenizers(fixture_root)[0],
                        talker_tokenizer_path=fixture_tokenizers(fixture_root)[1],
                        thinker=ThinkerRunnerConfig(**(dict(max_slots=16, max_seq_len=512, prefill_chunk_tokens=48)
                                                       | thinker)),
                        talker=TalkerRunnerConfig(max_streams=4, voice_head_cache=0),
                        segmenter=SegmenterConfig(first_max_wait_ms=60_000.0))


class Recorder:
    """A turn's sink: its events in order (appended on the engine thread); `on_event` runs there too."""

    def __init__(self, on_event=None):
        self.events: list = []
        self.finished = threading.Event()
        self._on_event = on_event

    def __call__(self, event) -> None:
        self.events.append(event)
        if self._on_event is not None:
            self._on_event(event)
        if isinstance(event, _TERMINAL):
            self.finished.set()

    def wait(self):
        assert self.finished.wait(90), self.events[-3:]
        return self.events[-1]

    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta))

    def pcm(self) -> np.ndarray:
        chunks = [e.pcm for e in self.events if isinstance(e, AudioChunk)]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)

    def outputs(self) -> list:
        """Everything but the stage timestamps."""
        return [e for e in self.events if not isinstance(e, StageMark)]


def _request(turn_id: str, text: str, *, conversation: str | None = None, max_tokens: int = 12, seed: int | None = None,
             temperature: float = 0.0, ignore_eos: bool = True, history: tuple = (), **kw) -> TurnRequest:
    if kw.get("with_audio", True) and "forced_prefix" not in kw:
        kw["forced_prefix"] = SPOKEN_PREFIX.get(text, "Well ")
    messages = (*history, Message("user", (Content.of_text(text),)))
    sampling = SamplingParams(temperature=temperature, top_p=0.9 if temperature else 1.0, max_tokens=max_tokens,
                              seed=seed, ignore_eos=ignore_eos)
    return TurnRequest(turn_id, conversation or turn_id, messages, sampling=sampling, **kw)


def _run(engine: Engine, request: TurnRequest) -> Recorder:
    rec = Recorder()
    engine.submit(request, rec)
    rec.wait()
    return rec


def _wait_stats(engine: Engine, predicate) -> None:
    """Probe `engine.stats()` (answered at each step boundary) until `predicate(stats)` holds."""
    for _ in range(100_000):
        if predicate(engine.stats()):
            return
    raise AssertionError("engine never reached the expected state")


def _done_fields(done: TurnDone) -> tuple:
    return (done.text, done.finish_reason, done.prompt_tokens, done.cached_tokens, done.output_tokens,
            done.audio_samples)


class _CancelAt:
    """A Recorder hook: cancel the turn when its `index`-th event (0-based) arrives; keep what arrives after."""

    def __init__(self, engine: Engine, turn_id: str, index: int):
        self.engine, self.turn_id, self.index = engine, turn_id, index
        self.num_events = 0
        self.late: list | None = None  # events delivered after the cancel request

    def __call__(self, event) -> None:
        if self.late is not None:
            self.late.append(event)
        elif self.num_events == self.index:
            self.late = []
            self.engine.cancel(self.turn_id)
        self.num_events += 1


def _cancel_waves(engine: Engine, events: int, waves: int = 3, per_wave: int = 10) -> list[_CancelAt]:
    """`waves` x `per_wave` turns, each cancelled at its own event (index·7 mod `events - 1`: every stage of a turn
    with `events` events), a wave at a time; every turn ended with exactly one terminal event, the last, and a
    cancelled turn's text is what it delivered. -> the hooks (what arrived after each cancel call)."""
    hooks, recorders = [], []
    for wave in range(waves):
        for index in range(wave * per_wave, (wave + 1) * per_wave):
            hooks.append(_CancelAt(engine, f"c{index}", (index * 7) % (events - 1)))
            recorders.append(Recorder(hooks[-1]))
            engine.submit(_request(f"c{index}", PROMPT_A, seed=4), recorders[-1])
        for rec in recorders[-per_wave:]:
            rec.wait()
    for rec in recorders:
        assert sum(isinstance(e, _TERMINAL) for e in rec.events) == 1 and isinstance(rec.events[-1], _TERMINAL)
        if isinstance(rec.events[-1], TurnCancelled):
            assert rec.events[-1].text == rec.text()
    return hooks


def _assert_same_output(a: Recorder, b: Recorder) -> None:
    """What the client gets is the same: text, bit-identical audio of every segment, usage (a confirmed speculative
    turn's held events are released coalesced: fewer, longer deltas)."""
    assert a.text() == b.text() and _done_fields(a.events[-1]) == _done_fields(b.events[-1])
    segments = {e.segment_id for r in (a, b) for e in r.events if isinstance(e, AudioChunk)}
    for seg in segments:
        pa, pb = ([e.pcm for e in r.events if isinstance(e, AudioChunk) and e.segment_id == seg] for r in (a, b))
        assert pa and pb and np.array_equal(np.concatenate(pa), np.concatenate(pb))


@pytest.fixture(scope="module")
def bundle(fixture_root) -> ModelBundle:
    return ModelBundle.load(_config(fixture_root))


@pytest.fixture
def engines():
    made = []
    yield made
    for engine in made:
        engine.close()


def _pcm_by_segment(rec: Recorder) -> dict[int, np.ndarray]:
    segments = sorted({e.segment_id for e in rec.events if isinstance(e, AudioChunk)})
    return {s: np.concatenate([e.pcm for e in rec.events if isinstance(e, AudioChunk) and e.segment_id == s])
            for s in segments}
