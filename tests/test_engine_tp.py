"""Tensor-parallel thinker in the engine: TP=2 (gloo, two CPU processes) equals TP=1 on the fixture weights."""

from __future__ import annotations

import threading

import pytest

from realtime_ming.engine import Engine
from realtime_ming.engine.api import Content, Message, SamplingParams, TurnDone, TurnRequest
from realtime_ming.engine.config import EngineConfig, PlacementConfig
from realtime_ming.model.tiny_tokenizer import tiny_tokenizer_path


def _greedy_text(fixture_root, devices) -> TurnDone:
    cfg = EngineConfig(model_path=str(fixture_root), tokenizer_path=str(tiny_tokenizer_path("thinker")),
                       talker_tokenizer_path=str(tiny_tokenizer_path("talker")),
                       placement=PlacementConfig(thinker_devices=devices))
    engine = Engine.create(cfg, warmup=False)
    try:
        done, events = threading.Event(), []

        def sink(ev):
            events.append(ev)
            if isinstance(ev, TurnDone):
                done.set()

        request = TurnRequest("t", "c", (Message("user", (Content.of_text("Hello, how are you today?"),)),),
                              sampling=SamplingParams(max_tokens=10, ignore_eos=True), with_audio=False)
        engine.submit(request, sink)
        assert done.wait(120), events[-3:]
        return events[-1]
    finally:
        engine.close()


@pytest.mark.timeout(300)
def test_engine_tp2_fixture_greedy_equals_tp1(fixture_root):
    """The fixture thinker sharded over two ranks generates exactly the TP=1 greedy tokens."""
    one = _greedy_text(fixture_root, ("cpu",))
    two = _greedy_text(fixture_root, ("cpu", "cpu"))
    assert one.output_tokens == two.output_tokens == 10
    assert two.text == one.text
