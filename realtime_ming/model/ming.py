"""The root checkpoint module of Ming-flash-omni-2.0 and one call that loads every model part.

`MingOmni` holds the weights of [MING] `BailingMM2NativeForConditionalGeneration` under the root
`model.safetensors` shards (docs/model.md §1.7, §2.2–2.3, §3.3–3.5, §8): `model` (thinker),
`vision`, `linear_proj`, `audio`, `linear_proj_audio`. `load_all` returns it together with the
talker (`talker/model.safetensors`, §5.12), the AudioVAE (`talker/vae/model.safetensors`, §6.5)
and the parsed configs, from a checkpoint folder or a named preset, with real or dummy weights.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .audio_encoder import (
    AudioProjector,
    WhisperEncoder,
    WrappedAudioEmbeddings,
    encode_wrapped,
)
from .config import CheckpointConfig, ConfigError, MingConfig, load_checkpoint_config
from .kernels.selection import REFERENCE, Kernels
from .layers import SINGLE, TPGroup
from .loader import init_dummy, load_weights, materialize, read_weight_map
from .presets import preset_config
from .talker import Talker
from .thinker import Thinker
from .vae import AudioVAE
from .vision import VisionProjector, VisionTransformer

__all__ = ["PARTS", "MingModels", "MingOmni", "Progress", "build_ming", "load_all", "load_ming"]

Progress = Callable[[str, int, int], None]  # (stage, done, total); stages "ming", "talker", "vae"

PARTS = ("ming", "talker", "vae")  # what load_all can load; also the progress stage names
_THINKER = "model."
_STACKED = re.compile(r"^model\.model\.layers\.(\d+)\.mlp\.(experts_gate_up|experts_down)$")
_ENCODERS = ("vision", "linear_proj", "audio", "linear_proj_audio")


class MingOmni(nn.Module):
    """Root `model.safetensors` weights: `model` (Thinker), `vision` + `linear_proj`, `audio` + `linear_proj_audio`.

    Only the thinker is tensor-parallel (`tp`); the encoders are replicated. No forward: the
    engine calls the parts (`model` per step, `image_embeds` / `audio_embeds` at prefill). `kernels`
    (default: the reference PyTorch ops) selects the thinker's Triton kernels; `expert_dtype` "fp8" stores the
    thinker's routed experts in e4m3, quantised while they load.
    """

    def __init__(self, cfg: MingConfig, tp: TPGroup = SINGLE, *, kernels: Kernels = REFERENCE,
                 expert_dtype: str = "model"):
        super().__init__()
        self.cfg, self.tp, self.kernels = cfg, tp, kernels
        hidden = cfg.llm_config.hidden_size
        self.model = Thinker(cfg.llm_config, tp, kernels=kernels, expert_dtype=expert_dtype)
        self.vision = VisionTransformer(cfg.vision_config)
        self.linear_proj = VisionProjector(cfg.vision_config, hidden)
        self.audio = WhisperEncoder(cfg.audio_config)
        self.linear_proj_audio = AudioProjector(cfg.audio_config, hidden)

    @staticmethod
    def checkpoint_key_map(key: str) -> tuple[str | None, object]:
        """Root checkpoint key -> (parameter name, shard id): `model.*` through the thinker's map."""
        if not key.startswith(_THINKER):
            return key, None
        target, shard = Thinker.checkpoint_key_map(key[len(_THINKER):])
        return (None if target is None else _THINKER + target), shard

    @staticmethod
    def checkpoint_sources(name: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]] | None:
        """Checkpoint keys (and shapes) filling the stacked expert parameter `name`; None = the name itself.

        experts_gate_up [E, 2I, D] <- experts.e.{gate,up}_proj.weight [I, D];
        experts_down [E, D, I] <- experts.e.down_proj.weight [D, I] (the inverse of `checkpoint_key_map`).
        """
        m = _STACKED.match(name)
        if m is None:
            return None
        base = f"model.model.layers.{m.group(1)}.mlp.experts."
        if m.group(2) == "experts_down":
            return {f"{base}{e}.down_proj.weight": tuple(shape[1:]) for e in range(shape[0])}
        part = (shape[1] // 2, shape[2])
        return {f"{base}{e}.{proj}.weight": part for e in range(shape[0]) for proj in ("gate_proj", "up_proj")}

    def image_embeds(self, pixel_values: torch.Tensor, grid_thw) -> torch.Tensor:
        """pixel_values [N, C·T·P·P] with grids [n, 3] -> unit-norm image embeddings [N/merge², hidden]."""
        return self.linear_proj(self.vision(pixel_values, grid_thw))

    def audio_embeds(self, feats: torch.Tensor, lengths: torch.Tensor, *,
                     per_clip: bool = False) -> WrappedAudioEmbeddings:
        """Wrapped mel features [B, ΣT, n_mels] with clip lengths [B, N] -> unit-norm audio embeddings."""
        return encode_wrapped(self.audio, self.linear_proj_audio, feats, lengths, per_clip=per_clip)


def _place(ming: MingOmni, device, encoder_device, dtype: torch.dtype) -> None:
    """Materialise the thinker on `device` and the encoders on `encoder_device` (both in `dtype`)."""
    materialize(ming.model, device, dtype)
    for name in _ENCODERS:
        materialize(getattr(ming, name), encoder_device if encoder_device is not None else device, dtype)


def load_ming(checkpoint_dir: str | Path, *, dtype: torch.dtype = torch.float32, device="cpu",
              tp: TPGroup = SINGLE, encoder_device=None,
              progress: Callable[[int, int], None] | None = None, kernels: Kernels = REFERENCE,
              expert_dtype: str = "model") -> MingOmni:
    """Build the root on meta and strictly load every root shard (via the index) straight into `dtype`.

    `encoder_device` (default `device`) holds vision/audio and their projectors; the thinker is
    narrowed to `tp`'s rank. `progress(done, total)` is called per tensor. Raises ConfigError or
    LoadError (every missing/unexpected key and shape mismatch in one message).
    """
    cfg = load_checkpoint_config(checkpoint_dir).ming
    with torch.device("meta"):
        ming = MingOmni(cfg, tp, kernels=kernels, expert_dtype=expert_dtype)
    _place(ming, device, encoder_device, dtype)
    load_weights(ming, read_weight_map(checkpoint_dir), device=device, dtype=dtype, tp=tp,
                 what="Ming root checkpoint (model.safetensors)", progress=progress)
    return ming.eval()


def _part_seed(seed: int, part: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(part.encode())) % (2**31)


def build_ming(cfg: MingConfig, *, weights: str = "dummy", seed: int = 0, dtype: torch.dtype = torch.float32,
               device="cpu", tp: TPGroup = SINGLE, encoder_device=None, kernels: Kernels = REFERENCE,
               expert_dtype: str = "model") -> MingOmni:
    """The root module without a checkpoint: `weights="dummy"` (seeded random, on the device) or "meta".

    Dummy values depend only on (seed, part, parameter name), never on construction order.
    """
    if weights not in ("dummy", "meta"):
        raise ValueError(f"weights must be 'dummy' or 'meta', got {weights!r}")
    with torch.device("meta"):
        ming = MingOmni(cfg, tp, kernels=kernels, expert_dtype=expert_dtype)
    if weights == "meta":
        return ming.eval()
    for name in ("model",) + _ENCODERS:
        part_device = device if name == "model" or encoder_device is None else encoder_device
        init_dummy(getattr(ming, name), seed=_part_seed(seed, name), device=part_device, dtype=dtype)
    return ming.eval()


@dataclass
class MingModels:
    """Everything `load_all` produced: configs and the three checkpoint roots (None when not requested)."""

    config: CheckpointConfig
    ming: MingOmni | None
    talker: Talker | None
    vae: AudioVAE | None


def _resolve_config(checkpoint_dir, preset) -> CheckpointConfig:
    if checkpoint_dir is not None:
        if preset is not None:
            raise ValueError("give either checkpoint_dir or preset, not both")
        return load_checkpoint_config(checkpoint_dir)
    if preset is None:
        raise ValueError("give checkpoint_dir or preset")
    if isinstance(preset, CheckpointConfig):
        return preset
    if preset == "tiny":
        from .tiny_tokenizer import (
            TINY_VOCAB_SIZE,
            tiny_talker_special_ids,
            tiny_thinker_special_ids,
        )

        return preset_config("tiny", thinker_ids=tiny_thinker_special_ids(), talker_ids=tiny_talker_special_ids(),
                             vocab=TINY_VOCAB_SIZE)
    return preset_config(preset)


def _load_file_root(module: nn.Module, path: Path, stage: str, *, device, dtype, progress: Progress | None):
    cb = (lambda done, total: progress(stage, done, total)) if progress else None
    return load_weights(module, read_weight_map(path), device=device, dtype=dtype, what=str(path), progress=cb)


def load_all(
    checkpoint_dir: str | Path | None = None,
    preset: str | CheckpointConfig | None = None,
    *,
    weights: str = "checkpoint",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    devices: Mapping[str, torch.device | str] | None = None,
    tp: TPGroup = SINGLE,
    seed: int = 0,
    parts: Collection[str] = PARTS,
    progress: Progress | None = None,
    kernels: Kernels = REFERENCE,
    expert_dtype: str = "model",
) -> MingModels:
    """Load (or dummy-initialise) the root model, the talker and the AudioVAE, all in eval mode.

    checkpoint_dir: a Ming-flash-omni-2.0 folder (configs from its files); or `preset`: "tiny",
        "ming-flash-omni-2.0" or a CheckpointConfig (then `weights` must be "dummy").
    weights: "checkpoint" (strict load of model.safetensors shards via the index,
        talker/model.safetensors and talker/vae/model.safetensors) or "dummy" (seeded random, `seed`).
    dtype: every floating tensor's dtype, loaded straight into it (the release is bfloat16).
    device: default device; `devices` may override it per part: "thinker", "encoders", "talker", "vae".
    tp: tensor-parallel placement of the thinker (encoders, talker and VAE are not split).
    parts: which of "ming", "talker", "vae" to load; the others are None (e.g. on TP ranks > 0).
    progress(stage, done, total): stage in PARTS; called per tensor when loading and once per part
        (done == total == 1) for dummy weights.
    kernels: the Triton kernels the thinker, talker and AudioVAE run (`kernels.TRITON`); default the
        reference PyTorch ops.
    expert_dtype: "fp8" stores the thinker's routed experts in e4m3 (quantised while loading), "model" in
        `dtype`.
    Raises ConfigError (config files) or LoadError (weights) naming every problem; ValueError for
    bad arguments.
    """
    if weights not in ("checkpoint", "dummy"):
        raise ValueError(f"weights must be 'checkpoint' or 'dummy', got {weights!r}")
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; known: {', '.join(PARTS)}")
    cfg = _resolve_config(checkpoint_dir, preset)
    if weights == "checkpoint" and checkpoint_dir is None:
        raise ValueError("weights='checkpoint' needs checkpoint_dir (presets have no weights)")
    if cfg.talker.llm is None:
        raise ConfigError("talker/llm/config.json is required")
    place = {"thinker": device, "encoders": device, "talker": device, "vae": device, **(devices or {})}
    bad = set(place) - {"thinker", "encoders", "talker", "vae"}
    if bad:
        raise ValueError(f"unknown device keys {sorted(bad)}; known: thinker, encoders, talker, vae")
    folder = Path(checkpoint_dir) if checkpoint_dir is not None else None
    ming = talker = vae = None
    if "ming" in parts:
        if weights == "checkpoint":
            cb = (lambda done, total: progress("ming", done, total)) if progress else None
            ming = load_ming(folder, dtype=dtype, device=place["thinker"], tp=tp, encoder_device=place["encoders"],
                             progress=cb, kernels=kernels, expert_dtype=expert_dtype)
        else:
            ming = build_ming(cfg.ming, seed=seed, dtype=dtype, device=place["thinker"], tp=tp,
                              encoder_device=place["encoders"], kernels=kernels, expert_dtype=expert_dtype)
            if progress:
                progress("ming", 1, 1)
    for stage, cls, part_cfg, rel in (("talker", Talker, cfg.talker, Path("talker", "model.safetensors")),
                                      ("vae", AudioVAE, cfg.vae, Path("talker", "vae", "model.safetensors"))):
        if stage not in parts:
            continue
        with torch.device("meta"):
            module = cls(part_cfg, kernels=kernels)
        if weights == "checkpoint":
            _load_file_root(module, folder / rel, stage, device=place[stage], dtype=dtype, progress=progress)
        else:
            init_dummy(module, seed=_part_seed(seed, stage), device=place[stage], dtype=dtype)
            if progress:
                progress(stage, 1, 1)
        if stage == "talker":
            talker = module.eval()
        else:
            vae = module.eval()
    return MingModels(cfg, ming, talker, vae)
