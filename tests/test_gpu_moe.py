"""model.kernels.moe_experts: the fused Triton experts equal moe.py's reference math (CUDA + Triton only)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from realtime_ming.model import moe
from realtime_ming.model.kernels import REFERENCE, Kernels, available, select_kernels
from realtime_ming.model.kernels.moe_experts import fused_experts
from realtime_ming.model.loader import init_dummy
from realtime_ming.model.presets import preset_config

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not available(), reason="needs Triton (import triton failed)"),
]


def _experts(num_experts: int, dtype: torch.dtype, seed: int):
    """Real Ming-flash-omni-2.0 expert shapes (D, I, top-k) with fewer experts, random weights."""
    cfg = preset_config("ming-flash-omni-2.0").thinker
    d, i = cfg.hidden_size, cfg.moe_intermediate_size
    g = torch.Generator(device="cuda").manual_seed(seed)
    w_gate_up = (torch.randn(num_experts, 2 * i, d, device="cuda", generator=g) / d ** 0.5).to(dtype)
    w_down = (torch.randn(num_experts, d, i, device="cuda", generator=g) / i ** 0.5).to(dtype)
    return cfg, w_gate_up, w_down


def _routing(n: int, k: int, num_experts: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.rand(n, num_experts, device="cuda", generator=g).topk(k, dim=-1).indices
    return ids, torch.rand(n, k, device="cuda", generator=g) + 0.1


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("tokens", [1, 2, 16, 67, 700])
def test_fused_experts_bf16_matches_fp32_reference(tokens):
    """bf16 fused experts are within rel. L2 1e-2 of the fp32 reference, as close as the bf16 PyTorch path."""
    cfg, w_gu, w_d = _experts(32, torch.bfloat16, seed=tokens)
    ids, weights = _routing(tokens, cfg.num_experts_per_tok, 32, seed=tokens + 1)
    x = torch.randn(tokens, cfg.hidden_size, device="cuda").to(torch.bfloat16)
    ref = moe.experts_grouped(x.float(), ids, weights, w_gu.float(), w_d.float())
    got = fused_experts(x, ids, weights, w_gu, w_d)
    torch_bf16 = (moe.experts_gathered if tokens * cfg.num_experts_per_tok <= 64 else moe.experts_grouped)(
        x, ids, weights, w_gu, w_d)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert _rel(got, ref) < 1e-2
    assert _rel(got, ref) < 2 * _rel(torch_bf16, ref) + 1e-3


@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_fused_experts_fp32_exact(tokens):
    """fp32 fused experts (IEEE dots, no TF32) equal the fp32 gather path within rel. L2 1e-5."""
    cfg, w_gu, w_d = _experts(16, torch.float32, seed=7)
    ids, weights = _routing(tokens, cfg.num_experts_per_tok, 16, seed=8)
    x = torch.randn(tokens, cfg.hidden_size, device="cuda")
    ref = moe.experts_grouped(x.double(), ids, weights.double(), w_gu.double(), w_d.double())
    assert _rel(fused_experts(x, ids, weights, w_gu, w_d), ref) < 1e-5


@torch.no_grad()
def test_fused_experts_capture_in_cuda_graph():
    """The fused path is sync-free: it captures in a CUDA graph and the replay equals a direct call."""
    cfg, w_gu, w_d = _experts(16, torch.bfloat16, seed=11)
    ids, weights = _routing(4, cfg.num_experts_per_tok, 16, seed=12)
    x = torch.randn(4, cfg.hidden_size, device="cuda").to(torch.bfloat16)
    want = fused_experts(x, ids, weights, w_gu, w_d)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(x, ids, weights, w_gu, w_d)
    graph.replay()
    torch.testing.assert_close(out, want, atol=0, rtol=0)


@torch.no_grad()
def test_sparse_moe_block_with_kernel_switch():
    """SparseMoeBlock with the Triton experts selected matches the PyTorch experts (bf16, rel. L2 < 1e-2); the
    selection is the block's own: re-selecting the PyTorch experts gives the first result back exactly."""
    cfg = dataclasses.replace(preset_config("ming-flash-omni-2.0").thinker, num_experts=32, n_group=8, topk_group=4)
    torch_experts = Kernels(triton=True)  # every other Triton kernel on, the experts in PyTorch
    with torch.device("meta"):
        block = moe.SparseMoeBlock(cfg, kernels=torch_experts)
    init_dummy(block, seed=5, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 9, cfg.hidden_size, device="cuda").to(torch.bfloat16)  # 18 tokens: past the decode kernels
    want = block(x)
    assert not block.kernels.experts_apply(x)
    select_kernels(block, Kernels(triton=True, moe_experts=True))
    assert block.kernels.experts_apply(x)
    got = block(x)
    select_kernels(block, torch_experts)
    assert torch.equal(block(x), want)
    assert _rel(got, want) < 1e-2
    assert _rel(select_kernels(block, REFERENCE)(x), want) < 1e-2
