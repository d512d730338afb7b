"""Checkpoint variants the official code produces but the in-repo fixture set does not exercise: a config
without `head_dim` (hidden/heads), one KV head (replicated across tensor-parallel ranks), two shared experts,
and the root weights in two shards named by the index's weight_map. Weights are seeded random tensors
written under the checkpoint's own key names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from thinker_support import greedy_decode, spawn_ranks

from realtime_ming.model.config import MingConfig, load_checkpoint_config, parse
from realtime_ming.model.layers import TPGroup
from realtime_ming.model.loader import narrow_for_rank, read_weight_map
from realtime_ming.model.thinker import Thinker, load_thinker
from checkpoint_support import make_variant, WORLD

NEW_TOKENS = 3


@pytest.fixture(scope="module")
def variant(fixture_root, tmp_path_factory) -> tuple[Path, Path]:
    return make_variant(fixture_root, tmp_path_factory.mktemp("variant"))


def test_variant_config_resolves_like_the_reference(variant):
    """No head_dim -> hidden/heads; one KV head; the shared expert MLP is moe_intermediate·num_shared_experts wide."""
    sharded, _ = variant
    cfg = load_checkpoint_config(sharded).thinker
    assert cfg.head_dim is None and cfg.resolved_head_dim == cfg.hidden_size // cfg.num_attention_heads
    assert cfg.num_key_value_heads == 1 and cfg.num_shared_experts == 2
    thinker = load_thinker(sharded)
    shared = thinker.model.layers[cfg.first_k_dense_replace].mlp.shared_experts
    assert shared.gate_proj.weight.shape == (cfg.moe_intermediate_size * cfg.num_shared_experts, cfg.hidden_size)
    assert shared.down_proj.weight.shape == (cfg.hidden_size, cfg.moe_intermediate_size * cfg.num_shared_experts)


def test_two_shards_load_like_one_file(variant):
    """Every parameter loaded through the two-shard index equals the single-file load, and so do the logits."""
    sharded, single = variant
    assert len(set(read_weight_map(sharded).values())) == 2
    a, b = load_thinker(sharded), load_thinker(single)
    sb = b.state_dict()
    assert all(torch.equal(v, sb[k]) for k, v in a.state_dict().items())
    ids = torch.arange(3, 3 + 11)[None] % a.cfg.vocab_size
    pos = torch.arange(ids.shape[1]).expand(3, 1, -1)
    with torch.no_grad():
        torch.testing.assert_close(a.logits(a(a.embed(ids), pos)), b.logits(b(b.embed(ids), pos)), rtol=0, atol=0)


def test_one_kv_head_is_replicated_per_rank(variant):
    """With fewer KV heads than ranks each rank holds the KV head its query heads use, not an empty slice."""
    sharded, _ = variant
    cfg = load_checkpoint_config(sharded).thinker
    hd = cfg.resolved_head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    full = torch.arange((q + 2 * kv) * 2, dtype=torch.float32).view(q + 2 * kv, 2)
    splits = (q, (kv, cfg.num_key_value_heads), (kv, cfg.num_key_value_heads))
    for rank in range(WORLD):
        part = narrow_for_rank(full, 0, splits, TPGroup(rank, WORLD))
        qs, ks, vs = full.split([q, kv, kv])
        assert torch.equal(part, torch.cat([qs.chunk(WORLD)[rank], ks, vs]))
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        TPGroup(0, 2).heads(3, "num_key_value_heads")


@pytest.mark.parametrize("world,q_heads,kv_heads", [(2, 2, 1), (4, 4, 2), (8, 32, 4), (8, 8, 1), (4, 8, 4)])
def test_each_rank_holds_the_kv_head_its_query_heads_use(world, q_heads, kv_heads):
    """Fused QKV rows of every rank, traced back to global heads: local query head j attends with local KV head
    j // (local q / local kv) (SDPA's GQA grouping), which must be the global KV head h // (Hq / Hkv) of its
    global query head h -- also when the TP degree exceeds the KV heads (Ming's 32/4 heads at TP=8)."""
    hd = 2
    q, kv = q_heads * hd, kv_heads * hd
    full = torch.arange(q + 2 * kv, dtype=torch.float32)[:, None]  # each row holds its own feature index
    splits = (q, (kv, kv_heads), (kv, kv_heads))
    for rank in range(world):
        tp = TPGroup(rank, world)
        local_q, local_kv = tp.divide(q_heads, "q"), tp.heads(kv_heads, "kv")
        rows = narrow_for_rank(full, 0, splits, tp)[:, 0].long()
        assert rows.numel() == (local_q + 2 * local_kv) * hd
        q_ids = rows[: local_q * hd : hd] // hd
        k_ids = (rows[local_q * hd : (local_q + local_kv) * hd : hd] - q) // hd
        v_ids = (rows[(local_q + local_kv) * hd :: hd] - q - kv) // hd
        assert torch.equal(k_ids, v_ids)
        for j, h in enumerate(q_ids.tolist()):
            assert k_ids[j // (local_q // local_kv)] == h // (q_heads // kv_heads), (rank, j, h)


@pytest.mark.parametrize("rank", [0, 5, 7])
def test_real_thinker_builds_at_tp8_with_replicated_kv_heads(fixture_root, rank):
    """The full-size thinker (32 query / 4 KV heads) as rank `rank` of TP=8: 4 query heads and 1 KV head per
    rank, and the loader's slice of the manifest's fused QKV tensor has exactly the rank's parameter shape."""
    raw = json.loads((fixture_root.parent / "ming_flash_omni_2_0_config.json").read_text())
    llm = parse(MingConfig, raw, "config.json").llm_config
    manifest = json.loads((fixture_root.parent / "ming_flash_omni_2_0_manifest.json").read_text())
    (root,) = [v for k, v in manifest["files"].items() if k.startswith("model.safetensors.index.json")]
    shapes = {key: tuple(shape) for key, shape, _ in root["tensors"]}
    tp = TPGroup(rank, 8)
    with torch.device("meta"):
        thinker = Thinker(llm, tp)
    attn = thinker.model.layers[0].attention
    assert (attn.num_heads, attn.num_kv) == (llm.num_attention_heads // 8, 1)
    qkv = attn.query_key_value.weight
    full = torch.empty(shapes["model.model.layers.0.attention.query_key_value.weight"], device="meta")
    assert narrow_for_rank(full, qkv.tp_dim, qkv.tp_splits, tp).shape == qkv.shape


def _worker(rank: int, world: int, root: str, ids: torch.Tensor, out_dir: str) -> None:
    thinker = load_thinker(root, tp=TPGroup(rank, world))
    kv_heads = thinker.model.layers[0].attention.num_kv
    torch.save((*greedy_decode(thinker, ids, NEW_TOKENS), kv_heads), f"{out_dir}/rank{rank}.pt")


def _assert_tp_matches_tp1(root: Path, world: int, tmp_path: Path) -> None:
    """`world` gloo ranks give the TP=1 logits and cached greedy tokens, each rank holding one replicated KV head."""
    assert load_checkpoint_config(root).thinker.num_key_value_heads < world  # the replicated case
    ids = torch.arange(5, 5 + 13)[None]
    ref_logits, ref_tokens = greedy_decode(load_thinker(root), ids, NEW_TOKENS)
    spawn_ranks(_worker, world, world, str(root), ids, str(tmp_path))
    for rank in range(world):
        logits, tokens, kv_heads = torch.load(tmp_path / f"rank{rank}.pt")
        assert kv_heads == 1
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(tokens, ref_tokens)


@pytest.mark.slow
def test_tp2_with_one_kv_head_matches_tp1(variant, tmp_path):
    """Two gloo ranks sharing the single KV head give the TP=1 logits and cached greedy tokens."""
    sharded, _ = variant
    _assert_tp_matches_tp1(sharded, WORLD, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tp4_with_two_kv_heads_matches_tp1(fixture_root, tmp_path):
    """Four gloo ranks over 4 query / 2 KV heads (ranks 0-1 hold KV head 0, ranks 2-3 head 1): the set's weights
    layout with its head counts built for TP=4, whatever heads the set itself has."""
    sharded, _ = make_variant(fixture_root, tmp_path / "tp4", heads=4, kv_heads=2)
    _assert_tp_matches_tp1(sharded, 4, tmp_path)
