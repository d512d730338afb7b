"""Thinker (BailingMoeV2) against the `thinker_text` golden case, plus KV-cache, MoE-path and bf16 checks."""

from __future__ import annotations

import pytest
import torch

from realtime_ming.model.loader import LoadError, load_weights, read_weight_map
from realtime_ming.model.moe import experts_gathered, experts_grouped, select_experts
from realtime_ming.model.multimodal import MediaTokenIds, get_t_scale_rope_index
from realtime_ming.model.rope3d import text_position_ids
from realtime_ming.model.thinker import Thinker, ThinkerKVCache, load_thinker
from thinker_decode_support import _text_greedy, greedy_decode, prefill

ATOL = RTOL = 1e-4  # fixtures README: logits / hidden states


@pytest.fixture(scope="module")
def thinker(fixture_root):
    return load_thinker(fixture_root)


@pytest.fixture(scope="module")
def case(load_case):
    return load_case("thinker_text")


def _sorted_routing(record):
    ids, order = record.expert_ids[0].sort(-1)
    return ids, record.weights[0].gather(-1, order)


def test_fixture_thinker_text_positions(case):
    """Text-only 3-D positions are 0..T-1 in every row with rope delta 0, as in the fixture."""
    tensors, meta = case
    media = MediaTokenIds.from_token_map(meta["special_ids_tiny"])
    pos, deltas = get_t_scale_rope_index(tensors["input_ids"], media)
    assert torch.equal(pos, tensors["position_ids"])
    assert deltas.tolist() == [[0]]


def test_fixture_thinker_text_logits_and_hidden(case, thinker):
    """Full-sequence final hidden state and logits match the official forward (rtol/atol 1e-4)."""
    tensors, _ = case
    with torch.no_grad():
        hidden = thinker(thinker.embed(tensors["input_ids"]), tensors["position_ids"])
        logits = thinker.logits(hidden)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(hidden, tensors["final_hidden_state"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(logits, tensors["logits"], rtol=RTOL, atol=ATOL)


def test_fixture_thinker_text_routing(case, thinker):
    """Every MoE layer picks the fixture's experts for every token (exact) with the same weights."""
    tensors, _ = case
    routing = []
    with torch.no_grad():
        thinker(thinker.embed(tensors["input_ids"]), tensors["position_ids"], routing=routing)
    cfg = thinker.cfg
    assert [r.layer for r in routing] == list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))
    for record in routing:
        ids, weights = _sorted_routing(record)
        assert torch.equal(ids, tensors[f"route_layer{record.layer}_expert_ids"])
        torch.testing.assert_close(weights, tensors[f"route_layer{record.layer}_expert_weights"], rtol=1e-4, atol=1e-5)


