"""Checkpoint variants the official code produces but the in-repo fixture set does not exercise: a config
without `head_dim` (hidden/heads), one KV head (replicated across tensor-parallel ranks), two shared experts,
and the root weights in two shards named by the index's weight_map. Weights are seeded random tensors
written under the checkpoint's own key names."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file

from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.layers import TPGroup
from realtime_ming.model.loader import checkpoint_keys, narrow_for_rank, read_weight_map
from realtime_ming.model.ming import MingOmni
from realtime_ming.model.rope3d import text_position_ids
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker

WORLD = 2
NEW_TOKENS = 3


def _variant_llm(llm: dict) -> dict:
    """hidden = heads·head_dim with no `head_dim` field, one KV head, two shared experts."""
    head_dim = llm.get("head_dim") or llm["hidden_size"] // llm["num_attention_heads"]
    out = {k: v for k, v in llm.items() if k != "head_dim"}
    out.update(num_attention_heads=2, hidden_size=2 * head_dim, num_key_value_heads=1, num_shared_experts=2)
    return out


def _random_tensors(keys: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for key, shape in sorted(keys.items()):
        t = torch.randn(shape, generator=gen)
        if key.endswith("norm.weight") or "layernorm" in key or key.endswith("norm1.weight") or key.endswith("norm2.weight"):
            t = 1 + 0.1 * t
        elif len(shape) >= 2:
            t = t / shape[-1] ** 0.5
        else:
            t = 0.05 * t
        out[key] = t.contiguous()
    return out


@pytest.fixture(scope="module")
def variant(fixture_root, tmp_path_factory) -> tuple[Path, Path]:
    """(two-shard checkpoint, the same weights in one model.safetensors) of the variant config."""
    base = tmp_path_factory.mktemp("variant")
    sharded, single = base / "sharded", base / "single"
    shutil.copytree(fixture_root, sharded, ignore=shutil.ignore_patterns("cases", "model.safetensors*"))
    config = json.loads((fixture_root / "config.json").read_text())
    config["llm_config"] = _variant_llm(config["llm_config"])
    (sharded / "config.json").write_text(json.dumps(config, indent=2))
    cfg = load_checkpoint_config(sharded)
    with torch.device("meta"):
        keys = checkpoint_keys(MingOmni(cfg.ming))
    tensors = _random_tensors(keys)
    names = sorted(tensors)
    # alternate keys between the shards, so one layer's experts (one stacked parameter) span both files
    shards = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
    for file, part in shards.items():
        save_file({k: tensors[k] for k in part}, str(sharded / file))
    weight_map = {k: file for file, part in shards.items() for k in part}
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": weight_map}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    shutil.copytree(sharded, single, ignore=shutil.ignore_patterns("model*.safetensors*"))
    save_file(tensors, str(single / "model.safetensors"))
    return sharded, single


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(thinker, ids: torch.Tensor):
    t = ids.shape[1]
    pos = torch.arange(t)[None]
    cache = ThinkerKVCache.allocate(thinker.cfg, 1, t + NEW_TOKENS, tp=thinker.tp)
    slots, zero = torch.tensor([0]), torch.zeros(1, dtype=torch.int64)
    with torch.no_grad():
        logits = thinker.logits(thinker(thinker.embed(ids), pos.expand(3, 1, t), cache=cache, slots=slots,
                                        cache_positions=pos))
        token, out = logits[:, -1].argmax(-1), []
        for step in range(NEW_TOKENS):
            out.append(token)
            cp = torch.tensor([[t + step]])
            h = thinker(thinker.embed(token[:, None]), text_position_ids(cp, zero), cache=cache, slots=slots,
                        cache_positions=cp)
            token = thinker.logits(h[:, -1]).argmax(-1)
    return logits, torch.stack(out, dim=1)


def _worker(rank: int, port: int, root: str, ids: torch.Tensor, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        torch.save(_run(load_thinker(root, tp=TPGroup(rank, WORLD)), ids), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_tp2_with_one_kv_head_matches_tp1(variant, tmp_path):
    """Two gloo ranks sharing the single KV head give the TP=1 logits and cached greedy tokens."""
    sharded, _ = variant
    ids = torch.arange(5, 5 + 13)[None]
    ref_logits, ref_tokens = _run(load_thinker(sharded), ids)
    mp.spawn(_worker, args=(_free_port(), str(sharded), ids, str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        logits, tokens = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(tokens, ref_tokens)
