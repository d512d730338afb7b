"""Checkpoint configs (model/config.py) and presets (model/presets.py) parse the real files (issue 2)."""

from __future__ import annotations

import json

import pytest

from realtime_ming.model.config import (
    ConfigError,
    MingConfig,
    load_checkpoint_config,
    parse,
    parse_talker,
)
from realtime_ming.model.presets import PRESETS, preset_config, preset_dir
from realtime_ming.model.tiny_tokenizer import (
    TINY_VOCAB_SIZE,
    tiny_talker_special_ids,
    tiny_thinker_special_ids,
)

REAL = "ming-flash-omni-2.0"
THINKER_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "num_experts", "num_experts_per_tok", "n_group", "topk_group", "moe_intermediate_size",
                  "first_k_dense_replace", "rope_theta", "partial_rotary_factor", "eos_token_id")


def _check_root(cfg: MingConfig, raw: dict) -> None:
    llm, vision, audio = cfg.llm_config, cfg.vision_config, cfg.audio_config
    for name in THINKER_FIELDS:
        assert getattr(llm, name) == raw["llm_config"][name], name
    for name in ("depth", "hidden_size", "num_heads", "out_hidden_size", "deepstack_visual_indexes"):
        assert getattr(vision, name) == raw["vision_config"][name], name
    w = raw["audio_config"]["whisper_encoder_config"]
    assert (audio.whisper_encoder_config.n_state, audio.whisper_encoder_config.n_layer) == (w["n_state"], w["n_layer"])
    assert llm.is_video_rope and llm.is_multi_router


def test_fixture_checkpoint_config_parses(fixture_root):
    """Every config file of the fixture checkpoint parses with the files' values."""
    cfg = load_checkpoint_config(fixture_root)
    _check_root(cfg.ming, json.loads((fixture_root / "config.json").read_text()))
    talker = json.loads((fixture_root / "talker" / "config.json").read_text())
    llm = json.loads((fixture_root / "talker" / "llm" / "config.json").read_text())
    assert (cfg.talker.steps, cfg.talker.flowmodel.hidden_size) == (talker["steps"], talker["flowmodel"]["hidden_size"])
    assert (cfg.talker.llm.hidden_size, cfg.talker.llm.vocab_size) == (llm["hidden_size"], llm["vocab_size"])
    voices = json.loads((fixture_root / "talker" / "data" / "voice_name.json").read_text())
    assert set(cfg.voices) == set(voices)
    for name, voice in cfg.voices.items():
        assert voice.prompt_wav_path == fixture_root / "talker" / voices[name]["prompt_wav_path"]
        assert voice.prompt_wav_path.is_file()
    assert cfg.root == fixture_root


def test_real_full_size_root_config_parses(fixture_root):
    """The released root config.json parses; head_dim comes from hidden/heads, the scaling factor stays 2.5."""
    raw = json.loads((fixture_root.parent / "ming_flash_omni_2_0_config.json").read_text())
    cfg = parse(MingConfig, raw, "config.json")
    _check_root(cfg, raw)
    llm = cfg.llm_config
    assert "head_dim" not in raw["llm_config"] and llm.resolved_head_dim == 128 and llm.rotary_dim == 64
    assert llm.routed_scaling_factor == 2.5


def test_full_size_preset_is_the_release(fixture_root):
    """The full-size preset's root equals the released config and its talker the manifest's reported configs."""
    cfg = preset_config(REAL)
    raw = json.loads((fixture_root.parent / "ming_flash_omni_2_0_config.json").read_text())
    assert cfg.ming == parse(MingConfig, raw, "config.json")
    configs = json.loads((fixture_root.parent / "ming_flash_omni_2_0_manifest.json").read_text())["configs"]
    reported = parse_talker(configs["talker/config.json (REPORTED subset)"], configs["talker/llm/config.json (REPORTED)"])
    assert cfg.talker == reported
    assert cfg.vae.hop_size == 882 and cfg.vae.sample_rate == 44100
    assert cfg.root == preset_dir(REAL) and set(cfg.voices) == {"DB30"}


def test_tiny_preset_uses_tokenizer_ids():
    """The tiny preset builds with the embedded tokenizers' special ids in its config."""
    thinker_ids, talker_ids = tiny_thinker_special_ids(), tiny_talker_special_ids()
    cfg = preset_config("tiny", thinker_ids=thinker_ids, talker_ids=talker_ids, vocab=TINY_VOCAB_SIZE)
    llm = cfg.thinker
    assert (llm.eos_token_id, llm.pad_token_id) == (thinker_ids["<|role_end|>"], thinker_ids["<|endoftext|>"])
    assert llm.audio_patch_token == thinker_ids["<audioPatch>"] and llm.vocab_size == TINY_VOCAB_SIZE
    assert cfg.talker.llm.eos_token_id == talker_ids["<|im_end|>"]
    assert cfg.talker.flowmodel.llm_cond_dim == cfg.talker.llm.hidden_size


def test_preset_names():
    """Every listed preset name is handled; an unknown one is a ValueError listing the known ones."""
    assert set(PRESETS) == {"tiny", REAL}
    with pytest.raises(ValueError, match="known: tiny"):
        preset_config("ming-huge")


def test_missing_folder_is_one_config_error(tmp_path):
    """A folder that does not exist is one ConfigError naming it."""
    with pytest.raises(ConfigError, match=str(tmp_path / "nope")):
        load_checkpoint_config(tmp_path / "nope")


def test_invalid_value_names_the_file():
    """A value the dataclass rejects (unsupported activation) is a ConfigError naming the file."""
    with pytest.raises(ConfigError, match="talker/llm/config.json: hidden_act"):
        parse_talker({"flowmodel": {"hidden_size": 8, "depth": 1, "num_heads": 1},
                      "aggregator": {"hidden_size": 8, "depth": 1, "num_heads": 1}},
                     {"hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
                      "num_key_value_heads": 1, "hidden_act": "gelu"})
