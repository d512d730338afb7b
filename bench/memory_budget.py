"""GPU memory a serving config needs at the real Ming-flash-omni-2.0 shapes, per device, before activations.

    python -m bench.memory_budget configs/ming-flash-omni-2.0-1gpu.yaml [--capacity-gib 139] [--json]

Weights: the root checkpoint's tensors from the manifest (tests/fixtures/ming_flash_omni_2_0_manifest.json: every
key and shape), the routed experts (`...mlp.experts.N.*`) counted in the config's engine.expert_dtype (fp8: 1 byte
per weight + one fp32 scale per output row), every other tensor in engine.dtype; each thinker rank's share from
the thinker built on the meta device at that tensor-parallel rank (checked against the manifest at TP=1); the
talker and AudioVAE from their modules on meta (the manifest has no VAE dims). Caches: the thinker's KV slots
(engine.thinker.max_slots x (max_seq_len + 1) positions per layer) and the talker's (max_streams x max_prompt_len).
What remains of the capacity is left for activations, CUDA graphs, the CUDA context and the allocator's slack.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realtime_ming.model.layers import TPGroup  # noqa: E402
from realtime_ming.model.presets import preset_config  # noqa: E402
from realtime_ming.model.talker import Talker  # noqa: E402
from realtime_ming.model.thinker import Thinker  # noqa: E402
from realtime_ming.model.vae import AudioVAE  # noqa: E402
from realtime_ming.server.config import load_serve_config  # noqa: E402

MANIFEST = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ming_flash_omni_2_0_manifest.json"
_EXPERT = re.compile(r"^model\.model\.layers\.\d+\.mlp\.experts\.\d+\.")
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GB = 1e9
GIB = 2 ** 30


def root_tensors(manifest: Path = MANIFEST) -> list[tuple[str, tuple[int, ...]]]:
    """(key, shape) of every root checkpoint tensor (model-000NN-of-00042.safetensors)."""
    files = json.loads(manifest.read_text())["files"]
    root = next(v for k, v in files.items() if k.startswith("model.safetensors.index.json"))
    return [(key, tuple(shape)) for key, shape, *_ in root["tensors"]]


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def root_bytes(dtype_bytes: int, fp8_experts: bool, manifest: Path = MANIFEST) -> dict:
    """The root checkpoint at TP=1 from the manifest: parameters and bytes, routed experts apart."""
    experts = other = expert_rows = 0
    for key, shape in root_tensors(manifest):
        if _EXPERT.match(key):
            experts += _numel(shape)
            expert_rows += shape[0]
        else:
            other += _numel(shape)
    expert_bytes = experts + 4 * expert_rows if fp8_experts else experts * dtype_bytes
    return {"params": experts + other, "expert_params": experts, "expert_bytes": expert_bytes,
            "other_bytes": other * dtype_bytes, "bytes": expert_bytes + other * dtype_bytes}


def module_bytes(module: torch.nn.Module, dtype_bytes: int) -> int:
    """Bytes of a meta module's parameters and buffers once materialised (`loader.materialize`): a module's
    `keep_dtypes` (fp8 experts, their fp32 scales) at their own size, every other floating tensor at `dtype_bytes`."""
    total = 0
    for sub in module.modules():
        kept = getattr(sub, "keep_dtypes", {})
        for name, t in list(sub.named_parameters(recurse=False)) + list(sub.named_buffers(recurse=False)):
            if name in kept:
                size = torch.empty((), dtype=kept[name]).element_size()
            else:
                size = dtype_bytes if t.is_floating_point() else t.element_size()
            total += t.numel() * size
    return total


def budget(config_path: str | Path, capacity_gib: float, overrides: tuple[str, ...] = ()) -> dict:
    """Per-device bytes of the config's weights and caches at the real shapes, and what is left of the capacity."""
    cfg = load_serve_config(config_path, overrides).engine
    ck = preset_config("ming-flash-omni-2.0")
    dtype_bytes = _BYTES[cfg.dtype]
    fp8 = cfg.expert_dtype == "fp8"
    place, th, tk = cfg.placement, cfg.thinker, cfg.talker
    tp = place.tp_size
    devices: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    thinker_cfg = ck.ming.llm_config
    for rank, device in enumerate(place.thinker_devices):
        with torch.device("meta"):
            thinker = Thinker(thinker_cfg, TPGroup(rank, tp) if tp > 1 else TPGroup(),
                              expert_dtype=cfg.expert_dtype)
        devices[device]["thinker weights"] += module_bytes(thinker, dtype_bytes)
        kv_heads = TPGroup(rank, tp).heads(thinker_cfg.num_key_value_heads, "kv heads") if tp > 1 else \
            thinker_cfg.num_key_value_heads
        devices[device]["thinker KV cache"] += (2 * thinker_cfg.num_hidden_layers * th.max_slots * kv_heads
                                                * (th.max_seq_len + 1) * thinker_cfg.resolved_head_dim * dtype_bytes)
    root = root_bytes(dtype_bytes, fp8)
    with torch.device("meta"):
        whole = Thinker(thinker_cfg, expert_dtype=cfg.expert_dtype)
    thinker_tp1 = module_bytes(whole, dtype_bytes)
    devices[place.encoder_device]["encoders (vision, audio, projectors)"] += root["bytes"] - thinker_tp1
    llm = ck.talker.llm
    for talker_dev, vae_dev in place.talker_replicas:
        with torch.device("meta"):
            devices[talker_dev]["talker weights"] += module_bytes(Talker(ck.talker), dtype_bytes)
            devices[vae_dev]["AudioVAE weights"] += module_bytes(AudioVAE(ck.vae), dtype_bytes)
        head_dim = llm.hidden_size // llm.num_attention_heads
        devices[talker_dev]["talker KV cache"] += (2 * llm.num_hidden_layers * tk.max_streams * llm.num_key_value_heads
                                                   * tk.max_prompt_len * head_dim * dtype_bytes)
    out = {"config": str(config_path), "capacity_gib": capacity_gib, "root_tp1": root, "devices": {}}
    for device, parts in devices.items():
        used = sum(parts.values())
        out["devices"][device] = {"parts_gb": {k: round(v / GB, 2) for k, v in parts.items()},
                                  "total_gib": round(used / GIB, 2),
                                  "left_gib": round(capacity_gib - used / GIB, 2)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--capacity-gib", type=float, default=139.0, help="usable memory per GPU (H200: ~139 GiB)")
    ap.add_argument("--set", action="append", default=[], help="config override key=value (as serve --set)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = budget(args.config, args.capacity_gib, tuple(args.set))
    if args.json:
        print(json.dumps(res, indent=1))
        return
    r = res["root_tp1"]
    print(f"root checkpoint (TP=1): {r['params'] / 1e9:.2f} B params, routed experts {r['expert_params'] / 1e9:.2f} B "
          f"-> {r['bytes'] / GB:.1f} GB ({r['expert_bytes'] / GB:.1f} GB experts)")
    for device, d in res["devices"].items():
        parts = ", ".join(f"{k} {v} GB" for k, v in d["parts_gb"].items())
        print(f"{device}: {d['total_gib']} GiB of {res['capacity_gib']} ({d['left_gib']} GiB left): {parts}")


if __name__ == "__main__":
    main()
