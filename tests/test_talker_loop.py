"""Talker prompt, voice embeddings and AR loop vs fixture case `talker_loop` (docs/model.md §5.3, §5.4, §5.9)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from realtime_ming.model.config import load_checkpoint_config, parse_talker
from realtime_ming.model.qwen2 import KVCache
from realtime_ming.model.talker import (
    Talker,
    TalkerSpecialIds,
    build_talker_prompt,
    duration_exceeded,
    duration_step_cap,
    history_update,
    initial_history,
    load_talker,
    max_decode_steps,
    should_stop,
)
from talker_support import _close, _fixture_steps, _recorded_encoder, case_special_ids, case_speak_text
from talker_support import SPECIAL_NAMES

STOP_ATOL = 1e-5
# special ids of the structure tests below (any distinct ids do; the fixture tests read the case's own)
TINY_IDS = TalkerSpecialIds(im_start=144, im_end=145, vision_start=152, vision_pad=154, vision_end=153,
                            audio=250, audio_patch=251)


def _talker(root, dtype):
    return load_talker(load_checkpoint_config(root).talker, root / "talker" / "model.safetensors", dtype=dtype)


@pytest.fixture(scope="module")
def talker(fixture_root):
    return _talker(fixture_root, torch.float32)


@pytest.fixture(scope="module")
def case(load_case):
    return load_case("talker_loop")


def _fixture_prompt(case):
    tensors, meta = case
    voice = meta["voice"]
    return build_talker_prompt(_recorded_encoder(meta), case_special_ids(meta), case_speak_text(meta),
                               prompt_text=voice["prompt_text"], prompt_patches=tensors["prompt_wav_emb"].shape[1])


def test_fixture_prompt_ids_and_slots(case):
    """Pieces encoded separately give input_ids exactly; slots match the recorded positions."""
    tensors, meta = case
    prompt = _fixture_prompt(case)
    assert torch.equal(torch.tensor([prompt.input_ids]), tensors["input_ids"])
    assert prompt.speaker_slots == (meta["template"]["speaker_embedding_position"],)
    start, end = meta["template"]["prompt_audio_positions"]
    assert prompt.audio_slots == tuple(range(start, end))


def test_fixture_voice_and_prompt_embeddings(talker, case):
    """spk_head(spk_vector), aggregator over prompt-latent groups and the spliced inputs_embeds match."""
    tensors, _ = case
    with torch.no_grad():
        voice = talker.register_voice(tensors["spk_vector_192"], tensors["prompt_wav_lat"])
        embeds = talker.prompt_embeds(_fixture_prompt(case), [voice.spk_embed], voice.prompt_emb)
    _close(voice.spk_embed, tensors["spk_embed"])
    _close(voice.prompt_emb, tensors["prompt_wav_emb"])
    _close(embeds, tensors["inputs_embeds"])


def test_fixture_loop_six_steps(talker, case):
    """generate() reproduces his_lat_in, LM hidden, gen_lat, next_embed and stop_prob of all K recorded steps."""
    tensors, meta = case
    k = meta["loop"]["K"]
    steps = _fixture_steps(talker, tensors, max_steps=k)
    assert [s.step for s in steps] == list(range(k))
    assert [s.last for s in steps] == [False] * (k - 1) + [True]
    for attr, name in [("his_in", "his_lat_in"), ("hidden", "lm_last_hidden"), ("gen_lat", "gen_lat"),
                       ("next_embed", "next_embed")]:
        _close(torch.stack([getattr(s, attr) for s in steps]), tensors[name])
    _close(torch.stack([s.stop_prob for s in steps]), tensors["stop_prob"], atol=STOP_ATOL)


@pytest.mark.parametrize("min_new_token", [0, 1])
def test_fixture_loop_stop_rule(talker, case, min_new_token):
    """The loop ends at the first step > min_new_token with p_stop > 0.5, keeping that step's patch."""
    tensors, meta = case
    p_stop = tensors["stop_prob"][:, 0, 1].tolist()
    expected = next((s for s, p in enumerate(p_stop) if s > min_new_token and p > 0.5), None)
    if expected is None:  # the recorded steps never stop: all K run and only the step limit ends the loop
        steps = _fixture_steps(talker, tensors, min_new_token=min_new_token, max_steps=meta["loop"]["K"])
        assert len(steps) == meta["loop"]["K"]
    else:
        steps = _fixture_steps(talker, tensors, min_new_token=min_new_token)
        assert len(steps) == expected + 1
    assert steps[-1].last and not any(s.last for s in steps[:-1])


