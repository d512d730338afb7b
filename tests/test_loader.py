"""Loading the whole checkpoint (model/ming.py + loader.py): strictness and one clear error per broken
checkpoint, straight-to-dtype loading, tensor-parallel narrowing and dummy weights (issue 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from realtime_ming.model.config import ConfigError, load_checkpoint_config
from realtime_ming.model.layers import TPGroup
from realtime_ming.model.loader import (
    LoadError,
    TensorSource,
    init_dummy,
    materialize,
    narrow_for_rank,
)
from realtime_ming.model.ming import PARTS, MingOmni, build_ming, load_all, load_ming
from realtime_ming.model.talker import load_talker

LOGITS_TOL = dict(rtol=1e-4, atol=1e-4)
EMBED_TOL = dict(rtol=1e-4, atol=1e-5)


# ---- helpers ---------------------------------------------------------------------------------


@pytest.fixture
def ckpt(fixture_root, tmp_path) -> Path:
    """A private copy of the fixture checkpoint (without the cases) to break."""
    dest = tmp_path / "ckpt"
    shutil.copytree(fixture_root, dest, ignore=shutil.ignore_patterns("cases"))
    return dest


def _index(root: Path) -> dict:
    return json.loads((root / "model.safetensors.index.json").read_text())


def _shard_of(root: Path, key: str) -> Path:
    return root / _index(root)["weight_map"][key]


def _stored(root: Path, key: str) -> torch.Tensor:
    """One checkpoint tensor, read from the shard the index names for it."""
    with safe_open(str(_shard_of(root, key)), framework="pt") as f:
        return f.get_tensor(key)


def _edit_file(path: Path, edit) -> None:
    """Rewrite one safetensors file with `edit(tensors)` applied."""
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _edit_root(root: Path, key: str, edit, index: bool = True) -> None:
    """Apply `edit(tensors)` to the shard holding `key` and (if `index`) sync the index's weight map."""
    shard = _shard_of(root, key)
    _edit_file(shard, edit)
    if index:
        idx = _index(root)
        kept = {k: v for k, v in idx["weight_map"].items() if v != shard.name}
        with safe_open(str(shard), framework="pt") as f:
            kept.update({k: shard.name for k in f.keys()})
        idx["weight_map"] = kept
        (root / "model.safetensors.index.json").write_text(json.dumps(idx))


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _load_error(root: Path, **kwargs) -> str:
    with pytest.raises(LoadError) as err:
        load_all(root, **kwargs)
    return str(err.value)


