"""The mixed step (decode rows and a prefill chunk in one forward, `engine/thinker_mixed.py`) computes what the two
forwards compute apart -- logits and the K/V it writes -- on the fixture thinker, sharded over two gloo ranks too,
and an engine that mixes speaks exactly as one that does not."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from realtime_ming.engine import Engine
from realtime_ming.engine.api import TextDelta
from realtime_ming.engine.config import EngineConfig, PlacementConfig, ThinkerRunnerConfig
from realtime_ming.engine.thinker_mixed import ThinkerMixer, mixed_buckets
from realtime_ming.model.thinker import load_thinker
from conftest import fixture_tokenizers
from engine_support import Recorder, _config, _request, _run
from thinker_decode_support import mixed_equals_apart

pytestmark = pytest.mark.timeout(300)


def test_mixed_buckets_cover_the_largest_and_grow_geometrically():
    assert mixed_buckets(512) == (32, 64, 128, 192, 256, 384, 512)
    assert mixed_buckets(100) == (32, 64, 100)
    assert mixed_buckets(20) == (20,)


def test_mixed_step_tokens_must_leave_room_beside_the_decode_rows():
    with pytest.raises(ValueError, match="mixed_step_tokens"):
        ThinkerRunnerConfig(max_batch=16, mixed_step_tokens=16)
    with pytest.raises(ValueError, match="mixed_step_tokens"):
        ThinkerRunnerConfig(mixed_step_tokens=-5)
    assert ThinkerRunnerConfig(max_batch=16, mixed_step_tokens=17).mixed_step_tokens == 17


def test_mixed_step_equals_decode_and_prefill_apart(fixture_root):
    model = load_thinker(fixture_root)
    mixed_equals_apart(model, lambda cache: ThinkerMixer(model, cache, (64,), picks=4, dtype=torch.float32,
                                                          device="cpu"), 64)


def test_tp2_mixed_step_equals_the_sharded_forwards(fixture_root):
    """The mixer every rank builds (gloo, two CPU ranks) equals rank 0's sharded plain forwards."""
    cfg = EngineConfig(model_path=str(fixture_root), tokenizer_path=fixture_tokenizers(fixture_root)[0],
                       talker_tokenizer_path=fixture_tokenizers(fixture_root)[1],
                       placement=PlacementConfig(thinker_devices=("cpu", "cpu")),
                       thinker=ThinkerRunnerConfig(max_slots=4, max_seq_len=64, mixed_step_tokens=64))
    engine = Engine.create(cfg, warmup=False)
    try:
        proxy = engine._thinker.model
        assert engine._thinker.mixer.max_tokens == 64
        # each rank's mixer over that rank's copy of the cache (the reference runs over the runner's own)
        mixed_equals_apart(proxy, lambda cache: proxy.mixer(cache, (64,), picks=4), 64)
    finally:
        engine.close()


def test_engine_mixing_decode_and_prefill_speaks_as_without(make_engine):
    """Turns arriving while others decode prefill in mixed steps (a long prompt over several of them, packed
    beside the decode rows); every turn's text and audio equal the same turn on an engine that does not mix."""
    plain, mixing = make_engine(), make_engine(mixed_step_tokens=40)
    runner, steps = mixing._thinker, []
    original = runner.scheduler.prefill_packed

    def spy(budget, rows, fresh_only=False):
        chosen = original(budget, rows, fresh_only)
        steps.append([end - start for _, start, end in chosen])
        return chosen

    runner.scheduler.prefill_packed = spy
    long_text = " ".join(["The quick brown fox jumps over the lazy dog."] * 4)
    prompts = {"a": "Hello, how are you today?", "l": long_text, "b": "Tell me something about the sea."}
    heard = {}
    for engine in (plain, mixing):
        decoding = threading.Event()
        first = Recorder(on_event=lambda e: decoding.set() if isinstance(e, TextDelta) else None)
        engine.submit(_request("a", prompts["a"], max_tokens=40), first)
        assert decoding.wait(60)
        others = {k: Recorder() for k in ("l", "b")}
        for k, rec in others.items():
            engine.submit(_request(k, prompts[k], max_tokens=12), rec)
        for rec in (first, *others.values()):
            rec.wait()
        heard[engine] = {"a": first, **others}
    packed = [s for s in steps if s]  # chunks that ran beside decode rows: the long prompt needs several
    assert len(packed) >= 2 and all(sum(s) <= 40 - 1 for s in packed), steps
    for k in prompts:
        a, b = heard[plain][k], heard[mixing][k]
        assert b.text() == a.text() and b.events[-1].output_tokens == a.events[-1].output_tokens
        assert b.events[-1].audio_samples > 0
        np.testing.assert_allclose(b.pcm(), a.pcm(), rtol=0, atol=1e-4)


@pytest.fixture
def make_engine(fixture_root):
    from realtime_ming.engine.models import ModelBundle

    bundle = ModelBundle.load(_config(fixture_root))
    engines = []

    def make(**thinker) -> Engine:
        engines.append(Engine(_config(fixture_root, None, **thinker), bundle))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()


def test_solo_turn_on_a_mixing_engine_equals_the_plain_one(make_engine):
    """A turn alone never mixes (nothing decodes beside its prefill): same text as without."""
    plain, mixing = make_engine(), make_engine(mixed_step_tokens=40)
    assert _run(mixing, _request("s", "Hi")).text() == _run(plain, _request("s", "Hi")).text()