def test_bf16_loop_close_to_fp32(fixture_root, case):
    """bf16 loop: every recorded tensor within 5e-2 rel. L2 of fp32 (one bf16 CFM step alone is ~1.5e-2)."""
    tensors, meta = case
    steps = _fixture_steps(_talker(fixture_root, torch.bfloat16), tensors, torch.bfloat16, max_steps=meta["loop"]["K"])
    for attr, name in [("hidden", "lm_last_hidden"), ("gen_lat", "gen_lat"), ("next_embed", "next_embed"),
                       ("stop_prob", "stop_prob")]:
        got = torch.stack([getattr(s, attr) for s in steps]).float()
        assert ((got - tensors[name]).norm() / tensors[name].norm()).item() < 5e-2, attr


def _batched_vs_single(talker, rows, positions, step_in):
    """Prefill rows [B, T] (positions -1 = padding) then decode one step; compare with B=1 runs."""
    llm, b = talker.cfg.llm, rows.shape[0]
    capacity = rows.shape[1] + 1  # the prompt and one decode step
    lengths = (positions >= 0).sum(1).tolist()
    with torch.no_grad():
        cache = KVCache.allocate(llm, b, capacity, "cpu", torch.float32)
        h = talker.prefill(rows, positions, cache)
        h2 = talker.decode_lm(step_in, torch.tensor([[n] for n in lengths]), cache)
        for i, n in enumerate(lengths):
            single = KVCache.allocate(llm, 1, capacity, "cpu", torch.float32)
            want = talker.prefill(rows[i:i + 1, :n], torch.arange(n)[None], single)
            want2 = talker.decode_lm(step_in[i:i + 1], torch.tensor([[n]]), single)
            torch.testing.assert_close(h[i:i + 1], want, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(h2[i:i + 1], want2, atol=1e-5, rtol=1e-5)


def test_prefill_and_decode_batched_rows_equal_single_rows(talker, case):
    """Batched prefill of equal-length rows and a batched decode step equal per-row B=1 runs."""
    tensors, _ = case
    embeds = tensors["inputs_embeds"]
    other = embeds.clone()
    tail = tensors["next_embed"][:, 0, 0]  # one per recorded step: a different prompt tail for row 1
    other[0, -tail.shape[0]:] = tail
    rows = torch.cat((embeds, other))
    positions = torch.arange(embeds.shape[1]).expand(2, -1)
    _batched_vs_single(talker, rows, positions, tensors["next_embed"][:2, 0])


def test_prefill_right_padded_rows_equal_single_rows(talker, case):
    """Right-padded batched prefill (rows of different lengths) equals per-row runs."""
    tensors, _ = case
    embeds = tensors["inputs_embeds"]
    t = embeds.shape[1]
    rows = torch.cat((embeds, embeds))
    positions = torch.arange(t).repeat(2, 1)
    positions[1, t - 7:] = -1
    _batched_vs_single(talker, rows, positions, tensors["next_embed"][:2, 0])


def test_initial_history_right_aligns_last_frames():
    """History = zeros with the last min(N, Hh) prompt latents at the end."""
    lat = torch.arange(1, 7, dtype=torch.float32).reshape(1, 6, 1)
    short = initial_history(lat, 8, 1)
    assert short.flatten().tolist() == [0, 0, 1, 2, 3, 4, 5, 6]
    long = initial_history(lat, 4, 1)
    assert long.flatten().tolist() == [3, 4, 5, 6]
    assert initial_history(None, 3, 2).abs().sum().item() == 0 and initial_history(None, 3, 2).shape == (1, 3, 2)


def test_history_update_slides_by_patch():
    """Oldest P frames dropped, the new patch appended at the end, per row."""
    his = torch.arange(12, dtype=torch.float32).reshape(2, 6, 1)
    patch = -torch.ones(2, 2, 1)
    out = history_update(his, patch)
    assert out[0].flatten().tolist() == [2, 3, 4, 5, -1, -1]
    assert out[1].flatten().tolist() == [8, 9, 10, 11, -1, -1]


def test_stop_rule_and_step_limits():
    """Stop needs step > min_new_token and p > 0.5; steps < min(1000, capacity − prefill)."""
    assert not should_stop(10, 0.9)  # default min_new_token is 10 (Ming)
    assert should_stop(11, 0.51)
    assert not should_stop(11, 0.5)
    assert should_stop(4, 0.6, min_new_token=3)
    assert max_decode_steps(195, 2048) == 1000
    assert max_decode_steps(195, 512) == 317
    assert max_decode_steps(600, 512) == 0


def test_duration_guard():
    """Guard fires once audio·16000/5818 ≥ len(text) and audio > 2 s; step cap = max(2 s, len·0.364 s)/0.32 s."""
    assert not duration_exceeded(3.6, 10)  # 3.6 s · 2.75 = 9.9 < 10 chars
    assert duration_exceeded(3.7, 10)
    assert not duration_exceeded(1.9, 2)  # long enough per char but not > 2 s
    assert duration_exceeded(2.1, 2)
    assert not duration_exceeded(0.0, 0)
    assert duration_step_cap(10, 0.32) == 11  # 3.63625 s / 0.32
    assert duration_step_cap(1, 0.32) == 6  # 2 s floor


def _pseudo_encode(text: str) -> list[int]:
    """Structure-test tokenizer: special tokens → TINY_IDS, every other character → 1000 + ord."""
    special = {"<|im_start|>": 144, "<|im_end|>": 145, "<|vision_start|>": 152, "<|vision_pad|>": 154,
               "<|vision_end|>": 153, "<audio>": 250, "<audioPatch>": 251}
    ids = []
    for part in re.split(r"(<\|[a-z_]+\|>|<audio>|<audioPatch>)", text):
        ids += [special[part]] if part in special else [1000 + ord(c) for c in part]
    return ids


def _decode(ids) -> str:
    names = {144: "<|im_start|>", 145: "<|im_end|>", 152: "<|vision_start|>", 154: "<|vision_pad|>",
             153: "<|vision_end|>", 250: "<audio>", 251: "<audioPatch>"}
    return "".join(names.get(i) or chr(i - 1000) for i in ids)


def test_prompt_without_voice_and_music_caption():
    """No voice prompt: no transcript, no patches; music captions drop ' Text input:'; 2 speakers get 2 slots."""
    text = "Genre: pop. Mood: calm. Instrument: piano. Theme: sea. Duration: 10s"
    prompt = build_talker_prompt(_pseudo_encode, TINY_IDS, text, num_speakers=2, prompt_text="ignored",
                                 prompt_patches=0)
    decoded = _decode(prompt.input_ids)
    assert decoded == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Please generate speech based on the following description.\n"
        "  speaker_1:<|vision_start|><|vision_pad|><|vision_end|>\n"
        "  speaker_2:<|vision_start|><|vision_pad|><|vision_end|>\n"
        f"{text}<|im_end|>\n<|im_start|>assistant\n<audio>"
    )
    assert all(prompt.input_ids[s] == TINY_IDS.vision_pad for s in prompt.speaker_slots)
    assert len(prompt.speaker_slots) == 2 and prompt.audio_slots == ()
    plain = _decode(build_talker_prompt(_pseudo_encode, TINY_IDS, "hi", num_speakers=0).input_ids)
    assert " Text input:\nhi<|im_end|>" in plain and "speaker_" not in plain


