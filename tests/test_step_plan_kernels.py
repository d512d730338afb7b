"""model.kernels.step_plan and what it steers: the dense GEMV (`dense_gemv`) against F.linear's math, the plan's
choice between it and cuBLAS, the rotary's heads a program and the router's launch shapes (the same results as
the shipped shapes), and a whole thinker decode step with every knob on against the step with none.

CUDA when present (compiled), else Triton's CPU interpreter (conftest sets TRITON_INTERPRET=1). Small shapes.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from kernel_support import kernel_tol, rel_err, seeded_randn, DEVICE, NEEDS_TRITON, ON

from realtime_ming.model import moe
from realtime_ming.model.kernels import REFERENCE, dense_gemv, step_plan
from realtime_ming.model.kernels import moe_decode as md
from realtime_ming.model.kernels.rotary import RotaryStyle, head_rotary
from realtime_ming.model.kernels.step_plan import StepPlan
from realtime_ming.model.loader import init_dummy
from realtime_ming.model.presets import tiny_config
from realtime_ming.model.thinker import Thinker, ThinkerKVCache
from realtime_ming.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_talker_special_ids, tiny_thinker_special_ids

pytestmark = NEEDS_TRITON

HALF = [torch.bfloat16, torch.float16]
TILES = [{"n": 4, "k": 32, "warps": 1}, {"n": 8, "k": 64, "warps": 2, "stages": 3},
         {"n": 16, "k": 32, "warps": 4, "stages": 2, "dot": True}]


def _plan(monkeypatch, plan: StepPlan) -> None:
    monkeypatch.setattr(step_plan, "STEP_PLAN", plan)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("tile", TILES, ids=["regs", "regs-pipelined", "dot"])
def test_gemv_matches_the_linear_math(dtype, rows, tile):
    """Every row against an fp64 x @ W^T, as close as F.linear's own rounding (N, K not multiples of the tile;
    x rows strided)."""
    x = seeded_randn(rows, 2, 100, dtype=dtype)[:, 1]
    w = seeded_randn(37, 100, dtype=dtype, seed=1, scale=0.1)
    got = dense_gemv.gemv(x, w, tile)
    want = x.double() @ w.double().T
    assert got.dtype == dtype and got.shape == (rows, 37)
    assert rel_err(got, want) < kernel_tol(dtype) / 4
    assert rel_err(got, F.linear(x, w)) < kernel_tol(dtype) / 4


def test_linear_takes_the_gemv_only_where_the_plan_names_it(monkeypatch):
    """The tile of the first bound the rows fit, a shape's own entry before "*", None = cuBLAS; F.linear itself
    (bit for bit) for a bias, fp32, rows above the plan, the reference selection, or no plan."""
    calls = []
    real = dense_gemv.gemv
    monkeypatch.setattr(dense_gemv, "gemv", lambda x, w, t: calls.append(t) or real(x, w, t))
    tile = {"n": 4, "k": 32, "warps": 1}
    _plan(monkeypatch, StepPlan(gemv=((2, {"*": tile, "20x64": None}), (4, {"*": {**tile, "n": 8}}))))
    w = seeded_randn(24, 64, dtype=torch.bfloat16, seed=2)
    for rows, want_tile in ((1, tile), (2, tile), (3, {**tile, "n": 8}), (4, {**tile, "n": 8})):
        calls.clear()
        x = seeded_randn(rows, 64, dtype=torch.bfloat16, seed=rows)
        got = dense_gemv.linear(x, w, kernels=ON)
        assert calls == [want_tile] and rel_err(got, F.linear(x, w)) < kernel_tol(torch.bfloat16) / 4
    x = seeded_randn(1, 64, dtype=torch.bfloat16, seed=9)
    cases = [(x, w[:20], None, ON), (seeded_randn(5, 64, dtype=torch.bfloat16), w, None, ON),
             (x, w, seeded_randn(24, dtype=torch.bfloat16), ON), (x.float(), w.float(), None, ON),
             (x, w, None, REFERENCE)]
    for xi, wi, bias, kernels in cases:
        calls.clear()
        assert torch.equal(dense_gemv.linear(xi, wi, bias, kernels=kernels), F.linear(xi, wi, bias)) and not calls
    _plan(monkeypatch, StepPlan())
    assert torch.equal(dense_gemv.linear(x, w, kernels=ON), F.linear(x, w)) and not calls


def test_step_plan_round_trips_and_refuses_nonsense():
    plan = StepPlan(gemv=((1, {"*": {"n": 4, "k": 512, "warps": 2, "stages": 3}, "9x9": None}),
                          (8, {"*": {"n": 16, "k": 256, "warps": 4, "dot": True}})),
                    rotary_heads=4, router_splits=32, router_block_e=16, select_warps=1)
    assert step_plan.from_json(json.loads(json.dumps(step_plan.to_json(plan)))) == plan
    with_pdl = StepPlan(pdl=True)
    assert step_plan.from_json(json.loads(json.dumps(step_plan.to_json(with_pdl)))) == with_pdl
    assert step_plan.from_json({}).pdl is False and step_plan.STEP_PLAN.pdl is True  # shipped on after its GPU tests
    assert plan.gemv_tile(1, 9, 9) is None and plan.gemv_tile(1, 5, 5)["n"] == 4 and plan.gemv_tile(9, 5, 5) is None
    for bad in (dict(gemv=((4, {}), (2, {}))), dict(gemv=((1, {"*": {"n": 4}}),)),
                dict(gemv=((1, {"*": {"n": 4, "k": 8, "warps": 1, "blocks": 2}}),)), dict(rotary_heads=3),
                dict(select_warps=0), dict(router_block_e=24), dict(pdl=1), dict(pdl="yes")):
        with pytest.raises(ValueError):
            StepPlan(**bad)
    with pytest.raises(ValueError, match="unknown"):
        step_plan.from_json({"gemv": [], "rotary_head": 2})


@pytest.mark.parametrize("heads_a_program", [1, 2, 4])
def test_rotary_split_over_heads_gives_the_same_bits(monkeypatch, heads_a_program):
    """A decode step's rotary with its heads over several programs: q and the cache writes equal the one-program
    launch's bit for bit (thinker shape: q/k norm, partial rotary, 6 query + 2 KV heads)."""
    b, h, kv, hd, rd = 3, 6, 2, 128, 64
    dtype = torch.bfloat16
    qkv = seeded_randn(b, 1, (h + 2 * kv) * hd, dtype=dtype)
    qn, kn = 1 + 0.1 * seeded_randn(hd, dtype=dtype, seed=3), 1 + 0.1 * seeded_randn(hd, dtype=dtype, seed=4)
    ang = seeded_randn(b, 1, rd, seed=5)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    rows, index = torch.tensor([2, 0, 3], device=DEVICE), torch.tensor([[4], [0], [7]], device=DEVICE)
    out = []
    for plan in (StepPlan(), StepPlan(rotary_heads=heads_a_program)):
        _plan(monkeypatch, plan)
        ck, cv = (torch.zeros(4, kv, 8, hd, device=DEVICE, dtype=dtype) for _ in range(2))
        q, _, _ = head_rotary(qkv, h, kv, hd, cos, sin, RotaryStyle.NEOX_ROUND_EACH, q_norm=qn, k_norm=kn, eps=1e-6,
                              k_out=ck, v_out=cv, rows=rows, index=index, kernels=ON)
        out.append((q, ck, cv))
    for a, b_ in zip(*out):
        assert torch.equal(a, b_)
    assert out[1][1][3, :, 7].abs().sum() > 0


