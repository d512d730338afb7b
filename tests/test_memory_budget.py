"""bench/memory_budget.py: the root checkpoint's size from the manifest (bf16 and with FP8 experts), the meta-built
modules it counts ranks with agree with the manifest, and the shipped one-GPU and 2x 80 GB configs fit their GPUs
with room for activations, graphs and the CUDA context."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench import memory_budget as mb
from realtime_ming.model.ming import MingOmni
from realtime_ming.model.presets import preset_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
HEADROOM_GIB = 12  # activations (a 2048-token chunk), CUDA graphs of every bucket, the CUDA context, allocator slack


def test_root_checkpoint_size_from_the_manifest():
    """104.25 B root parameters, 99.86 B of them routed experts: 208.5 GB in bf16, ~108.8 GB with fp8 experts
    (1 byte per weight + a 4-byte scale per output row) -- issue 45's figures."""
    bf16 = mb.root_bytes(2, fp8_experts=False)
    fp8 = mb.root_bytes(2, fp8_experts=True)
    assert round(bf16["params"] / 1e9, 2) == 104.25 and round(bf16["expert_params"] / 1e9, 2) == 99.86
    assert round(bf16["bytes"] / 1e9, 1) == 208.5
    assert 108.5e9 < fp8["bytes"] < 109.0e9 and fp8["other_bytes"] == bf16["other_bytes"]


@pytest.mark.parametrize("expert_dtype", ["model", "fp8"])
def test_meta_modules_count_what_the_manifest_lists(expert_dtype):
    """The root built on meta (as the budget counts ranks) holds the manifest's bytes at TP=1 (plus a few computed
    tables: rotary frequencies, not checkpoint tensors)."""
    with torch.device("meta"):
        root = MingOmni(preset_config("ming-flash-omni-2.0").ming, expert_dtype=expert_dtype)
    extra = mb.module_bytes(root, 2) - mb.root_bytes(2, expert_dtype == "fp8")["bytes"]
    assert 0 <= extra < 4096


@pytest.mark.parametrize("config,capacity_gib", [("ming-flash-omni-2.0-1gpu.yaml", 139),
                                                 ("ming-flash-omni-2.0-tp2-80gb.yaml", 79)])
def test_shipped_fp8_configs_fit_their_gpus(config, capacity_gib):
    res = mb.budget(CONFIGS / config, capacity_gib)
    assert res["devices"], res
    for device, d in res["devices"].items():
        assert d["left_gib"] >= HEADROOM_GIB, (device, d)


def test_bf16_on_one_gpu_does_not_fit():
    """The same one-GPU config with bf16 experts needs more than an H200 holds: why FP8 is the one-GPU config."""
    res = mb.budget(CONFIGS / "ming-flash-omni-2.0-1gpu.yaml", 139, ("engine.expert_dtype=model",))
    assert res["devices"]["cuda:0"]["left_gib"] < 0