def test_prompt_rejects_tokenizer_without_special_tokens():
    """A tokenizer that splits `<audio>` into several ids is refused with a ValueError naming the piece."""
    broken = lambda text: [1000 + ord(c) for c in text]  # noqa: E731
    with pytest.raises(ValueError, match="<\\|im_start\\|>system"):
        build_talker_prompt(broken, TINY_IDS, "hi")
    no_audio = lambda text: [1] if text == "<audio>" else _pseudo_encode(text)  # noqa: E731
    with pytest.raises(ValueError, match="<audio>"):
        build_talker_prompt(no_audio, TINY_IDS, "hi")


def test_prompt_embeds_checks_slot_counts(talker, case):
    """Mismatched speaker / prompt-audio embedding counts raise instead of silently misplacing them."""
    ids = case_special_ids(case[1])
    names = {v: getattr(ids, f) for f, v in SPECIAL_NAMES.items()}
    in_vocab = lambda t: [names[p] if p in names else ord(c) % 100  # noqa: E731
                          for p in re.split(r"(<\|[a-z_]+\|>|<audio>|<audioPatch>)", t) if p
                          for c in ([p] if p in names else p)]
    prompt = build_talker_prompt(in_vocab, ids, "hi")
    with pytest.raises(ValueError, match="speaker"):
        talker.prompt_embeds(prompt, [], None)
    with pytest.raises(ValueError, match="prompt-audio"):
        talker.prompt_embeds(prompt, [torch.zeros(1, talker.hidden_size)], torch.zeros(1, 2, talker.hidden_size))


def test_full_size_talker_matches_manifest_keys_and_shapes(fixture_root):
    """Built on meta from the reported full-size configs, every key and shape equals the manifest's talker file."""
    manifest = json.loads((fixture_root.parent / "ming_flash_omni_2_0_manifest.json").read_text())
    configs = manifest["configs"]
    cfg = parse_talker(configs["talker/config.json (REPORTED subset)"], configs["talker/llm/config.json (REPORTED)"])
    with torch.device("meta"):
        talker = Talker(cfg)
    ours = {k: list(v.shape) for k, v in talker.state_dict().items()}
    theirs = {k: shape for k, shape, _ in manifest["files"]["talker/model.safetensors"]["tensors"]}
    assert ours == theirs