def _config_error(root: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_all(root)
    return str(err.value)


def _some_key(root: Path, prefix: str, contains: str = "") -> str:
    return min(k for k in _index(root)["weight_map"] if k.startswith(prefix) and contains in k)


# ---- a good checkpoint -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ming(fixture_root) -> MingOmni:
    return load_ming(fixture_root)


@torch.no_grad()
def test_fixture_load_ming_reproduces_thinker_vision_audio(ming, load_case):
    """One load_ming call fills every part: thinker logits, image and audio embeddings equal the fixture cases."""
    t, _ = load_case("thinker_text")
    logits = ming.model.logits(ming.model(ming.model.embed(t["input_ids"]), t["position_ids"]))
    torch.testing.assert_close(logits, t["logits"], **LOGITS_TOL)
    v, _ = load_case("vision")
    image = ming.image_embeds(v["image0_pixel_values"], v["image0_grid_thw"])
    torch.testing.assert_close(image, v["image0_image_embeds"], **EMBED_TOL)
    a, _ = load_case("audio_frontend_and_encoder")
    audio = ming.audio_embeds(a["mel"], a["mel_lengths"])
    torch.testing.assert_close(audio.embeds, a["audio_embeds"], **EMBED_TOL)
    assert torch.equal(audio.lengths, a["audio_embeds_lengths"])


def test_load_all_checkpoint_parts_and_progress(fixture_root):
    """load_all returns the config and all three roots, reporting every tensor of each file once per stage."""
    calls: dict[str, list[tuple[int, int]]] = {}
    models = load_all(fixture_root, progress=lambda stage, done, total: calls.setdefault(stage, []).append((done, total)))
    assert models.config == load_checkpoint_config(fixture_root)
    counts = {
        "ming": len(_index(fixture_root)["weight_map"]),
        "talker": len(load_file(str(fixture_root / "talker" / "model.safetensors"))),
        "vae": len(load_file(str(fixture_root / "talker" / "vae" / "model.safetensors"))),
    }
    assert list(calls) == list(PARTS)
    for stage, n in counts.items():
        assert calls[stage] == [(i, n) for i in range(1, n + 1)]
    reference = load_talker(models.config.talker, fixture_root / "talker" / "model.safetensors")
    assert all(torch.equal(v, reference.state_dict()[k]) for k, v in models.talker.state_dict().items())
    assert not (models.ming.training or models.talker.training or models.vae.training)


def test_load_all_parts_subset(fixture_root):
    """Parts not requested are None and not read."""
    models = load_all(fixture_root, parts=("vae",))
    assert models.ming is None and models.talker is None and models.vae is not None


def test_load_all_argument_errors(fixture_root):
    """Contradictory or unknown arguments raise ValueError naming the argument."""
    with pytest.raises(ValueError, match="checkpoint_dir"):
        load_all(None, "tiny")  # weights default to "checkpoint"
    with pytest.raises(ValueError, match="not both"):
        load_all(fixture_root, "tiny")
    with pytest.raises(ValueError, match="parts"):
        load_all(fixture_root, parts=("thinker",))
    with pytest.raises(ValueError, match="device keys"):
        load_all(fixture_root, devices={"gpu": "cpu"})
    with pytest.raises(ValueError, match="weights"):
        load_all(fixture_root, weights="random")


# ---- broken checkpoints: one error naming the problem ----------------------------------------


def test_missing_shard_file(ckpt):
    """A shard named by the index but absent is reported with its path."""
    shard = _shard_of(ckpt, _some_key(ckpt, "model."))
    shard.unlink()
    msg = _load_error(ckpt)
    assert "missing shard files" in msg and str(shard) in msg


@pytest.mark.parametrize("rel", ["ROOT", "talker/model.safetensors", "talker/vae/model.safetensors"])
def test_truncated_safetensors(ckpt, rel):
    """A truncated safetensors file is reported with its path."""
    path = _shard_of(ckpt, _some_key(ckpt, "model.")) if rel == "ROOT" else ckpt / rel
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    msg = _load_error(ckpt)
    assert str(path) in msg


def test_corrupt_safetensors_header(ckpt):
    """Garbage in a shard's header is reported with its path (and every key of it counted missing)."""
    path = _shard_of(ckpt, _some_key(ckpt, "model."))
    data = bytearray(path.read_bytes())
    data[8:40] = b"\xff" * 32
    path.write_bytes(bytes(data))
    msg = _load_error(ckpt)
    assert str(path) in msg and "missing keys" in msg


def test_missing_key(ckpt):
    """A tensor absent from shard and index is listed as a missing key."""
    key = _some_key(ckpt, "vision.merger.")
    _edit_root(ckpt, key, lambda t: t.pop(key))
    msg = _load_error(ckpt)
    assert "missing keys (1)" in msg and key in msg


def test_missing_expert_key_names_the_checkpoint_key(ckpt):
    """A missing per-expert tensor is reported by its checkpoint key (not only the stacked parameter)."""
    key = _some_key(ckpt, "model.model.layers.", ".experts.1.up_proj")
    _edit_root(ckpt, key, lambda t: t.pop(key))
    msg = _load_error(ckpt)
    assert key in msg and "missing keys (1)" in msg


def test_key_in_index_but_not_in_shard(ckpt):
    """The index naming a tensor its shard lacks is reported with that key."""
    key = _some_key(ckpt, "audio.blocks.")
    _edit_root(ckpt, key, lambda t: t.pop(key), index=False)
    msg = _load_error(ckpt)
    assert key in msg and "unreadable tensors" in msg


def test_unexpected_key(ckpt):
    """A tensor the model has no place for is listed as unexpected."""
    anchor = _some_key(ckpt, "linear_proj.")
    _edit_root(ckpt, anchor, lambda t: t.update({"linear_proj.9.weight": torch.zeros(2, 2)}))
    msg = _load_error(ckpt)
    assert "unexpected keys (1)" in msg and "linear_proj.9.weight" in msg


def test_wrong_shape(ckpt):
    """A tensor of the wrong shape is listed with its key and both shapes."""
    key = _some_key(ckpt, "linear_proj_audio.", "bias")
    with safe_open(str(_shard_of(ckpt, key)), framework="pt") as f:
        shape = tuple(f.get_slice(key).get_shape())
    bad = (shape[0] + 1,)
    _edit_root(ckpt, key, lambda t: t.update({key: torch.zeros(bad)}))
    msg = _load_error(ckpt)
    assert "shape mismatches (1)" in msg and key in msg and str(bad) in msg and str(shape) in msg


def test_every_problem_in_one_error(ckpt):
    """Missing, unexpected and mis-shaped tensors are all listed in the same LoadError."""
    missing, wrong = _some_key(ckpt, "vision.blocks."), _some_key(ckpt, "audio.ln_post.")

    def edit(t):
        t.pop(missing)
        t[wrong] = torch.zeros(1)
        t["audio.bogus"] = torch.zeros(1)

    _edit_root(ckpt, missing, edit)
    msg = _load_error(ckpt)
    for section, key in (("missing keys", missing), ("unexpected keys", "audio.bogus"), ("shape mismatches", wrong)):
        assert f"{section} (1)" in msg and key in msg


@pytest.mark.parametrize("rel", ["talker/model.safetensors", "talker/vae/model.safetensors"])
def test_talker_and_vae_files_are_strict(ckpt, rel):
    """A key removed from the talker / VAE file is named, with the file it belongs to."""
    path = ckpt / rel
    key = min(load_file(str(path)))
    _edit_file(path, lambda t: t.pop(key))
    msg = _load_error(ckpt)
    assert key in msg and str(path) in msg


def test_config_unknown_field(ckpt):
    """An unknown config field is named by its dotted path."""
    _edit_json(ckpt / "config.json", lambda d: d["llm_config"].update(bogus_field=1))
    assert "config.json.llm_config.bogus_field: unknown field" in _config_error(ckpt)


def test_config_missing_required_field(ckpt):
    """A missing required field is named; several problems of one file come in one error."""
    def edit(d):
        del d["llm_config"]["hidden_size"]
        d["llm_config"]["bogus_field"] = 1

    _edit_json(ckpt / "config.json", edit)
    msg = _config_error(ckpt)
    assert "config.json.llm_config.hidden_size: required field missing" in msg
    assert "config.json.llm_config.bogus_field: unknown field" in msg


def test_config_missing_talker_field(ckpt):
    """Talker LM config problems name their file."""
    _edit_json(ckpt / "talker" / "llm" / "config.json", lambda d: d.pop("num_hidden_layers"))
    assert "talker/llm/config.json.num_hidden_layers: required field missing" in _config_error(ckpt)


def test_config_malformed_json(ckpt):
    """A config file that is not valid JSON is reported with its path."""
    path = ckpt / "talker" / "vae" / "config.json"
    path.write_text(path.read_text()[:-5])
    msg = _config_error(ckpt)
    assert "cannot read" in msg and str(path) in msg


def test_config_missing_file(ckpt):
    """A missing config file is reported with its path."""
    path = ckpt / "talker" / "config.json"
    path.unlink()
    assert f"missing checkpoint file: {path}" in _config_error(ckpt)


# ---- dtype ---------------------------------------------------------------------------------------


class _AllocationLog(TorchDispatchMode):
    """Counts the elements of every non-meta floating tensor each op creates, by dtype."""

    def __init__(self):
        super().__init__()
        self.numel: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.is_meta:
                self.numel[t.dtype] = self.numel.get(t.dtype, 0) + t.numel()
        return out


def test_materialize_allocates_in_target_dtype(fixture_root):
    """Materialising for bf16 never creates fp32 parameter storage (only small fp32 buffer tables)."""
    with torch.device("meta"):
        ming = MingOmni(load_checkpoint_config(fixture_root).ming)
    params = sum(p.numel() for p in ming.parameters())
    log = _AllocationLog()
    with log:
        materialize(ming, "cpu", torch.bfloat16)
    assert log.numel.get(torch.bfloat16, 0) >= params
    assert log.numel.get(torch.float32, 0) < params // 20


def test_bf16_load_is_checkpoint_rounded(fixture_root):
    """load_ming(dtype=bf16): every floating tensor is bf16 and equals the stored value rounded to bf16."""
    ming = load_ming(fixture_root, dtype=torch.bfloat16)
    state = ming.state_dict()
    assert all(t.dtype == torch.bfloat16 for t in state.values() if t.is_floating_point())
    for key in ("model.lm_head.weight", "vision.patch_embed.proj.weight", "audio.positional_embedding"):
        assert torch.equal(state[key], _stored(fixture_root, key).to(torch.bfloat16))
    expert = _some_key(fixture_root, "model.model.layers.", ".experts.0.down_proj")
    stacked = state[expert.replace(".experts.0.down_proj.weight", ".experts_down")][0]
    assert torch.equal(stacked, _stored(fixture_root, expert).to(torch.bfloat16))


# ---- tensor parallelism ------------------------------------------------------------------------


def test_narrow_for_rank_splits_each_fused_part():
    """A fused [Q | K | V] tensor gives each rank its slice of every part, concatenated in order."""
    q, kv, cols = 8, 4, 3
    fused = torch.arange((q + 2 * kv) * cols, dtype=torch.float32).view(q + 2 * kv, cols)
    parts = fused.split([q, kv, kv])
    for rank in range(2):
        got = narrow_for_rank(fused, 0, (q, kv, kv), TPGroup(rank, 2))
        want = torch.cat([p.chunk(2)[rank] for p in parts])
        assert torch.equal(got, want)
    assert torch.equal(narrow_for_rank(fused, 1, None, TPGroup(1, 3)), fused[:, 1:2])
    assert narrow_for_rank(fused, 0, (q, kv, kv), TPGroup()) is fused


def test_narrow_for_rank_reads_only_the_slice(fixture_root):
    """Through a TensorSource the rank's part equals the same slice of the full stored tensor."""
    key = "model.model.layers.0.attention.query_key_value.weight"
    with safe_open(str(_shard_of(fixture_root, key)), framework="pt") as f:
        src = TensorSource(f, key)
        full = src.full()
        got = narrow_for_rank(src, 1, None, TPGroup(1, 2))
    assert torch.equal(got, full[:, full.shape[1] // 2:])


@pytest.mark.parametrize("rank", [0, 1])
def test_tp2_load_narrows_thinker(fixture_root, rank):
    """Rank r of 2 holds half of every Q/K/V part, half the dense input columns, half of each expert."""
    ming = load_ming(fixture_root, tp=TPGroup(rank, 2))
    cfg = ming.cfg.llm_config
    hd = cfg.resolved_head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    stored = lambda key: _stored(fixture_root, key)  # noqa: E731
    attn = ming.model.model.layers[0].attention
    full = stored("model.model.layers.0.attention.query_key_value.weight")
    half = lambda t, dim=0: t.chunk(2, dim=dim)[rank]  # noqa: E731
    kv_heads = cfg.num_key_value_heads
    # fewer KV heads than ranks: each rank holds the one its query heads use (replicated)
    kv_part = (lambda t: t.chunk(kv_heads)[rank * kv_heads // 2]) if kv_heads < 2 else half  # noqa: E731
    qs, ks, vs = full.split([q, kv, kv])
    want = torch.cat([half(qs), kv_part(ks), kv_part(vs)])
    assert torch.equal(attn.query_key_value.weight, want)
    assert torch.equal(attn.dense.weight, half(stored("model.model.layers.0.attention.dense.weight"), 1))
    assert attn.num_heads == cfg.num_attention_heads // 2 and attn.num_kv == max(1, kv_heads // 2)
    mlp = ming.model.model.layers[cfg.first_k_dense_replace].mlp
    expert = cfg.num_experts - 1
    base = f"model.model.layers.{cfg.first_k_dense_replace}.mlp.experts.{expert}."
    i = cfg.moe_intermediate_size // 2
    assert torch.equal(mlp.experts_gate_up[expert, :i], half(stored(base + "gate_proj.weight")))
    assert torch.equal(mlp.experts_gate_up[expert, i:], half(stored(base + "up_proj.weight")))
    assert torch.equal(mlp.experts_down[expert], half(stored(base + "down_proj.weight"), 1))
    assert torch.equal(ming.vision.blocks[0].attn.qkv.weight, stored("vision.blocks.0.attn.qkv.weight"))


# ---- dummy weights -----------------------------------------------------------------------------


def _floats(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in module.state_dict().items() if v.is_floating_point()}


def test_dummy_is_deterministic_per_seed(fixture_root):
    """Same seed -> identical weights (whatever the global RNG did); another seed -> every parameter differs."""
    cfg = load_checkpoint_config(fixture_root).ming
    torch.manual_seed(1)
    a = _floats(build_ming(cfg, seed=7))
    torch.manual_seed(2)
    torch.rand(100)
    b = _floats(build_ming(cfg, seed=7))
    c = dict(build_ming(cfg, seed=8).named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(not torch.equal(a[k], p) for k, p in c.items())


def test_dummy_is_independent_of_construction_order():
    """Parameters with the same names get the same values whatever order the modules were built in."""

    class Net(nn.Module):
        def __init__(self, order):
            super().__init__()
            for name in order:
                self.add_module(name, nn.Linear(4, 6))

    with torch.device("meta"):
        first, second = Net(["up", "down", "norm"]), Net(["norm", "down", "up"])
    init_dummy(first, seed=3)
    init_dummy(second, seed=3)
    assert list(first.state_dict()) != list(second.state_dict())
    assert all(torch.equal(v, second.state_dict()[k]) for k, v in first.state_dict().items())


def test_dummy_load_all_tiny_preset_runs():
    """The tiny preset with dummy weights builds every part and the thinker produces finite logits."""
    stages = []
    models = load_all(preset="tiny", weights="dummy", progress=lambda s, d, t: stages.append((s, d, t)))
    assert stages == [(p, 1, 1) for p in PARTS]
    thinker = models.ming.model
    ids = torch.tensor([[1, 2, 3]])
    pos = torch.arange(3).expand(3, 1, 3)
    with torch.no_grad():
        logits = thinker.logits(thinker(thinker.embed(ids), pos))
    assert logits.shape == (1, 3, models.config.thinker.vocab_size) and torch.isfinite(logits).all()


def test_build_ming_meta_and_bad_weights(fixture_root):
    """weights="meta" leaves every tensor on meta; an unknown mode is a ValueError."""
    cfg = load_checkpoint_config(fixture_root).ming
    assert all(t.is_meta for t in build_ming(cfg, weights="meta").state_dict().values())
    with pytest.raises(ValueError, match="weights"):
        build_ming(cfg, weights="zeros")
