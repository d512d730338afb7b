"""Checkpoint variants of the fixture set (other layouts and dtypes) for the loader and TP tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.loader import checkpoint_keys
from realtime_ming.model.ming import MingOmni

WORLD = 2


def _variant_llm(llm: dict, heads: int, kv_heads: int) -> dict:
    """`heads` query / `kv_heads` KV heads, hidden = heads·head_dim with no `head_dim` field, two shared experts."""
    head_dim = llm.get("head_dim") or llm["hidden_size"] // llm["num_attention_heads"]
    out = {k: v for k, v in llm.items() if k != "head_dim"}
    out.update(num_attention_heads=heads, hidden_size=heads * head_dim, num_key_value_heads=kv_heads,
               num_shared_experts=2)
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


def make_variant(fixture_root: Path, base: Path, heads: int = WORLD, kv_heads: int = 1) -> tuple[Path, Path]:
    """(two-shard checkpoint, the same weights in one model.safetensors) of the variant config with `heads` /
    `kv_heads` attention heads, under `base`."""
    sharded, single = base / "sharded", base / "single"
    shutil.copytree(fixture_root, sharded, ignore=shutil.ignore_patterns("cases", "model.safetensors*"))
    config = json.loads((fixture_root / "config.json").read_text())
    config["llm_config"] = _variant_llm(config["llm_config"], heads, kv_heads)
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
