"""model.kernels.moe_fp8: the FP8-expert decode and prefill kernels against moe.py's reference over the
dequantised experts, the one-launch activation quantisation against PyTorch's, the decode plan (which path a
decode batch of n rows takes), and the SparseMoeBlock with fp8 experts on the kernels against its reference path.

CUDA when present (compiled), else Triton's CPU interpreter (conftest sets TRITON_INTERPRET=1). Shapes are
small: the interpreter runs each program in Python.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_support import kernel_tol, rel_err, seeded_randn, DEVICE, NEEDS_TRITON, ON

from realtime_ming.model import fp8, moe
from realtime_ming.model.kernels import REFERENCE, moe_fp8
from realtime_ming.model.loader import init_dummy
from realtime_ming.model.presets import tiny_config
from realtime_ming.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_talker_special_ids, tiny_thinker_special_ids

pytestmark = NEEDS_TRITON

E, D, INTER, K = 8, 64, 32, 2


_tol, _randn, _rel = kernel_tol, seeded_randn, rel_err


def _experts(dtype, tokens: int, seed: int = 0):
    """x, ids, weights and fp8 experts (q, scale) of a small layer."""
    x = _randn(tokens, D, dtype=dtype, seed=seed)
    q_gu, s_gu = fp8.quantize(_randn(E, 2 * INTER, D, seed=seed + 1, scale=D ** -0.5))
    q_d, s_d = fp8.quantize(_randn(E, D, INTER, seed=seed + 2, scale=INTER ** -0.5))
    gen = torch.Generator().manual_seed(seed + 3)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(tokens)]).to(DEVICE)
    weights = _randn(tokens, K, seed=seed + 4).abs() + 0.1
    return x, ids, weights, q_gu, s_gu, q_d, s_d


def _routed_reference(x, ids, weights, q_gu, s_gu, q_d, s_d):
    return moe.experts_gathered(x, ids, weights, fp8.Fp8Stack(q_gu, s_gu, x.dtype), fp8.Fp8Stack(q_d, s_d, x.dtype))


@pytest.mark.parametrize("dtype,tokens", [(torch.float32, 1), pytest.param(torch.float32, 5, marks=pytest.mark.slow),
                                          pytest.param(torch.bfloat16, 3, marks=pytest.mark.slow)])
def test_fp8_moe_decode_matches_reference(dtype, tokens):
    """Routed fp8 experts (scaled per output row) + the model-dtype shared expert, rounded where SparseMoeBlock
    rounds, against the reference over the dequantised experts."""
    x, ids, weights, q_gu, s_gu, q_d, s_d = _experts(dtype, tokens)
    sg, su = _randn(INTER, D, dtype=dtype, seed=7, scale=D ** -0.5), _randn(INTER, D, dtype=dtype, seed=8, scale=D ** -0.5)
    sd = _randn(D, INTER, dtype=dtype, seed=9, scale=INTER ** -0.5)
    got = moe_fp8.moe_decode(x, ids, weights, q_gu, q_d, sg, su, sd, s_gu, s_d, kernels=ON)
    shared = F.linear(F.silu(F.linear(x, sg)) * F.linear(x, su), sd)
    want = _routed_reference(x, ids, weights, q_gu, s_gu, q_d, s_d).to(dtype) + shared
    assert got.dtype == dtype and got.shape == (tokens, D)
    assert _rel(got, want) < _tol(dtype)


def test_fp8_moe_decode_pipelined_loads_change_nothing():
    """The GEMVs with their loads software-pipelined (gu_/dn_stages, tl.range num_stages) give the unpipelined
    result: the same products (bit for bit in the interpreter; the compiled loop may sum in another order)."""
    x, ids, weights, q_gu, s_gu, q_d, s_d = _experts(torch.float32, 2, seed=50)
    sg, su, sd = _randn(INTER, D, seed=51), _randn(INTER, D, seed=52), _randn(D, INTER, seed=53)
    args = (x, ids, weights, q_gu, q_d, sg, su, sd, s_gu, s_d)
    want = moe_fp8.moe_decode(*args, kernels=ON, tune={"gu_n": 8, "gu_k": 32, "dn_d": 16, "dn_k": 16})
    got = moe_fp8.moe_decode(*args, kernels=ON, tune={"gu_n": 8, "gu_k": 32, "dn_d": 16, "dn_k": 16, "gu_stages": 3,
                                                      "dn_stages": 2})
    assert torch.equal(got, want) if DEVICE == "cpu" else _rel(got, want) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_moe_decode_down_with_the_experts_in_one_tile(dtype):
    """dn_all (the down GEMV reads a token's experts in one tile): the one-expert-at-a-time kernel's output up to the
    order of the fp32 sum over experts, with 3 experts a token (padded to 4 in the tile) and a padding token (0)."""
    x, _, _, q_gu, s_gu, q_d, s_d = _experts(dtype, 3, seed=60)
    sg, su = _randn(INTER, D, dtype=dtype, seed=61), _randn(INTER, D, dtype=dtype, seed=62)
    sd = _randn(D, INTER, dtype=dtype, seed=63)
    ids = torch.tensor([[0, 5, 7], [1, 2, 3], [6, 4, 0]], device=DEVICE)
    weights = _randn(3, 3, seed=64).abs() + 0.1
    live = torch.tensor([True, False, True], device=DEVICE)
    tiles = {"gu_n": 8, "gu_k": 32, "dn_d": 8, "dn_k": 16, "dn_stages": 2}
    args = (x, ids, weights, q_gu, q_d, sg, su, sd, s_gu, s_d)
    want = moe_fp8.moe_decode(*args, kernels=ON, tune=tiles, live=live)
    got = moe_fp8.moe_decode(*args, kernels=ON, tune={**tiles, "dn_all": 1}, live=live)
    assert torch.equal(got[1], torch.zeros_like(got[1])) and got[0].abs().sum() > 0
    if dtype == torch.float32:
        assert _rel(got, want) < 1e-6
    else:  # a one-ulp difference in the fp32 sum may flip the bf16 rounding of an element
        assert _rel(got, want) < 1e-2 and (got != want).float().mean() < 0.05


def test_fp8_moe_decode_skips_padding_tokens():
    """`live` False: the padding token reads nothing (its NaN input and its own experts' NaN weights stay out) and
    gets 0; the live tokens' outputs are the unmasked call's, bit for bit."""
    x, ids, weights, q_gu, s_gu, q_d, s_d = _experts(torch.float32, 3)
    sg, su, sd = _randn(INTER, D, seed=7), _randn(INTER, D, seed=8), _randn(D, INTER, seed=9)
    ids = torch.tensor([[0, 1], [6, 7], [2, 3]], device=DEVICE)  # 6, 7: the padding token's own
    live = torch.tensor([True, False, True], device=DEVICE)
    want = moe_fp8.moe_decode(x, ids, weights, q_gu, q_d, sg, su, sd, s_gu, s_d, kernels=ON)
    x[1] = float("nan")
    s_gu[6:], s_d[6:] = float("nan"), float("nan")
    got = moe_fp8.moe_decode(x, ids, weights, q_gu, q_d, sg, su, sd, s_gu, s_d, kernels=ON, live=live)
    assert torch.equal(got[live], want[live]) and torch.equal(got[1], torch.zeros_like(got[1]))


def _a8_reference(x, ids, weights, q_gu, s_gu, q_d, s_d):
    """The a8 path's math in PyTorch: x and the SwiGLU output quantised per row to e4m3, rounded to x's dtype where
    the kernels round."""
    ty = x.dtype
    xq, xs = moe_fp8.quantize_rows(x)
    xd = xq.float() * xs[:, None]
    w_gu, w_d = fp8.dequantize(q_gu, s_gu), fp8.dequantize(q_d, s_d)
    h = torch.einsum("nd,nkod->nko", xd, w_gu[ids])  # [N, k, 2I]
    g, u = h.to(ty).float().chunk(2, -1)
    act = ((g * torch.sigmoid(g)).to(ty).float() * u).to(ty)
    aq, as_ = moe_fp8.quantize_rows(act)
    y = torch.einsum("nki,nkoi->nko", aq.float() * as_[..., None], w_d[ids])
    return (y.to(ty).float() * weights[..., None]).sum(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_fused_experts_a8_matches_its_math_and_the_reference(dtype):
    """The FP8 tensor-core path: equal to its own math (activations quantised per row) within the kernels'
    rounding (measured 0.0036 in fp32), and within the measured activation-quantisation error of the weight-only
    reference (0.037 fp32 / 0.052 bf16 measured here: e4m3 rounding of x and of the SwiGLU output)."""
    x, ids, weights, q_gu, s_gu, q_d, s_d = _experts(dtype, 6, seed=20)
    got = moe_fp8.fused_experts(x, ids, weights, q_gu, q_d, s_gu, s_d, a8=True, block_n=32, block_k=32)
    assert got.dtype == torch.float32 and got.shape == (6, D)
    # an activation the kernel computes an ulp off the reference's may round to the next e4m3 code (6 % of it)
    bound = 1e-2 + (_tol(dtype) if dtype != torch.float32 else 0.0)
    assert _rel(got, _a8_reference(x, ids, weights, q_gu, s_gu, q_d, s_d)) < bound
    assert _rel(got, _routed_reference(x, ids, weights, q_gu, s_gu, q_d, s_d)) < 0.08


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_fused_experts_weight_only_matches_reference(dtype):
    """a8=False: the fp8 tiles widened to the activations' dtype; equal to the reference over the dequantised
    experts (fp32 exactly)."""
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("Triton's CPU interpreter computes bf16 tl.dot wrongly (moe_experts.fused_experts too); "
                    "checked compiled on the GPU")
    x, ids, weights, q_gu, s_gu, q_d, s_d = _experts(dtype, 6, seed=30)
    got = moe_fp8.fused_experts(x, ids, weights, q_gu, q_d, s_gu, s_d, a8=False, block_n=32, block_k=32)
    assert _rel(got, _routed_reference(x, ids, weights, q_gu, s_gu, q_d, s_d)) < _tol(dtype)


def _spread(rows: int, k: int, dtype, seed: int) -> torch.Tensor:
    """Rows whose values span 12 binades, with e4m3 ties and an all-zero row: the rounding cases."""
    x = _randn(rows, k, seed=seed) * torch.logspace(-6, 6, k, device=DEVICE)
    x[0] = 0
    x[1, :4] = torch.tensor([448.0, 13.0, 6.5, -0.1015625], device=DEVICE)  # 13 = 12|14 tie, 6.5 = 6|7 tie
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 64), (5, 1000), (2, 4096)])
def test_fused_quantize_rows_equals_pytorch_bit_for_bit(dtype, shape):
    """`quantize_rows_fused` (one launch) gives PyTorch's `quantize_rows` codes and scales exactly: round to nearest
    even on the e4m3 grid, subnormals, ties, a zero row, the largest value."""
    x = _spread(*shape, dtype, seed=40)
    q, scale = moe_fp8.quantize_rows_fused(x)
    want_q, want_scale = moe_fp8.quantize_rows(x)
    assert q.dtype == fp8.FP8 and q.shape == x.shape and scale.shape == shape[:1]
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale, want_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_quantize_rows_keeps_the_sign_of_zero(dtype):
    """-0.0 and negatives too small for e4m3's smallest subnormal (2^-9 of the scale) give the -0 code 0x80 as
    PyTorch does, +0.0 and tiny positives 0x00; the smallest subnormals and their halfway ties beside them."""
    row = [448.0, -0.0, 0.0, -1e-6, 1e-6, -2.0 ** -11, 2.0 ** -11, -2.0 ** -10, 2.0 ** -10, -3 * 2.0 ** -10,
           -2.0 ** -9, 2.0 ** -9, -2.0 ** -140, 2.0 ** -140]
    x = torch.tensor([row, [-v for v in row], [-0.0] * len(row)], device=DEVICE).to(dtype)
    q, scale = moe_fp8.quantize_rows_fused(x)
    want_q, want_scale = moe_fp8.quantize_rows(x)
    codes = q.view(torch.uint8)
    assert codes[0, 1] == codes[0, 3] == codes[0, 5] == codes[0, 7] == 0x80 and codes[0, 2] == codes[0, 4] == 0
    assert (codes[2] == 0x80).all()
    assert torch.equal(codes, want_q.view(torch.uint8)) and torch.equal(scale, want_scale)


def test_fused_quantize_rows_takes_pytorchs_path_outside_its_shapes():
    """Three dims, rows beyond one program, a strided last dim: PyTorch's quantisation (the same result)."""
    for x in (_randn(2, 3, 16, seed=41), _randn(2, 9000, seed=42), _randn(8, 32, seed=43)[:, ::2]):
        q, scale = moe_fp8.quantize_rows_fused(x)
        want_q, want_scale = moe_fp8.quantize_rows(x)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scale, want_scale)


def test_fp8_fused_experts_same_with_either_quantisation():
    """The a8 path with the one-launch quantisation equals it with PyTorch's, bit for bit. Bit-equality is the
    right bar: the path is deterministic run to run (no atomics, no split-K: the pairs' order is a stable sort,
    every output element is one program's fixed-order K loop, the top-k sum is PyTorch's), so a difference can
    only come from the quantiser, whose codes and scales are compared first. (The first GPU run failed here: a
    scale an ulp off, PyTorch's CUDA `amax / 448.0` being a multiply by the rounded reciprocal: `amax_scale`.)"""
    x, ids, weights, q_gu, s_gu, q_d, s_d = _experts(torch.float32, 6, seed=21)
    xq, xs = moe_fp8.quantize_rows_fused(x)
    want_xq, want_xs = moe_fp8.quantize_rows(x)
    assert torch.equal(xq.view(torch.uint8), want_xq.view(torch.uint8)) and torch.equal(xs, want_xs)
    run = [moe_fp8.fused_experts(x, ids, weights, q_gu, q_d, s_gu, s_d, block_n=32, block_k=32, fused_quantize=f)
           for f in (True, True, False)]
    assert torch.equal(run[0], run[1]), "the a8 path differs run to run"
    assert torch.equal(run[0], run[2])


def test_decode_plan_routes_by_row_count():
    """The shipped plan: the GEMVs up to 8 rows (tuned: 40.5 vs 115 us a layer at 1 row, 225 vs 257 at 8), the
    tensor-core path at 16 (357 vs 580); above the decode kernels' batch always grouped; the GEMV tiles and
    grouped overrides by row count."""
    plan = moe_fp8.DECODE_PLAN
    assert moe_fp8.decode_plan() is plan
    assert [plan.path(n) for n in (1, 2, 4, 8, 9, 16)] == ["gemv"] * 4 + ["grouped"] * 2
    assert plan.path(17) == plan.path(64) == plan.path(2048) == "grouped"
    assert all(plan.path(n) in ("gemv", "grouped") for n in range(1, 17))
    custom = moe_fp8.DecodePlan(paths=((2, "gemv"), (6, "grouped"), (16, "gemv")),
                                gemv_tiles=((1, {"gu_n": 8}), (16, {"gu_n": 2})), grouped={"block_n": 16})
    assert [custom.path(n) for n in (1, 2, 3, 6, 7, 16, 17)] == ["gemv", "gemv", "grouped", "grouped", "gemv",
                                                                 "gemv", "grouped"]
    assert custom.tiles(1) == {"gu_n": 8} and custom.tiles(2) == custom.tiles(40) == {"gu_n": 2}
    assert custom.grouped_tiles(16) == {"block_n": 16} and custom.grouped_tiles(17) == {}
    tiles = plan.tiles(1)
    tiles["gu_n"] = -1  # a copy: the caller cannot change the plan
    assert plan.tiles(1)["gu_n"] != -1


def test_fp8_block_takes_the_path_the_plan_names(monkeypatch):
    """A decode batch goes to the FP8 GEMVs only where the plan says so (else to the grouped experts + the shared
    expert, the reference path on CPU), and gives the reference block's output either way."""
    cfg = tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE).thinker
    with torch.device("meta"):
        block = moe.SparseMoeBlock(cfg, expert_dtype="fp8")
    init_dummy(block, seed=5, device=DEVICE)
    calls = []
    real = moe_fp8.moe_decode
    monkeypatch.setattr(moe_fp8, "moe_decode", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
    for paths, rows, gemv in [(((1, "gemv"), (16, "grouped")), 1, True), (((1, "gemv"), (16, "grouped")), 2, False),
                              (((16, "grouped"),), 1, False)]:
        monkeypatch.setattr(moe_fp8, "DECODE_PLAN", moe_fp8.DecodePlan(paths=paths))
        x = _randn(rows, 1, cfg.hidden_size, seed=12 + rows)
        calls.clear()
        block.kernels = ON
        with torch.no_grad():
            got = block(x)
            block.kernels = REFERENCE
            want = block(x)
        assert calls == ([rows] if gemv else [])
        assert _rel(got, want) < 1e-5


@pytest.mark.slow  # the full tier: a whole FP8 block in the interpreter (~12 s CPU)
def test_fp8_block_decodes_like_its_reference_path():
    """A tiny MoE layer with fp8 experts: a decode batch through the kernels (router + fp8 experts) equals the
    same block's PyTorch path (dequantised experts), and the fp8 block stays within the weight error of the
    model-dtype block it was quantised from."""
    cfg = tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE).thinker
    blocks = {}
    for experts in ("model", "fp8"):
        with torch.device("meta"):
            blocks[experts] = moe.SparseMoeBlock(cfg, expert_dtype=experts)
        init_dummy(blocks[experts], seed=4, device=DEVICE)
    x = _randn(3, 1, cfg.hidden_size, seed=11)
    with torch.no_grad():
        want = blocks["fp8"](x)
        base = blocks["model"](x)
        blocks["fp8"].kernels = ON
        got = blocks["fp8"](x)
    assert _rel(got, want) < 1e-5
    assert 1e-4 < _rel(want, base) < 0.05
