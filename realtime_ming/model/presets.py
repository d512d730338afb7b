"""Named model configurations as data (gpt-fast `transformer_configs` style).

* `ming-flash-omni-2.0`: the real shapes (root config.json of the release; talker/VAE configs as
  documented in `assets/presets/ming-flash-omni-2.0/NOTES.md`), for `dummy`-weight benchmarks.
* `tiny`: the embedded CPU default — fixture-sized dims, its own byte-level tokenizers, random
  weights. Its output is not meaningful speech.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .config import CheckpointConfig, config_from_dicts, load_checkpoint_config

__all__ = ["PRESETS", "preset_config", "preset_dir", "tiny_config"]

PRESETS = ("tiny", "ming-flash-omni-2.0")


def preset_dir(name: str) -> Path:
    return Path(str(resources.files("realtime_ming") / "assets" / "presets" / name))


def _tiny_dicts(thinker_ids: dict, talker_ids: dict, vocab: int) -> tuple[dict, dict, dict, dict]:
    llm = {
        "vocab_size": vocab, "hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_experts": 16, "num_experts_per_tok": 4, "num_shared_experts": 1, "first_k_dense_replace": 1,
        "n_group": 4, "topk_group": 2, "rms_norm_eps": 1e-6, "rope_theta": 2400000, "partial_rotary_factor": 0.5,
        "rope_scaling": {"factor": None, "type": "video_rope"}, "router_type": "MultiRouter",
        "eos_token_id": thinker_ids["<|role_end|>"], "pad_token_id": thinker_ids["<|endoftext|>"],
        "image_patch_token": thinker_ids["<imagePatch>"], "video_patch_token": thinker_ids["<framePatch>"],
        "image_start_token": thinker_ids["<image>"], "video_start_token": thinker_ids["</image>"],
        "audio_patch_token": thinker_ids["<audioPatch>"],
    }
    root = {
        "llm_config": llm,
        "audio_config": {"whisper_encoder_config": {"n_mels": 128, "n_ctx": 1500, "n_state": 64, "n_head": 4, "n_layer": 2}},
        "vision_config": {"depth": 2, "hidden_size": 64, "num_heads": 4, "intermediate_size": 96, "out_hidden_size": 96,
                          "num_position_embeddings": 64, "deepstack_visual_indexes": [1]},
        "mlp_depth": 2,
    }
    dit = {"hidden_size": 64, "depth": 2, "num_heads": 4, "in_channels": 64, "mlp_ratio": 4, "llm_cond_dim": 64}
    talker = {"steps": 10, "patch_size": 4, "history_patch_size": 32, "flowmodel": dit,
              "aggregator": {**dit, "hidden_size": 48}}
    talker_llm = {"vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
                  "bos_token_id": talker_ids["<|endoftext|>"], "eos_token_id": talker_ids["<|im_end|>"]}
    backbone = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "use_sliding_window": True, "sliding_window": 20, "max_window_layers": 0}
    vae = {"enc_kwargs": {"input_dim": 882, "hop_size": 882, "latent_dim": 64,
                          "backbone": {**backbone, "num_hidden_layers": 4}},
           "dec_kwargs": {"output_dim": 882, "latent_dim": 64, "backbone": {**backbone, "num_hidden_layers": 2}}}
    return root, talker, talker_llm, vae


def tiny_config(thinker_ids: dict, talker_ids: dict, vocab: int = 512) -> CheckpointConfig:
    """The embedded default's config, with special-token ids taken from its tokenizers."""
    root, talker, talker_llm, vae = _tiny_dicts(thinker_ids, talker_ids, vocab)
    return config_from_dicts(root, talker, talker_llm, vae, {}, {"tiny": {"prompt_text": ""}})


def preset_config(name: str, **kwargs) -> CheckpointConfig:
    """Config of a named preset (`tiny` needs the tokenizer ids: see `tiny_config`)."""
    if name == "tiny":
        return tiny_config(**kwargs)
    if name == "ming-flash-omni-2.0":
        return load_checkpoint_config(preset_dir(name))
    raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
