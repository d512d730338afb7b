"""Thinker decode and prefill CUDA graphs (engine.thinker_decode / thinker_prefill) on the golden fixture
thinker (CUDA only).

The CPU fp32 engine is the reference: the GPU engine with graphs off and on, at TP=1 and (two
GPUs) TP=2, must generate exactly its greedy tokens, for a text turn and an audio turn; the graphed
decoder's logits equal the eager decoder's for every batch size over KV buckets; the graphed prefill
equals the eager one at every width bucket; bf16 stays within bf16 tolerance of fp32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from realtime_ming.engine.api import TurnDone
from realtime_ming.engine.thinker_decode import ThinkerDecoder, default_kv_buckets, eager_kv_len
from realtime_ming.engine.thinker_prefill import ThinkerPrefiller
from realtime_ming.model.kernels import TRITON
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker
from gpu_engine_support import generate

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
pytestmark = pytest.mark.timeout(300)


def test_default_kv_buckets_cover_max_seq_len():
    assert default_kv_buckets(4096) == (512, 1024, 2048, 4096)
    assert default_kv_buckets(3000) == (512, 1024, 2048, 3000)
    assert default_kv_buckets(300) == (300,)


def test_eager_decoder_on_cpu_equals_the_plain_forward(fixture_root):
    """On CPU the decoder is the plain embed -> stack -> lm_head call (same logits, same cache writes)."""
    thinker = load_thinker(fixture_root)
    cache = ThinkerKVCache.allocate(thinker.cfg, 2, 256)
    dec = ThinkerDecoder(thinker, cache, (1, 2), (128, 256), device="cpu")
    ref_cache = ThinkerKVCache.allocate(thinker.cfg, 2, 256)
    tok, pos = torch.tensor([[5], [9]]), torch.tensor([[0], [0]])
    with torch.no_grad():
        ref = thinker.logits(thinker(thinker.embed(tok), pos.unsqueeze(0).expand(3, -1, -1), cache=ref_cache,
                                     slots=torch.tensor([1, 0]), cache_positions=pos, kv_len=64)[:, -1])
    out = dec.step([5, 9], [0, 0], [0, 0], [1, 0])
    assert not dec.graphed
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(cache.k, ref_cache.k)


@pytest.fixture(scope="module")
def cpu_reference(fixture_root) -> list[TurnDone]:
    return generate(fixture_root, ("cpu",), eager=True)


def _same_tokens(got: list[TurnDone], ref: list[TurnDone]) -> None:
    for g, r in zip(got, ref):
        assert isinstance(g, TurnDone) and g.output_tokens == r.output_tokens == 24
        assert g.text == r.text


@cuda
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_gpu_tp1_engine_equals_cpu_fp32(fixture_root, cpu_reference, eager):
    _same_tokens(generate(fixture_root, ("cuda:0",), eager=eager), cpu_reference)


@two_gpus
def test_gpu_tp2_graphed_engine_equals_cpu_fp32(fixture_root, cpu_reference):
    _same_tokens(generate(fixture_root, ("cuda:0", "cuda:1"), eager=False), cpu_reference)


@two_gpus
def test_gpu_thinker_and_talker_on_different_gpus_graphed(fixture_root, cpu_reference):
    """Thinker graphs on cuda:0, talker/encoder/VAE graphs on cuda:1 (each captured on its own device)."""
    got = generate(fixture_root, ("cuda:0",), eager=False, talker="cuda:1")
    _same_tokens(got, cpu_reference)
    assert all(d.audio_samples > 0 for d in got)  # the talker graphs on cuda:1 spoke


@cuda
@pytest.mark.parametrize("talker", ["cuda:0", "cuda:1"], ids=["same-gpu", "own-gpu"])
def test_gpu_graphed_talker_in_its_own_process_speaks_as_the_inline_talker(fixture_root, cpu_reference, talker):
    """`engine.talker.driver: process`: the graphed talker captured and stepped in a process of its own (beside the
    thinker's GPU, or on a GPU of its own) gives the same tokens and the same amount of audio as the inline talker."""
    if talker == "cuda:1" and torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    stepped = generate(fixture_root, ("cuda:0",), eager=False, talker=talker)
    threaded = generate(fixture_root, ("cuda:0",), eager=False, talker=talker, driver="process")
    _same_tokens(threaded, cpu_reference)
    assert [d.audio_samples for d in threaded] == [d.audio_samples for d in stepped]
    assert all(d.audio_samples > 0 for d in threaded)
    assert [d.talker_steps for d in threaded] == [d.talker_steps for d in stepped]


@cuda
def test_graphed_decoder_logits_equal_eager_across_batches_and_kv_buckets(fixture_root):
    """Every batch 1..5 (buckets 1, 2, 4, 8: padded rows) at positions in both KV buckets: graph == eager."""
    thinker = load_thinker(fixture_root, device="cuda", kernels=TRITON)
    caches = [ThinkerKVCache.allocate(thinker.cfg, 8, 512, device="cuda") for _ in range(2)]
    for c in caches:  # same random history in both caches
        c.k.normal_(generator=torch.Generator("cuda").manual_seed(0))
        c.v.normal_(generator=torch.Generator("cuda").manual_seed(1))
    graphed = ThinkerDecoder(thinker, caches[0], (1, 2, 4, 8), (128, 512), device="cuda")
    eager = ThinkerDecoder(thinker, caches[1], (1, 2, 4, 8), (128, 512), device="cuda", enforce_eager=True)
    graphed.capture()
    assert graphed.graphed and not eager.graphed
    rng = np.random.default_rng(0)
    for batch in range(1, 6):
        for top in (100, 400):  # KV bucket 128, then 512
            slots = [int(s) for s in rng.permutation(8)[:batch]]
            args = ([int(t) for t in rng.integers(0, 500, batch)], [int(p) for p in rng.integers(top - 60, top, batch)],
                    [int(d) for d in rng.integers(-3, 3, batch)], slots)
            torch.testing.assert_close(graphed.step(*args).clone(), eager.step(*args), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[0].k[:, :, :, :512], caches[1].k[:, :, :, :512], rtol=1e-5, atol=1e-5)


@cuda
def test_bf16_graphed_decoder_within_bf16_tolerance_of_fp32(fixture_root):
    thinker32 = load_thinker(fixture_root, device="cuda", kernels=TRITON)
    thinker16 = load_thinker(fixture_root, device="cuda", dtype=torch.bfloat16, kernels=TRITON)
    outs = []
    for model, dtype in ((thinker32, torch.float32), (thinker16, torch.bfloat16)):
        cache = ThinkerKVCache.allocate(model.cfg, 4, 256, device="cuda", dtype=dtype)
        dec = ThinkerDecoder(model, cache, (1, 4), (256,), device="cuda", enforce_eager=dtype == torch.float32)
        dec.capture()
        steps = [dec.step([7 + i, 11 + i, 13 + i], [i, i, i], [0, 0, 0], [0, 2, 3]).clone() for i in range(6)]
        outs.append(torch.stack(steps))
    cos = torch.nn.functional.cosine_similarity(outs[0].flatten(0, 1), outs[1].flatten(0, 1), dim=-1)
    assert float(cos.min()) > 0.99, cos


def _prefill_rows(thinker, device, lengths, starts, seed=0):
    """Inputs of one padded multi-row prefill chunk: rows of `lengths` tokens continuing at `starts`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    r, w = len(lengths), max(lengths)
    emb = torch.zeros(r, w, thinker.cfg.hidden_size, device=device)
    cpos = torch.full((r, w), -1, dtype=torch.int64, device=device)
    for i, (t, start) in enumerate(zip(lengths, starts)):
        emb[i, :t] = thinker.embed(torch.randint(0, 400, (1, t), device=device, generator=gen))[0]
        cpos[i, :t] = torch.arange(start, start + t, device=device)
    rot = cpos.clamp(min=0)[None].expand(3, r, w).contiguous()
    audio = (torch.rand(r, w, device=device, generator=gen) < 0.5) & (cpos >= 0)
    return emb, rot, cpos, torch.zeros_like(audio), audio


def test_prefiller_pads_rows_to_a_bucket_with_sink_writes_only(fixture_root):
    """Three prompts prefilled as one chunk through the 4-row bucket (the fourth row padding, slot 0, every
    position -1) give the plain forward's hidden states for the three rows and leave every other slot's
    K/V as they were (CPU: the eager path of the same padding code)."""
    thinker = load_thinker(fixture_root)
    caches = [ThinkerKVCache.allocate(thinker.cfg, 5, 128) for _ in range(2)]
    for c in caches:
        c.k.normal_(generator=torch.Generator().manual_seed(3))
    pre = ThinkerPrefiller(thinker, caches[0], (16, 32), dtype=torch.float32, device="cpu", rows=(1, 2, 4), tokens=128)
    assert set(pre.graphs) == {1, 2, 4} and pre.graphs[4].buckets == (16, 32)
    emb, rot, cpos, image, audio = _prefill_rows(thinker, "cpu", (7, 20, 13), (0, 5, 0))
    slots = torch.tensor([1, 3, 4])
    with torch.no_grad():
        got = pre.step(emb, rot, cpos, slots, image, audio)
        want = thinker(emb, rot, cache=caches[1], slots=slots, cache_positions=cpos, kv_len=128, image_mask=image,
                       audio_mask=audio)
    assert got.shape == want.shape == (3, 20, thinker.cfg.hidden_size)
    live = cpos >= 0
    torch.testing.assert_close(got[live], want[live], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[0].k[:, :, :, :128], caches[1].k[:, :, :, :128])  # slot 0 untouched too


@cuda
def test_graphed_multi_row_prefill_equals_eager(fixture_root):
    """Several prompts as one graphed chunk (rows padded to the bucket, widths to theirs) equal the eager
    prefill of the same rows, hidden states and K/V."""
    torch.backends.cuda.matmul.allow_tf32 = False
    thinker = load_thinker(fixture_root, device="cuda", kernels=TRITON)
    caches = [ThinkerKVCache.allocate(thinker.cfg, 6, 256, device="cuda") for _ in range(2)]
    pre = ThinkerPrefiller(thinker, caches[0], (16, 32, 64), dtype=torch.float32, device="cuda", rows=(1, 2, 4, 8),
                           tokens=128)
    pre.capture()
    assert pre.fits(30, 3) and pre.fits(16, 8) and not pre.fits(40, 3) and not pre.fits(8, 9)
    for lengths, starts, slots in (((7, 30, 12), (0, 0, 3), [1, 2, 5]), ((16, 9, 3, 11, 5), (0, 2, 0, 0, 0),
                                                                          [0, 1, 2, 3, 4])):
        emb, rot, cpos, image, audio = _prefill_rows(thinker, "cuda", lengths, starts)
        slot_t = torch.tensor(slots, device="cuda")
        with torch.no_grad():
            got = pre.step(emb, rot, cpos, slot_t, image, audio).clone()
            want = thinker(emb, rot, cache=caches[1], slots=slot_t, cache_positions=cpos, kv_len=256,
                           image_mask=image, audio_mask=audio)
        live = cpos >= 0
        torch.testing.assert_close(got[live], want[live], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[0].k[:, :, :, :256], caches[1].k[:, :, :, :256], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[0].v[:, :, :, :256], caches[1].v[:, :, :, :256], rtol=1e-5, atol=1e-5)


@cuda
def test_graphed_prefill_equals_eager_prefill(fixture_root):
    """Padded width buckets (sink-written padding, whole-slot attention) give the eager prefill's hidden
    states and K/V, for text and audio-routed tokens, after a cached prefix."""
    torch.backends.cuda.matmul.allow_tf32 = False
    thinker = load_thinker(fixture_root, device="cuda", kernels=TRITON)
    caches = [ThinkerKVCache.allocate(thinker.cfg, 4, 256, device="cuda") for _ in range(2)]
    pre = ThinkerPrefiller(thinker, caches[0], (16, 32, 64), dtype=torch.float32, device="cuda")
    pre.capture()
    assert pre.graphed and pre.fits(64) and not pre.fits(65)
    gen = torch.Generator(device="cuda").manual_seed(0)
    slots = torch.tensor([2], device="cuda")
    for t, start in ((5, 0), (32, 5), (50, 37)):  # a cached prefix grows: each chunk continues the slot
        ids = torch.randint(0, 400, (1, t), device="cuda", generator=gen)
        emb = thinker.embed(ids)
        cpos = torch.arange(start, start + t, device="cuda")[None]
        rot = cpos[None].expand(3, 1, t)
        audio = torch.rand(1, t, device="cuda", generator=gen) < 0.5
        image = torch.zeros_like(audio)
        with torch.no_grad():
            got = pre.step(emb, rot, cpos, slots, image, audio).clone()
            want = thinker(emb, rot, cache=caches[1], slots=slots, cache_positions=cpos,
                           kv_len=eager_kv_len(start + t, 256), image_mask=image, audio_mask=audio)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[0].k[:, :, :, :256], caches[1].k[:, :, :, :256], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[0].v[:, :, :, :256], caches[1].v[:, :, :, :256], rtol=1e-5, atol=1e-5)