def test_fixture_thinker_text_greedy_kv_cache(case, thinker):
    """Greedy continuation via KV cache (whole prefill, and prefill in 2 chunks) equals the fixture's."""
    tensors, _ = case
    ids = tensors["input_ids"]
    expected = tensors["greedy_ids"]
    assert torch.equal(_text_greedy(thinker, ids, n=expected.shape[1]), expected)
    assert torch.equal(_text_greedy(thinker, ids, splits=(ids.shape[1] // 2,), n=expected.shape[1]), expected)


def test_thinker_two_slots_decode_together(case, thinker):
    """Two slots at different lengths decoded in one batch give the tokens each gives alone."""
    tensors, _ = case
    long_ids = tensors["input_ids"]
    short_ids = long_ids[:, : long_ids.shape[1] - 6]
    n = 6
    alone = [_text_greedy(thinker, x, n=n) for x in (long_ids, short_ids)]
    cache = ThinkerKVCache.allocate(thinker.cfg, 3, long_ids.shape[1] + n + 1)
    firsts = []
    with torch.no_grad():
        for slot, x in ((2, long_ids), (0, short_ids)):
            t = x.shape[1]
            pos = torch.arange(t)[None]
            firsts.append(prefill(thinker, cache, slot, thinker.embed(x), pos.expand(3, 1, t), pos).argmax(-1))
        together = greedy_decode(thinker, cache, torch.tensor([2, 0]), torch.cat(firsts),
                                 torch.tensor([long_ids.shape[1], short_ids.shape[1]]), torch.zeros(2, dtype=torch.int64), n)
    assert torch.equal(together, torch.cat(alone))


def test_thinker_padding_row_writes_only_the_sink(case, thinker):
    """A padding row (cache position -1) leaves its slot's cache unchanged and the real row's output intact."""
    tensors, _ = case
    ids = tensors["input_ids"][:, :5]
    cache = ThinkerKVCache.allocate(thinker.cfg, 2, 16)
    before = cache.k[:, 1, :, :16].clone()
    pos = torch.tensor([[0, 1, 2, 3, 4], [-1, -1, -1, -1, -1]])
    embeds = thinker.embed(torch.cat([ids, ids]))
    with torch.no_grad():
        h = thinker(embeds, text_position_ids(pos, torch.zeros(2, dtype=torch.int64)), cache=cache,
                    slots=torch.tensor([0, 1]), cache_positions=pos)
        ref = thinker(embeds[:1], text_position_ids(pos[:1], torch.zeros(1, dtype=torch.int64)))
    assert torch.equal(cache.k[:, 1, :, :16], before)
    assert torch.isfinite(h).all()
    torch.testing.assert_close(h[:1], ref, rtol=1e-5, atol=1e-5)


def test_padding_tokens_read_no_expert_of_their_own(thinker, monkeypatch):
    """A padding token (`live` False) goes to the first token's experts (no weight read for it alone), and the
    router still records its own choice; the live tokens' outputs are unchanged."""
    from realtime_ming.model import moe as moe_module

    block = next(layer.mlp for layer in thinker.model.layers if layer.is_moe)
    x = torch.randn(1, 6, thinker.cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    live = torch.tensor([True, True, True, False, False, False])
    seen = []
    for name in ("experts_gathered", "experts_grouped"):
        real = getattr(moe_module, name)
        monkeypatch.setattr(moe_module, name, lambda x, ids, *a, _real=real: (seen.append(ids), _real(x, ids, *a))[1])
    routing = []
    with torch.no_grad():
        want = block(x)
        got = block(x, live=live, routing=routing)
    chosen, ran = routing[0].expert_ids.view(6, -1), seen[-1]
    assert torch.equal(ran[:3], chosen[:3]) and torch.equal(ran[3:], chosen[:1].expand(3, -1))
    assert not torch.equal(chosen[3:], chosen[:1].expand(3, -1))  # the remap did something
    torch.testing.assert_close(got[:, :3], want[:, :3], rtol=1e-5, atol=1e-5)


def test_thinker_stacked_experts_hold_checkpoint_tensors(thinker, fixture_root):
    """experts_gate_up[e] = [gate_proj; up_proj] and experts_down[e] = down_proj of checkpoint expert e."""
    from safetensors import safe_open

    layer = thinker.cfg.first_k_dense_replace  # the first MoE layer
    mlp = thinker.model.layers[layer].mlp
    inter = thinker.cfg.moe_intermediate_size
    weight_map = read_weight_map(fixture_root)  # the index's shard of every key
    for e in (0, thinker.cfg.num_experts - 1):
        key = f"model.model.layers.{layer}.mlp.experts.{e}."
        for name, want in (("gate_proj", mlp.experts_gate_up[e, :inter]), ("up_proj", mlp.experts_gate_up[e, inter:]),
                           ("down_proj", mlp.experts_down[e])):
            with safe_open(str(weight_map[key + name + ".weight"]), framework="pt") as f:
                assert torch.equal(want, f.get_tensor(key + name + ".weight"))


def test_thinker_loader_reports_missing_expert_key(thinker, fixture_root):
    """A checkpoint lacking one expert's tensor fails loading, naming the partly filled stacked parameter."""
    cfg = thinker.cfg
    layer, expert = cfg.num_hidden_layers - 1, cfg.num_experts - 1  # the last MoE layer's last expert
    weight_map = read_weight_map(fixture_root)
    del weight_map[f"model.model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"]
    with torch.device("meta"):
        fresh = Thinker(cfg)
    with pytest.raises(LoadError) as err:
        load_weights(fresh, weight_map, prefix="model.")
    parts = f"({2 * cfg.num_experts - 1}/{2 * cfg.num_experts} parts)"
    assert f"model.model.layers.{layer}.mlp.experts_gate_up {parts}" in str(err.value)


def test_moe_gathered_equals_grouped():
    """The per-token gather path and the sort-by-expert path compute the same routed output."""
    gen = torch.Generator().manual_seed(0)
    e, d, i, n, k = 8, 16, 12, 10, 3
    w13 = torch.randn(e, 2 * i, d, generator=gen)
    w2 = torch.randn(e, d, i, generator=gen)
    x = torch.randn(n, d, generator=gen)
    ids, weights = select_experts(torch.randn(n, e, generator=gen), torch.zeros(e), k, 2, 1, 2.5)
    torch.testing.assert_close(experts_gathered(x, ids, weights, w13, w2),
                               experts_grouped(x, ids, weights, w13, w2), rtol=1e-5, atol=1e-4)


def test_select_experts_stays_in_top_groups():
    """Chosen experts all lie in the `topk_group` groups with the best top-2 biased scores."""
    gen = torch.Generator().manual_seed(1)
    logits, bias = torch.randn(32, 16, generator=gen), 0.05 * torch.randn(16, generator=gen)
    ids, weights = select_experts(logits, bias, 4, 4, 2, 2.5)
    group_scores = (torch.sigmoid(logits) + bias).view(32, 4, 4).topk(2, -1).values.sum(-1)
    best = group_scores.topk(2, -1).indices
    assert all(set((row // 4).tolist()) <= set(g.tolist()) for row, g in zip(ids, best))
    torch.testing.assert_close(weights.sum(-1), torch.full((32,), 2.5))


def test_thinker_bf16_close_to_fp32(case, thinker, fixture_root):
    """The model and inputs in bf16 give logits within 2e-2 relative L2 error of the fp32 logits."""
    tensors, _ = case
    ids, pos = tensors["input_ids"], tensors["position_ids"]
    bf = load_thinker(fixture_root, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = thinker.logits(thinker(thinker.embed(ids), pos))
        out = bf.logits(bf(bf.embed(ids), pos))
    assert out.dtype == torch.float32
    rel = (out - ref).norm() / ref.norm()
    assert rel < 2e-2, rel


@torch.no_grad()
def test_multi_router_route_equals_each_gate_then_override(thinker):
    """One GEMM over the routers in use + per-token selection == every gate alone, image then audio overriding
    the text gate where their masks are set (the reference's order)."""
    block = next(layer.mlp for layer in thinker.model.layers if hasattr(layer.mlp, "audio_gate"))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, thinker.cfg.hidden_size, generator=gen)
    image = torch.zeros(12, dtype=torch.bool)
    audio = torch.zeros(12, dtype=torch.bool)
    image[2:5], audio[6:10], audio[4] = True, True, True  # token 4 in both: audio wins
    ids, weights = block.gate(x)
    for mask, gate in ((image, block.image_gate), (audio, block.audio_gate)):
        m_ids, m_weights = gate(x)
        ids, weights = torch.where(mask[:, None], m_ids, ids), torch.where(mask[:, None], m_weights, weights)
    got_ids, got_weights = block.route(x, image, audio)
    order, got_order = ids.sort(-1).indices, got_ids.sort(-1).indices
    assert torch.equal(ids.gather(1, order), got_ids.gather(1, got_order))
    torch.testing.assert_close(got_weights.gather(1, got_order), weights.gather(1, order))
    assert torch.equal(block.route(x, None, audio)[0].sort(-1).values, torch.where(
        audio[:, None], block.audio_gate(x)[0], block.gate(x)[0]).sort(-1).values)
