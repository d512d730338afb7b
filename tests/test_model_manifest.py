"""Full-size shapes: the modules built on meta from the real configs consume exactly the checkpoint
tensors of the full-size manifest (tests/fixtures/ming_flash_omni_2_0_manifest.json, issue 2)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

from realtime_ming.model.config import MingConfig, Qwen2Config, VAEConfig, parse
from realtime_ming.model.loader import checkpoint_keys
from realtime_ming.model.ming import MingOmni, build_ming
from realtime_ming.model.presets import preset_config
from realtime_ming.model.talker import Talker
from realtime_ming.model.vae import AudioVAE

PRESET = "ming-flash-omni-2.0"


@pytest.fixture(scope="module")
def manifest(fixture_root) -> dict:
    return json.loads((fixture_root.parent / "ming_flash_omni_2_0_manifest.json").read_text())


def _file(manifest: dict, name: str) -> dict:
    (entry,) = [v for k, v in manifest["files"].items() if k.startswith(name)]
    return entry


def _tensors(entry: dict) -> dict[str, tuple[int, ...]]:
    return {key: tuple(shape) for key, shape, _ in entry["tensors"]}


def _diff(ours: dict, theirs: dict) -> str:
    """A readable summary of the key/shape differences (empty when equal)."""
    lines = [f"only in model: {k} {ours[k]}" for k in sorted(ours.keys() - theirs.keys())[:10]]
    lines += [f"only in manifest: {k} {theirs[k]}" for k in sorted(theirs.keys() - ours.keys())[:10]]
    lines += [f"shape {k}: model {ours[k]} manifest {theirs[k]}" for k in sorted(ours.keys() & theirs.keys())
              if ours[k] != theirs[k]][:10]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def real_root_config(fixture_root) -> MingConfig:
    raw = json.loads((fixture_root.parent / "ming_flash_omni_2_0_config.json").read_text())
    return parse(MingConfig, raw, "config.json")


def test_root_matches_manifest(real_root_config, manifest):
    """MingOmni from the real config.json consumes exactly the manifest's 25131 root keys and shapes."""
    with torch.device("meta"):
        ming = MingOmni(real_root_config)
    entry = _file(manifest, "model.safetensors.index.json")
    ours, theirs = checkpoint_keys(ming), _tensors(entry)
    assert ours == theirs, _diff(ours, theirs)
    assert len(ours) == entry["n_tensors"]
    assert sum(p.numel() for p in ming.parameters()) + ming.audio.positional_embedding.numel() == entry["n_params"]


def test_stacked_experts_expand_to_per_expert_keys(real_root_config):
    """Each stacked expert tensor stands for E gate/up (resp. E down) checkpoint keys that map back to it."""
    with torch.device("meta"):
        ming = MingOmni(real_root_config)
    llm = real_root_config.llm_config
    keys = checkpoint_keys(ming)
    base = f"model.model.layers.{llm.first_k_dense_replace}.mlp.experts"
    last = llm.num_experts - 1
    assert keys[f"{base}.{last}.gate_proj.weight"] == (llm.moe_intermediate_size, llm.hidden_size)
    assert keys[f"{base}.{last}.down_proj.weight"] == (llm.hidden_size, llm.moe_intermediate_size)
    assert ming.checkpoint_key_map(f"{base}.{last}.up_proj.weight") == (f"{base}_gate_up", (last, 1))
    assert not any(k.endswith(("experts_gate_up", "experts_down")) for k in keys)


def test_talker_preset_matches_manifest(manifest):
    """The talker of the full-size preset consumes exactly the manifest's 537 talker keys and shapes."""
    with torch.device("meta"):
        talker = Talker(preset_config(PRESET).talker)
    entry = _file(manifest, "talker/model.safetensors")
    ours, theirs = checkpoint_keys(talker), _tensors(entry)
    assert ours == theirs, _diff(ours, theirs)
    assert len(ours) == entry["n_tensors"]


def _backbone_names(bb: Qwen2Config) -> SimpleNamespace:
    fields = {f: getattr(bb, f) for f in bb.__slots__}
    return SimpleNamespace(**{**fields, "head_dim": bb.resolved_head_dim})


def _eval_dim(expr, names: dict) -> int:
    """A manifest dimension: an int, or a formula like 'enc.num_key_value_heads*enc.head_dim' or
    'n_fft+2 = 4*882+2 (=3530)'; a stated '(=N)' must agree with the value computed from the config."""
    if isinstance(expr, int):
        return expr
    stated = re.search(r"\(=(\d+)\)", expr)
    formula = expr.split(" (")[0].split(" = ")[0].strip()
    value = int(eval(formula, {"__builtins__": {}}, names))  # formulas of config fields only
    if stated:
        assert value == int(stated.group(1)), f"{expr}: config gives {value}"
    return value


def _layer_count(note: str, names: dict) -> int:
    m = re.search(r"L\s*=\s*0\s*\.\.\s*([^)]+)\)", note)
    assert m, f"no layer range in {note!r}"
    return _eval_dim(m.group(1).strip(), names) + 1


def expand_vae_patterns(patterns: list, cfg: VAEConfig) -> dict[str, tuple[int, ...]]:
    """The manifest's VAE key patterns with `{L}` and the shape formulas evaluated for `cfg`."""
    enc, dec = cfg.enc_kwargs.backbone, cfg.dec_kwargs.backbone
    common = {"enc": _backbone_names(enc), "dec": _backbone_names(dec), "latent_dim": cfg.enc_kwargs.latent_dim,
              "n_fft": 4 * cfg.dec_kwargs.output_dim}
    keys = {}
    for key, shape, note in patterns:
        vocab = (enc if key.startswith("encoder.") else dec).vocab_size
        names = {**common, "vocab_size": vocab}
        dims = tuple(_eval_dim(d, names) for d in shape)
        if "{L}" in key:
            for layer in range(_layer_count(note, names)):
                keys[key.replace("{L}", str(layer))] = dims
        else:
            keys[key] = dims
    return keys


def test_vae_preset_matches_manifest_patterns(manifest):
    """The VAE of the full-size preset consumes exactly the manifest's key patterns expanded with its dims."""
    cfg = preset_config(PRESET).vae
    with torch.device("meta"):
        vae = AudioVAE(cfg)
    theirs = expand_vae_patterns(_file(manifest, "talker/vae/model.safetensors")["patterns"], cfg)
    ours = checkpoint_keys(vae)
    assert ours == theirs, _diff(ours, theirs)


def test_vae_pattern_expansion_matches_fixture_file(fixture_root, manifest):
    """The same pattern expansion with the tiny config gives exactly the fixture VAE file (checks the expander)."""
    from safetensors import safe_open

    from realtime_ming.model.config import load_checkpoint_config

    cfg = load_checkpoint_config(fixture_root).vae
    with safe_open(str(fixture_root / "talker" / "vae" / "model.safetensors"), framework="pt") as f:
        stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert expand_vae_patterns(_file(manifest, "talker/vae/model.safetensors")["patterns"], cfg) == stored


def test_full_size_preset_builds_on_meta_allocating_nothing():
    """Root, talker and VAE of the full-size preset build on meta: every tensor is a meta tensor (no storage)."""
    cfg = preset_config(PRESET)
    ming = build_ming(cfg.ming, weights="meta")
    with torch.device("meta"):
        talker, vae = Talker(cfg.talker), AudioVAE(cfg.vae)
    assert all(t.is_meta for m in (ming, talker, vae) for t in m.state_dict().values())
    assert sum(p.numel() for p in ming.parameters()) > 100e9
