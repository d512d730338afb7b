"""model.kernels.slot_attention (decode and prefill attention) and model.kernels.moe_decode (router and MoE
decode experts): each kernel equals the reference math.

CUDA when present, else Triton's CPU interpreter (conftest sets TRITON_INTERPRET=1).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_support import kernel_tol, rel_err, seeded_randn, DEVICE, DTYPES, NEEDS_TRITON, ON

from realtime_ming.model import moe
from realtime_ming.model.kernels import moe_decode as md
from realtime_ming.model.kernels import slot_attention as sa

pytestmark = NEEDS_TRITON


_tol, _randn, _rel = kernel_tol, seeded_randn, rel_err


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv,hd", [(4, 2, 128), (16, 2, 128), (8, 8, 64)])
def test_decode_attention_matches_sdpa(dtype, heads, kv, hd):
    """Every row reads its own slot up to its own length (1 included), in place."""
    b, slots, cap = 3, 5, 300
    q = _randn(b, heads, 1, hd, dtype=dtype)
    kc = _randn(slots, kv, cap, hd, dtype=dtype, seed=1)
    vc = _randn(slots, kv, cap, hd, dtype=dtype, seed=2)
    slot = torch.tensor([4, 0, 2], device=DEVICE)
    lengths = torch.tensor([1, 257, 40], device=DEVICE)
    got = sa.decode_attention(q, kc, vc, slot, lengths, kernels=ON)
    want = sa.decode_attention_reference(q.float(), kc.float(), vc.float(), slot, lengths)
    assert got.shape == (b, heads, 1, hd) and got.dtype == dtype
    assert _rel(got, want) < _tol(dtype)
    # length 1: the output is exactly that slot's first value row (softmax over one key)
    torch.testing.assert_close(got[0, :, 0].float(), vc[4, :, 0].float().repeat_interleave(heads // kv, 0),
                               atol=1e-2 if dtype != torch.float32 else 1e-6, rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv,hd,t", [(4, 2, 128, 70), (8, 2, 64, 20)])
def test_prefill_attention_matches_sdpa(dtype, heads, kv, hd, t):
    """A multi-row prompt chunk: a fresh prompt, one continuing a history at index 150, and a padding
    row (every position 0); each query sees its slot's indices 0..position, read in place."""
    slots, cap = 4, 260
    q = _randn(3, heads, t, hd, dtype=dtype)
    kc = _randn(slots, kv, cap, hd, dtype=dtype, seed=1)
    vc = _randn(slots, kv, cap, hd, dtype=dtype, seed=2)
    slot = torch.tensor([2, 0, 3], device=DEVICE)
    pos = torch.stack([torch.arange(t), 150 + torch.arange(t), torch.zeros(t, dtype=torch.long)]).to(DEVICE)
    got = sa.prefill_attention(q, kc, vc, slot, pos + 1, kernels=ON)
    assert got.shape == (3, heads, t, hd) and got.dtype == dtype
    # outside truth: each query's softmax over exactly its visible keys, one at a time, in float64
    g = heads // kv
    for b, i, h in [(0, 0, 0), (0, t - 1, heads - 1), (1, 0, 1), (1, t // 2, g), (2, t - 1, heads - 1)]:
        n = int(pos[b, i]) + 1
        k = kc[slot[b], h // g, :n].double()
        w = torch.softmax(k @ q[b, h, i].double() / hd ** 0.5, dim=0)
        want = w @ vc[slot[b], h // g, :n].double()
        assert _rel(got[b, h, i], want) < _tol(dtype)
    ref = sa.prefill_attention_reference(q.float(), kc.float(), vc.float(), slot, pos + 1)
    assert _rel(got, ref) < _tol(dtype)


def _assert_same_selection(ids, weights, ref_ids, ref_weights):
    """Same experts per token (in any order) with the same weights."""
    go, ro = ids.sort(dim=-1), ref_ids.sort(dim=-1)
    assert torch.equal(go.values, ro.values)
    torch.testing.assert_close(weights.gather(-1, go.indices), ref_weights.gather(-1, ro.indices), atol=1e-5,
                               rtol=1e-5)


# the 256-expert case runs ~8 s CPU in the interpreter: the full tier
@pytest.mark.parametrize("experts,groups,topk_group,top_k",
                         [pytest.param(256, 8, 4, 8, marks=pytest.mark.slow), (16, 4, 2, 4)])
def test_route_matches_select_experts(experts, groups, topk_group, top_k):
    """fp32 logits from bf16 weights + group-limited top-k: same experts, same weights."""
    n, d = 5, 256
    x = _randn(n, d, dtype=torch.bfloat16)
    w = _randn(experts, d, dtype=torch.bfloat16, seed=1, scale=d ** -0.5)
    bias = _randn(experts, seed=2, scale=0.05).to(torch.bfloat16)
    got_ids, got_w = md.route(x, w, bias, top_k, groups, topk_group, 2.5, kernels=ON)
    ref_ids, ref_w = moe.select_experts(F.linear(x.float(), w.float()), bias, top_k, groups, topk_group, 2.5)
    _assert_same_selection(got_ids, got_w, ref_ids, ref_w)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 17, 70])
@pytest.mark.parametrize("per_token_bias", [False, True])
@pytest.mark.parametrize("experts,groups,topk_group,top_k", [(256, 8, 4, 8), (16, 4, 2, 4)])
def test_select_matches_select_experts_at_any_token_count(n, per_token_bias, experts, groups, topk_group, top_k):
    """The selection alone, for a prefill chunk or a decode batch above MAX_DECODE_TOKENS: same experts, same
    weights, with one bias or each token's own (the multi-router's)."""
    logits = _randn(n, experts, seed=3)
    bias = _randn(*((n, experts) if per_token_bias else (experts,)), seed=4, scale=0.05).to(torch.bfloat16)
    got_ids, got_w = md.select(logits, bias, top_k, groups, topk_group, 2.5, kernels=ON)
    ref_ids, ref_w = moe.select_experts(logits, bias, top_k, groups, topk_group, 2.5)
    _assert_same_selection(got_ids, got_w, ref_ids, ref_w)


def test_select_declines_what_it_cannot_do():
    """Groups the kernel cannot lay out, a bias of another shape, more picks than the kept groups hold."""
    assert md.select(_randn(3, 12), _randn(12), 2, 4, 2, 1.0, kernels=ON) is None  # 3 experts a group
    assert md.select(_randn(3, 16), _randn(2, 16), 2, 4, 2, 1.0, kernels=ON) is None
    assert md.select(_randn(3, 16), _randn(16), 9, 4, 2, 1.0, kernels=ON) is None
    assert md.select(_randn(0, 16), _randn(16), 2, 4, 2, 1.0, kernels=ON) is None


@pytest.mark.parametrize("masks", [False, True])
def test_sparse_moe_block_routes_a_chunk_through_the_selection_kernel(masks, monkeypatch):
    """A block's routing of 40 tokens (past the decode kernels: a prefill chunk) with the kernels on equals the
    reference block's, with the text router alone and with the modality routers (image / audio masks)."""
    import dataclasses

    from realtime_ming.model.kernels import REFERENCE, select_kernels
    from realtime_ming.model.loader import init_dummy
    from realtime_ming.model.presets import preset_config

    cfg = dataclasses.replace(preset_config("ming-flash-omni-2.0").thinker, hidden_size=64, head_dim=128,
                              moe_intermediate_size=32, num_experts=32, n_group=8, topk_group=4)
    with torch.device("meta"):
        block = moe.SparseMoeBlock(cfg, kernels=ON)
    init_dummy(block, seed=5, device=DEVICE, dtype=torch.float32)
    x = _randn(1, 40, cfg.hidden_size, seed=6)
    kw = {}
    if masks:
        assert cfg.is_multi_router
        kw = {"image_mask": torch.arange(40, device=DEVICE)[None] % 3 == 1,
              "audio_mask": torch.arange(40, device=DEVICE)[None] % 5 == 2}
    got_routes, want_routes = [], []
    reference = moe.select_experts
    with monkeypatch.context() as m:  # the kernels' run never falls back to the reference selection
        m.setattr(moe, "select_experts", lambda *a: pytest.fail("the reference selection ran"))
        got = block(x, routing=got_routes, layer=0, **kw)
    assert moe.select_experts is reference
    want = select_kernels(block, REFERENCE)(x, routing=want_routes, layer=0, **kw)
    (g,), (w,) = got_routes, want_routes
    _assert_same_selection(g.expert_ids, g.weights, w.expert_ids, w.weights)
    assert _rel(got, want) < 1e-4


def test_route_declines_what_it_cannot_do():
    """Too many tokens (prefill) or a non-power-of-two group: the caller's reference runs instead."""
    w, bias = _randn(16, 64), _randn(16)
    assert md.route(_randn(md.MAX_DECODE_TOKENS + 1, 64), w, bias, 2, 4, 2, 1.0, kernels=ON) is None
    assert md.route(_randn(2, 64), _randn(12, 64), _randn(12), 2, 4, 2, 1.0, kernels=ON) is None


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 3, 8])  # each tile set of moe_tiles
def test_moe_decode_matches_reference(dtype, tokens):
    """Routed experts (fp32 weighted sum) + shared expert, rounded where SparseMoeBlock rounds."""
    e, d, inter, k = 12, 128, 96, 4
    x = _randn(tokens, d, dtype=dtype)
    w_gu = _randn(e, 2 * inter, d, dtype=dtype, seed=1, scale=d ** -0.5)
    w_d = _randn(e, d, inter, dtype=dtype, seed=2, scale=inter ** -0.5)
    sg, su = _randn(inter, d, dtype=dtype, seed=3, scale=d ** -0.5), _randn(inter, d, dtype=dtype, seed=4, scale=d ** -0.5)
    sd = _randn(d, inter, dtype=dtype, seed=5, scale=inter ** -0.5)
    ids = torch.stack([torch.randperm(e, generator=torch.Generator().manual_seed(10 + i))[:k] for i in range(tokens)])
    ids = ids.to(DEVICE)
    weights = _randn(tokens, k, seed=6).abs() + 0.1
    got = md.moe_decode(x, ids, weights, w_gu, w_d, sg, su, sd, kernels=ON)
    routed = moe.experts_gathered(x, ids, weights, w_gu, w_d)
    shared = F.linear(F.silu(F.linear(x, sg)) * F.linear(x, su), sd)
    want = routed.to(dtype) + shared
    assert got.dtype == dtype and got.shape == (tokens, d)
    assert _rel(got, want) < _tol(dtype)


