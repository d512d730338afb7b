"""Whole models through the fused kernels equal the golden fixtures (Triton's CPU interpreter).

Models built with `Kernels(triton=True, cpu_interpreter=True)` send the tiny fixture models' CPU tensors
through the same Triton kernels
the GPU runs (norms, rotary + cache writes, SwiGLU, decode attention, router, MoE decode), so
wiring mistakes between model code and kernels fail here in CI, not first on a GPU. On a GPU
machine the interpreter is off and tests/test_gpu_*.py cover the compiled kernels instead.
"""

from __future__ import annotations

import pytest
import torch
from talker_support import _close as _close_loop
from talker_support import _fixture_steps
from thinker_decode_support import _text_greedy
from vae_support import _load_vae, _stream

from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.kernels import TRITON, interpreting, select_kernels
from realtime_ming.model.talker import load_talker
from realtime_ming.model.thinker import load_thinker

pytestmark = pytest.mark.skipif(not interpreting(), reason="Triton's CPU interpreter is off (a GPU run "
                                                           "checks the compiled kernels instead)")


@pytest.fixture
def on_kernels():
    """The serving selection, with the kernels also taking CPU tensors (in the interpreter)."""
    return TRITON.on_cpu()


@pytest.mark.slow  # the full tier: a whole decode in the interpreter (~30 s CPU); the logits test keeps the wiring in the fast tier
def test_thinker_greedy_decode_through_kernels(fixture_root, load_case, on_kernels):
    """Prefill + cached one-token decode (decode attention, router and MoE decode kernels) = fixture tokens."""
    tensors, _ = load_case("thinker_text")
    thinker = load_thinker(fixture_root, kernels=on_kernels)
    expected = tensors["greedy_ids"]
    assert torch.equal(_text_greedy(thinker, tensors["input_ids"], n=expected.shape[1]), expected)


def test_thinker_logits_through_kernels(fixture_root, load_case, on_kernels):
    tensors, _ = load_case("thinker_text")
    thinker = load_thinker(fixture_root, kernels=on_kernels)
    with torch.no_grad():
        logits = thinker.logits(thinker(thinker.embed(tensors["input_ids"]), tensors["position_ids"]))
    torch.testing.assert_close(logits, tensors["logits"], atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # the full tier: three talker steps in the interpreter (~25 s CPU)
def test_talker_loop_through_kernels(fixture_root, load_case, on_kernels):
    """The talker AR loop (LM prefill and cached decode, CFM/DiT, aggregator) reproduces the recorded
    tensors of its first three steps (the interpreter runs ~5 s per step)."""
    tensors, _ = load_case("talker_loop")
    talker = load_talker(load_checkpoint_config(fixture_root).talker, fixture_root / "talker" / "model.safetensors",
                         kernels=on_kernels)
    steps = _fixture_steps(talker, tensors, max_steps=3)
    for attr, name in [("hidden", "lm_last_hidden"), ("gen_lat", "gen_lat"), ("next_embed", "next_embed")]:
        _close_loop(torch.stack([getattr(s, attr) for s in steps]), tensors[name][:3])


def test_vae_stream_through_kernels(fixture_root, load_case, on_kernels):
    """Streaming VAE decode (Qwen2 backbone with a sliding-window cache) = the reference chunks."""
    t, _ = load_case("vae_decode")
    vae = select_kernels(_load_vae(fixture_root), on_kernels)
    audio, lengths = _stream(vae, t["latents"], load_checkpoint_config(fixture_root).talker.patch_size)
    assert lengths == t["stream_chunk_lengths"].tolist()
    torch.testing.assert_close(audio, t["stream_decode_concat"][0, 0], rtol=1e-4, atol=1e-5)
