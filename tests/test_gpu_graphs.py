"""engine.graphs.BucketedGraph: graph replay equals the eager call for every batch of every bucket (CUDA only)."""

from __future__ import annotations

import pytest
import torch

from realtime_ming.engine.graphs import BucketedGraph, GraphInput, pick_bucket
from realtime_ming.model.cfm import CFMParams, sway_time_grid
from realtime_ming.model.loader import init_dummy
from realtime_ming.model.presets import tiny_config
from realtime_ming.model.qwen2 import KVCache
from realtime_ming.model.kernels import TRITON
from realtime_ming.model.talker import Talker
from realtime_ming.model.tiny_tokenizer import (
    TINY_VOCAB_SIZE,
    tiny_talker_special_ids,
    tiny_thinker_special_ids,
)

BUCKETS = (1, 2, 4, 8)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def test_pick_bucket():
    """The smallest bucket >= batch is chosen; None above the largest."""
    assert [pick_bucket(BUCKETS, b) for b in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]


def test_eager_on_cpu_is_the_plain_call():
    """On CPU step() is the eager call itself (no capture, exact result)."""
    g = BucketedGraph(lambda x: x * 2, {"x": GraphInput((8, 3), torch.float32)}, BUCKETS, device="cpu")
    x = torch.randn(3, 3)
    assert torch.equal(g.step(x=x), x * 2) and not g.graphed


@pytest.fixture(scope="module")
def talker():
    cfg = tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE).talker
    with torch.device("meta"):
        model = Talker(cfg, kernels=TRITON)
    return init_dummy(model, seed=3, device="cuda", dtype=torch.float32).eval()


@cuda
def test_graph_padding_rows_are_neutralised():
    """Rows past the batch get the pad value; unbatched inputs are copied whole; outputs are sliced."""
    def fn(x, t):
        return x + t.sum(), x.sum(1)

    g = BucketedGraph(fn, {"x": GraphInput((8, 4), torch.float32, pad=-7.0), "t": GraphInput((3,), torch.float32, None)},
                      BUCKETS, device="cuda")
    g.capture()
    for batch in range(1, 9):
        x, t = torch.randn(batch, 4, device="cuda"), torch.randn(3, device="cuda")
        a, b = g.step(x=x, t=t)
        torch.testing.assert_close(a, x + t.sum())
        torch.testing.assert_close(b, x.sum(1))
        bucket = pick_bucket(BUCKETS, batch)
        assert torch.all(g._static["x"][batch:bucket] == -7.0)


@cuda
@torch.no_grad()
def test_talker_tail_graph_matches_eager_per_bucket(talker):
    """Talker.tail_step graphed per bucket equals eager for batches 1..8 (fp32, atol/rtol 1e-4)."""
    cfg = talker.cfg
    h, c, p, s = talker.hidden_size, talker.latent_dim, cfg.patch_size, cfg.steps
    t_grid = sway_time_grid(s, torch.float32, "cuda")
    top = max(BUCKETS)
    specs = {"h": GraphInput((top, 1, h), torch.float32), "his": GraphInput((top, cfg.history_patch_size, c), torch.float32),
             "y0": GraphInput((top, p, c), torch.float32), "rnd": GraphInput((s, top, p, c), torch.float32, batch_dim=1),
             "args": GraphInput((top, 3), torch.float32)}

    def tail(h, his, y0, rnd, args):
        return talker.tail_step(h, his, y0, rnd, t_grid, args)

    g = BucketedGraph(tail, specs, BUCKETS, device="cuda")
    g.capture()
    for batch in (1, 2, 3, 5, 8):
        args = CFMParams(temperature=0.5).tensor("cuda").expand(batch, 3).contiguous()
        inputs = {"h": torch.randn(batch, 1, h, device="cuda"),
                  "his": torch.randn(batch, cfg.history_patch_size, c, device="cuda"),
                  "y0": torch.randn(batch, p, c, device="cuda"), "rnd": torch.randn(s, batch, p, c, device="cuda"),
                  "args": args}
        want = tail(**inputs)
        got = g.step(**inputs)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@cuda
@torch.no_grad()
def test_talker_decode_lm_graph_matches_eager_with_cache(talker):
    """decode_lm graphed (cache rows of the bucket, padding at position -1) equals eager on a twin cache."""
    cfg = talker.cfg
    top, prompt = max(BUCKETS), 6
    caches = [KVCache.allocate(cfg.llm, top, 32, "cuda", torch.float32) for _ in range(2)]
    embeds = torch.randn(top, prompt, talker.hidden_size, device="cuda")
    pos = torch.arange(prompt, device="cuda").expand(top, prompt)
    for cache in caches:
        talker.prefill(embeds, pos, cache)

    def decode(e, p):
        return talker.decode_lm(e, p, caches[1].rows(0, e.shape[0]))

    g = BucketedGraph(decode, {"e": GraphInput((top, 1, talker.hidden_size), torch.float32),
                               "p": GraphInput((top, 1), torch.int64, pad=-1)}, BUCKETS, device="cuda")
    g.capture()
    for step, batch in enumerate((3, 8, 1, 5)):
        e = torch.randn(batch, 1, talker.hidden_size, device="cuda")
        p = torch.full((batch, 1), prompt + step, device="cuda")
        want = talker.decode_lm(e, p, caches[0].rows(0, batch))
        torch.testing.assert_close(g.step(e=e, p=p), want, atol=1e-4, rtol=1e-4)


@cuda
@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_audio_encoder_graphs_equal_eager_exact_length(fixture_root, dtype):
    """Graphed audio encoder + projector (clip zero-padded to its bucket, masked) == the eager exact-length
    call, for lengths in and across buckets; a clip above the largest bucket runs eager."""
    from realtime_ming.engine.audio_graphs import AudioEncoderGraphs
    from realtime_ming.model.audio_encoder import AudioProjector, WhisperEncoder
    from realtime_ming.model.config import load_checkpoint_config
    from realtime_ming.model.loader import load_weights, read_weight_map

    cfg = load_checkpoint_config(fixture_root).ming
    weights = read_weight_map(fixture_root)
    with torch.device("meta"):
        encoder, projector = WhisperEncoder(cfg.audio_config), AudioProjector(cfg.audio_config, cfg.llm_config.hidden_size)
    load_weights(encoder, weights, prefix="audio.", device="cuda", dtype=dtype)
    load_weights(projector, weights, prefix="linear_proj_audio.", device="cuda", dtype=dtype)
    graphs = AudioEncoderGraphs(encoder, projector, cfg.audio_config, (64, 160), dtype=dtype, device="cuda",
                                out_device="cuda")
    graphs.capture()
    assert graphs.graphed
    gen = torch.Generator().manual_seed(0)
    for frames in (7, 64, 65, 100, 160, 200):
        mel = torch.randn(frames, cfg.audio_config.whisper_encoder_config.n_mels, generator=gen)
        want = projector(encoder(mel[None].to("cuda", dtype)))[0]
        got = graphs(mel)
        assert got.shape == want.shape
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        else:  # rounding differs with the padded shapes: relative L2 error of the whole clip
            assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