# ~30 s (fp32) and ~35 s (bf16) of CPU in the interpreter: the full tier (test_moe_decode_matches_reference and
# test_fp8_kernels' padding test keep the kernel in the fast tier)
@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_decode_skips_padding_tokens(dtype):
    """`live` False (a graph bucket's padding row): the token reads nothing -- a NaN input row and NaN weights of
    the experts only it chose stay out of every output -- and gets exactly 0; the live tokens' outputs are the
    unmasked call's, bit for bit."""
    e, d, inter, k, tokens = 12, 128, 96, 2, 5
    live = torch.tensor([True, False, True, True, False], device=DEVICE)
    x = _randn(tokens, d, dtype=dtype)
    w_gu = _randn(e, 2 * inter, d, dtype=dtype, seed=1, scale=d ** -0.5)
    w_d = _randn(e, d, inter, dtype=dtype, seed=2, scale=inter ** -0.5)
    sg, su = _randn(inter, d, dtype=dtype, seed=3, scale=d ** -0.5), _randn(inter, d, dtype=dtype, seed=4, scale=d ** -0.5)
    sd = _randn(d, inter, dtype=dtype, seed=5, scale=inter ** -0.5)
    ids = torch.tensor([[0, 1], [10, 11], [2, 3], [1, 4], [11, 10]], device=DEVICE)  # 10, 11: padding's own
    weights = _randn(tokens, k, seed=6).abs() + 0.1
    want = md.moe_decode(x, ids, weights, w_gu, w_d, sg, su, sd, kernels=ON)
    x[~live] = float("nan")
    w_gu[10:], w_d[10:] = float("nan"), float("nan")
    got = md.moe_decode(x, ids, weights, w_gu, w_d, sg, su, sd, kernels=ON, live=live)
    assert torch.equal(got[live], want[live])
    assert torch.equal(got[~live], torch.zeros_like(got[~live]))