@pytest.mark.parametrize("splits,block_e,warps", [(8, 16, 1), (32, 64, 2)])
def test_router_launch_shapes_select_the_same_experts(monkeypatch, splits, block_e, warps):
    """Other split-K / experts a program / selection warps: the experts and weights of `moe.select_experts`."""
    n, d, experts, groups, topk_group, top_k = 3, 256, 16, 4, 2, 4
    x = seeded_randn(n, d, dtype=torch.bfloat16)
    w = seeded_randn(experts, d, dtype=torch.bfloat16, seed=1, scale=d ** -0.5)
    bias = seeded_randn(experts, seed=2, scale=0.05).to(torch.bfloat16)
    _plan(monkeypatch, StepPlan(router_splits=splits, router_block_e=block_e, select_warps=warps))
    ids, wts = md.route(x, w, bias, top_k, groups, topk_group, 2.5, kernels=ON)
    ref_ids, ref_w = moe.select_experts(F.linear(x.float(), w.float()), bias, top_k, groups, topk_group, 2.5)
    go, ro = ids.sort(dim=-1), ref_ids.sort(dim=-1)
    assert torch.equal(go.values, ro.values)
    torch.testing.assert_close(wts.gather(-1, go.indices), ref_w.gather(-1, ro.indices), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("expert_dtype", ["model", "fp8"])
def test_thinker_decode_step_with_every_knob_on(monkeypatch, expert_dtype):
    """A tiny bf16 thinker's decode step (3 rows, each its own slot and length) with every projection through the
    GEMV, the rotary split over heads and the router's other shapes: the same hidden states as with the shipped
    launch shapes within bf16 rounding, the same cache writes, and the LM head's GEMV the same greedy tokens."""
    cfg = tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE).thinker
    with torch.device("meta"):
        thinker = Thinker(cfg, kernels=ON, expert_dtype=expert_dtype)
    init_dummy(thinker, seed=3, device=DEVICE, dtype=torch.bfloat16)
    thinker.eval()
    slots, pos = torch.tensor([1, 0, 2], device=DEVICE), torch.tensor([[5], [0], [11]], device=DEVICE)
    ids = torch.tensor([[3], [40], [7]], device=DEVICE)
    on = StepPlan(gemv=((8, {"*": {"n": 8, "k": 64, "warps": 2, "stages": 2}}),), rotary_heads=2, router_splits=4,
                  router_block_e=8, select_warps=1)
    out, calls = [], []
    real = dense_gemv.gemv
    monkeypatch.setattr(dense_gemv, "gemv", lambda x, w, t: calls.append(tuple(w.shape)) or real(x, w, t))
    for plan in (StepPlan(), on):
        _plan(monkeypatch, plan)
        cache = ThinkerKVCache.allocate(cfg, 3, 16, device=DEVICE, dtype=torch.bfloat16)
        with torch.no_grad():
            h = thinker(thinker.embed(ids), pos.unsqueeze(0).expand(3, 3, 1), cache=cache, slots=slots,
                        cache_positions=pos)
            out.append((h, thinker.logits(h[:, -1]), cache))
    (h0, l0, c0), (h1, l1, c1) = out
    # every layer's QKV and O, the dense layers' gate|up and down, the LM head: all through the GEMV
    assert (cfg.vocab_size, cfg.hidden_size) in calls
    assert len(calls) == 2 * cfg.num_hidden_layers + 2 * cfg.first_k_dense_replace + 1
    assert rel_err(h1, h0) < kernel_tol(torch.bfloat16) and rel_err(c1.k, c0.k) < kernel_tol(torch.bfloat16)
    assert rel_err(l1, l0) < kernel_tol(torch.bfloat16)
    assert torch.equal(l1.argmax(-1), l0.argmax(-1))
