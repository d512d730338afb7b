"""The mixed step (decode rows and a prefill chunk in one forward, `engine/thinker_mixed.py`) computes what the two
forwards compute apart -- logits and the K/V it writes -- on the fixture thinker, sharded over two gloo ranks too,
and an engine that mixes speaks exactly as one that does not."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from realtime_ming.engine import Engine
from realtime_ming.engine.api import TextDelta
from realtime_ming.engine.config import EngineConfig, PlacementConfig, ThinkerRunnerConfig
from realtime_ming.engine.thinker_mixed import MIXED_FIELDS, ThinkerMixer, mixed_buckets, pack_mixed
from realtime_ming.model.multimodal import PrefillInputs
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker
from conftest import fixture_tokenizers
from test_engine import Recorder, _config, _request, _run

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


def _prompt(model, ids: list[int], start: int, delta: int, audio: slice | None = None, device="cpu") -> PrefillInputs:
    """A prompt tail at cache positions start.., rotary positions shifted by `delta` (as after media), with an
    audio-routed span if given."""
    n = len(ids)
    cpos = torch.arange(start, start + n, device=device)[None]
    mask = None
    if audio is not None:
        mask = torch.zeros(1, n, dtype=torch.bool, device=device)
        mask[0, audio] = True
    return PrefillInputs(model.embed(torch.tensor([ids], device=device)), (cpos + delta)[None].expand(3, 1, n).clone(), cpos,
                         None, mask, delta)


def _row(slot: int, ids: list[int], next_token=None, delta=0, prefill=None):
    return SimpleNamespace(slot=SimpleNamespace(index=slot, ids=list(ids)), next_token=next_token, rope_delta=delta,
                           prefill=prefill)


@torch.no_grad()
def mixed_equals_apart(model, make_mixer, capacity: int, device="cpu", tol: float = 1e-4):
    """Slot 0 decodes (10 cached tokens, rotary delta 3), slot 1 prefills a whole 12-token prompt with an audio span,
    slot 2 the first 5 tokens of a prompt after 4 cached ones: the mixed step's logits and K/V equal the separate
    forwards' (the reference path: plain forwards over a copy of the cache)."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.cfg.vocab_size
    a, b, c = (torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (10, 12, 9))
    dev = torch.device(device)
    ref = ThinkerKVCache.allocate(model.cfg, 4, capacity, tp=model.tp, device=dev, dtype=model.lm_head.weight.dtype)
    for slot, ids, delta in ((0, a, 3), (2, c[:4], 0)):  # cached history of the decoding row and the partial prompt
        p = _prompt(model, ids, 0, delta, device=dev)
        model(p.inputs_embeds, p.position_ids, cache=ref, slots=torch.tensor([slot], device=dev),
              cache_positions=p.cache_positions)
    mixed = ThinkerKVCache(ref.k.clone(), ref.v.clone())
    # apart: the decode row, then each prompt's chunk, each its own forward
    dec = _row(0, a, next_token=int(torch.randint(0, vocab, (1,), generator=gen)), delta=3)
    pos = torch.tensor([[len(a)]], device=dev)
    want_dec = model.logits(model(model.embed(torch.tensor([[dec.next_token]], device=dev)),
                                  (pos + 3)[None].expand(3, 1, 1), cache=ref, slots=torch.tensor([0], device=dev),
                                  cache_positions=pos)[:, -1])
    p1, p2 = _prompt(model, b, 0, 0, audio=slice(3, 8), device=dev), _prompt(model, c[4:], 4, 0, device=dev)
    want_b = model.logits(model(p1.inputs_embeds, p1.position_ids, cache=ref, slots=torch.tensor([1], device=dev),
                                cache_positions=p1.cache_positions, audio_mask=p1.audio_mask)[:, -1])
    model(p2.inputs_embeds[:, :2], p2.position_ids[:, :, :2], cache=ref, slots=torch.tensor([2], device=dev),
          cache_positions=p2.cache_positions[:, :2])
    # mixed: one forward; slot 2's chunk is its next 2 tokens only (a prompt the chunk does not complete)
    chosen = [(_row(1, [], prefill=p1), 0, 12), (_row(2, c[:4], prefill=p2), 0, 2)]
    needed, ints, embeds, last = pack_mixed([dec], chosen, device=dev, dtype=model.lm_head.weight.dtype,
                                            hidden=model.cfg.hidden_size)
    assert ints.shape == (len(MIXED_FIELDS), 1 + 12 + 2) and embeds.shape == (15, model.cfg.hidden_size)
    assert last == [12, 14] and needed == 12  # slot 1 fills positions 0..11
    mixer = make_mixer(mixed)
    got = mixer.step(needed, ints, embeds, torch.tensor([last[0], 0], device=dev))
    torch.testing.assert_close(got[0], want_b[0], rtol=tol, atol=tol)
    torch.testing.assert_close(got[1], want_dec[0], rtol=tol, atol=tol)
    written = [(0, len(a) + 1), (1, 12), (2, 6)]
    for slot, n in written:
        torch.testing.assert_close(mixed.k[:, slot, :, :n], ref.k[:, slot, :, :n], rtol=tol / 10, atol=tol / 10)
        torch.testing.assert_close(mixed.v[:, slot, :, :n], ref.v[:, slot, :, :n], rtol=tol / 10, atol=tol / 10)
    return mixer
    assert not mixed.k[:, 3].any()  # padding and sink writes stay out of other slots


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

    def spy(budget, rows):
        chosen = original(budget, rows)
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
