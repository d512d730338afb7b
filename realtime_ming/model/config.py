"""Model configuration: the checkpoint's own config files parsed into frozen dataclasses.

Reads the real Ming-flash-omni-2.0 layout (docs/model.md §1.1, §5.2, §6.1, §8): root
`config.json` (llm/audio/vision), `talker/config.json`, `talker/llm/config.json`,
`talker/vae/config.json`, `talker/data/voice_name.json`, `preprocessor_config.json`.
Field names are the checkpoint's. Unknown fields and missing required fields raise one
`ConfigError` naming every offending dotted path. Named presets are data (`PRESETS`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = [
    "ConfigError",
    "ThinkerConfig",
    "AudioEncoderConfig",
    "VisionConfig",
    "MingConfig",
    "Qwen2Config",
    "DiTConfig",
    "TalkerConfig",
    "VAEEncoderConfig",
    "VAEDecoderConfig",
    "VAEConfig",
    "PreprocessorConfig",
    "VoicePreset",
    "CheckpointConfig",
    "load_checkpoint_config",
    "parse",
]


class ConfigError(ValueError):
    """A checkpoint config file is missing, unreadable, or has unknown/missing fields."""


# Attributes every transformers `PretrainedConfig` serialises; they carry no model meaning here.
_HF_GENERIC = frozenset(
    """_name_or_path add_cross_attention architectures auto_map bad_words_ids begin_suppress_tokens
    bos_token_id chunk_size_feed_forward cross_attention_hidden_size decoder_start_token_id
    diversity_penalty do_sample early_stopping encoder_no_repeat_ngram_size eos_token_id
    exponential_decay_length_penalty finetuning_task forced_bos_token_id forced_eos_token_id id2label
    is_decoder is_encoder_decoder label2id length_penalty max_length min_length model_type
    no_repeat_ngram_size num_beam_groups num_beams num_return_sequences output_attentions
    output_hidden_states output_scores pad_token_id prefix problem_type pruned_heads
    remove_invalid_values repetition_penalty return_dict return_dict_in_generate sep_token_id
    suppress_tokens task_specific_params temperature tf_legacy_loss tie_encoder_decoder
    tie_word_embeddings tokenizer_class top_k top_p torch_dtype dtype torchscript typical_p
    use_bfloat16 transformers_version initializer_range _attn_implementation_autoset
    _attn_implementation use_cache attention_dropout""".split()
)


def parse(cls: type, data: Mapping[str, Any], path: str, ignore: frozenset[str] = frozenset()):
    """Build dataclass `cls` from `data`; raise ConfigError listing unknown and missing fields.

    Nested dataclass fields are parsed recursively when the field's metadata names a `parser`.
    Keys in `_HF_GENERIC` or `ignore` are accepted and dropped unless `cls` declares them.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields and k not in _HF_GENERIC and k not in ignore]
    missing = [
        n for n, f in fields.items()
        if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    problems = [f"{path}.{k}: unknown field" for k in unknown]
    problems += [f"{path}.{k}: required field missing" for k in missing]
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        value = data[name]
        sub = f.metadata.get("parser")
        kwargs[name] = sub(value, f"{path}.{name}") if sub is not None else value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _nested(cls: type, ignore: frozenset[str] = frozenset()):
    return field(metadata={"parser": lambda v, p: parse(cls, v, p, ignore)})


@dataclass(frozen=True, slots=True)
class ThinkerConfig:
    """`llm_config` of the root config.json: BailingMoeV2 (docs/model.md §1.1)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    num_shared_experts: int
    first_k_dense_replace: int
    n_group: int
    topk_group: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    eos_token_id: int
    pad_token_id: int
    image_patch_token: int
    video_patch_token: int
    image_start_token: int
    video_start_token: int
    head_dim: int | None = None  # absent in the real config -> hidden_size // num_attention_heads
    rope_scaling: dict | None = None
    router_type: str = "MultiRouter"
    # Not in the json; the official code reads this name (class default 2.5). The json's
    # `moe_router_topk_scaling_factor` is NOT read by the reference (fixtures README).
    routed_scaling_factor: float = 2.5
    moe_router_topk_scaling_factor: float | None = None
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    use_qkv_bias: bool = False
    use_bias: bool = False
    use_qk_norm: bool = True
    use_expert_bias: bool = True
    norm_topk_prob: bool = True
    use_interleaved_frame_timestamp: bool = True
    output_router_logits: bool = False
    norm_head: bool = False
    norm_softmax: bool = False
    embedding_dropout: float = 0.0
    output_dropout: float = 0.0
    pretraining_tp: int = 1
    # Not in the config: resolved from the tokenizer (docs/model.md §1.1); real id 157168.
    audio_patch_token: int | None = None

    def __post_init__(self):
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} unsupported (only 'silu')")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.num_experts % self.n_group:
            raise ValueError("num_experts must be a multiple of n_group")
        if self.router_type not in ("MultiRouter", "TopkRouter"):
            raise ValueError(f"router_type {self.router_type!r} unsupported")
        if self.resolved_head_dim != 128:
            # the attention hard-codes mrope_section [8, 12, 12] (fixtures README)
            raise ValueError("head_dim must be 128 (video_rope mrope_section is fixed)")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.resolved_head_dim * self.partial_rotary_factor)

    @property
    def is_video_rope(self) -> bool:
        return bool(self.rope_scaling) and self.rope_scaling.get("type") == "video_rope"

    @property
    def is_multi_router(self) -> bool:
        return self.router_type == "MultiRouter"


@dataclass(frozen=True, slots=True)
class WhisperEncoderConfig:
    n_mels: int
    n_ctx: int
    n_state: int
    n_head: int
    n_layer: int


@dataclass(frozen=True, slots=True)
class AudioEncoderConfig:
    """`audio_config`: Whisper-style encoder + projector settings (docs/model.md §2)."""

    whisper_encoder_config: WhisperEncoderConfig = _nested(WhisperEncoderConfig)
    ds_kernel_size: int = 3
    ds_stride: int = 2
    norm_query_embeds: bool = True


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """`vision_config`: Qwen3-VL-MoE-style ViT (docs/model.md §3.1)."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: list = field(default_factory=list)
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"

    def __post_init__(self):
        side = int(round(self.num_position_embeddings ** 0.5))
        if side * side != self.num_position_embeddings:
            raise ValueError("num_position_embeddings must be a square")


@dataclass(frozen=True, slots=True)
class MingConfig:
    """Root `config.json` (BailingMM2NativeForConditionalGeneration)."""

    llm_config: ThinkerConfig = _nested(ThinkerConfig)
    audio_config: AudioEncoderConfig = _nested(AudioEncoderConfig)
    vision_config: VisionConfig = _nested(VisionConfig)
    mlp_depth: int = 2

    def __post_init__(self):
        if self.mlp_depth != 2:
            raise ValueError("mlp_depth must be 2 (the released projector layout)")

    @property
    def thinker(self) -> ThinkerConfig:
        return self.llm_config


@dataclass(frozen=True, slots=True)
class Qwen2Config:
    """A Qwen2 config: the talker LM (`talker/llm/config.json`) and the VAE backbones."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int = 0
    hidden_act: str = "silu"
    head_dim: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self):
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} unsupported (only 'silu')")
        if self.use_sliding_window and not self.sliding_window:
            raise ValueError("use_sliding_window requires sliding_window")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def layer_window(self, layer: int) -> int | None:
        """Sliding window of `layer` (HF Qwen2: layers >= max_window_layers slide), else None."""
        if self.use_sliding_window and layer >= self.max_window_layers:
            return self.sliding_window
        return None


@dataclass(frozen=True, slots=True)
class DiTConfig:
    """`flowmodel` / `aggregator` of `talker/config.json` (docs/model.md §5.2, §5.5, §5.7)."""

    hidden_size: int
    depth: int
    num_heads: int
    in_channels: int = 64
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    qk_norm: Any = None
    pe_attn_head: Any = None
    attn_mask_enabled: bool = False
    attn_backend: str = "flash_attn"  # "flash_attn" and "torch" are the same math here
    llm_cond_dim: int = 896  # DiT default when absent (fixtures README)

    def __post_init__(self):
        if self.qk_norm not in (None, False):
            raise ValueError("qk_norm is not supported (the released talker has none)")
        if self.attn_mask_enabled:
            raise ValueError("attn_mask_enabled is not supported (never used by the reference)")


@dataclass(frozen=True, slots=True)
class TalkerConfig:
    """`talker/config.json` + `talker/llm/config.json`."""

    flowmodel: DiTConfig = _nested(DiTConfig)
    aggregator: DiTConfig = _nested(DiTConfig)
    steps: int = 10
    patch_size: int = 4
    history_patch_size: int = 32
    # informational in the reference (fixtures README): read but unused
    latent_dim: int = 64
    spk_dim: int = 192
    cfg_strength: float = 2.0
    llm: Qwen2Config | None = None


@dataclass(frozen=True, slots=True)
class VAEEncoderConfig:
    input_dim: int
    hop_size: int
    latent_dim: int
    backbone: Qwen2Config = _nested(Qwen2Config)


@dataclass(frozen=True, slots=True)
class VAEDecoderConfig:
    output_dim: int
    latent_dim: int
    backbone: Qwen2Config = _nested(Qwen2Config)


_VAE_TRAINING_ONLY = frozenset(
    {"hifi_gan_disc_kwargs", "spec_disc_kwargs", "semantic_module_kwargs"}
)


@dataclass(frozen=True, slots=True)
class VAEConfig:
    """`talker/vae/config.json` (docs/model.md §6.1)."""

    enc_kwargs: VAEEncoderConfig = _nested(VAEEncoderConfig)
    dec_kwargs: VAEDecoderConfig = _nested(VAEDecoderConfig)
    sample_rate: int = 44100
    patch_size: int = 4
    init_method: str = "kaiming"

    @property
    def hop_size(self) -> int:
        return self.dec_kwargs.output_dim

    @property
    def samples_per_latent(self) -> int:
        return self.dec_kwargs.output_dim * self.patch_size


@dataclass(frozen=True, slots=True)
class PreprocessorConfig:
    """`preprocessor_config.json` (docs/model.md §3.2): only the fields we use are typed."""

    min_pixels: int = 4096
    max_pixels: int = 16777216
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple = (0.26862954, 0.26130258, 0.27577711)
    sampling_rate: int = 16000
    use_interleaved_frame_timestamp: bool = True


_PREPROCESSOR_IGNORED = frozenset(
    """auto_map image_token video_token image_processor_type feature_extractor_type audio_token
    chunk_length dither feature_size frame_length frame_shift inverse_norm lfr_m lfr_n n_samples
    num_audio_tokens up_sample return_attention_mask padding_side padding_value processor_class
    wav_frontend_args whisper_frontend_args""".split()
)


@dataclass(frozen=True, slots=True)
class VoicePreset:
    """One entry of `talker/data/voice_name.json`; `prompt_wav_path` resolved against talker/."""

    name: str
    prompt_text: str
    prompt_wav_path: Path | None


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """Everything the model needs from a checkpoint folder (or a preset)."""

    root: Path | None
    ming: MingConfig
    talker: TalkerConfig
    vae: VAEConfig
    preprocessor: PreprocessorConfig
    voices: dict

    @property
    def thinker(self) -> ThinkerConfig:
        return self.ming.llm_config


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"missing checkpoint file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def _parse_voices(data: Any, talker_dir: Path | None, path: str) -> dict:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected an object mapping voice name -> preset")
    voices = {}
    for name, entry in data.items():
        if not isinstance(entry, Mapping) or "prompt_text" not in entry:
            raise ConfigError(f"{path}.{name}: needs prompt_text (and prompt_wav_path)")
        wav = entry.get("prompt_wav_path")
        wav_path = None
        if wav:
            wav_path = Path(wav) if Path(wav).is_absolute() or talker_dir is None else talker_dir / wav
        voices[name] = VoicePreset(name, str(entry["prompt_text"]), wav_path)
    return voices


def parse_talker(talker: Mapping, llm: Mapping, path: str = "talker") -> TalkerConfig:
    cfg = parse(TalkerConfig, talker, f"{path}/config.json", ignore=frozenset({"torch_dtype"}))
    llm_cfg = parse(Qwen2Config, llm, f"{path}/llm/config.json")
    return dataclasses.replace(cfg, llm=llm_cfg)


def config_from_dicts(
    root: Mapping,
    talker: Mapping,
    talker_llm: Mapping,
    vae: Mapping,
    preprocessor: Mapping | None = None,
    voices: Mapping | None = None,
    folder: Path | None = None,
) -> CheckpointConfig:
    """Assemble a CheckpointConfig from already-loaded JSON objects (presets, tests)."""
    ming = parse(MingConfig, root, "config.json")
    talker_cfg = parse_talker(talker, talker_llm)
    vae = {k: v for k, v in vae.items() if not k.startswith("lambda_")}
    vae_cfg = parse(VAEConfig, vae, "talker/vae/config.json", ignore=_VAE_TRAINING_ONLY)
    pre = parse(PreprocessorConfig, preprocessor or {}, "preprocessor_config.json", _PREPROCESSOR_IGNORED)
    talker_dir = folder / "talker" if folder is not None else None
    voice_map = _parse_voices(voices or {}, talker_dir, "talker/data/voice_name.json")
    return CheckpointConfig(folder, ming, talker_cfg, vae_cfg, pre, voice_map)


def load_checkpoint_config(folder: str | Path) -> CheckpointConfig:
    """Parse every config file of a Ming-flash-omni-2.0 checkpoint folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"checkpoint folder not found: {folder}")
    pre_path = folder / "preprocessor_config.json"
    voices_path = folder / "talker" / "data" / "voice_name.json"
    return config_from_dicts(
        _read_json(folder / "config.json"),
        _read_json(folder / "talker" / "config.json"),
        _read_json(folder / "talker" / "llm" / "config.json"),
        _read_json(folder / "talker" / "vae" / "config.json"),
        _read_json(pre_path) if pre_path.exists() else {},
        _read_json(voices_path) if voices_path.exists() else {},
        folder,
    )
