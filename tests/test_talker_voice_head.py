"""A voice's talker-prompt head (system … transcript) is prefilled once and reused by later jobs in that voice
with the same audio as a full prefill; the prefill graphs cover the longest prompt a job prefills; a cloned
voice's prompt leaves every job room for reply text (fixture checkpoint, CPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import fixture_tokenizers
from realtime_ming.engine.config import EngineConfig, TalkerRunnerConfig
from realtime_ming.engine.models import ModelBundle
from realtime_ming.engine.talker_runner import TalkerRunner
from realtime_ming.engine.talker_step import TalkerPrefiller, VoiceHeadCache, prefill_buckets
from realtime_ming.engine.voice_store import CustomVoice
from realtime_ming.model.qwen2 import KVCache
from realtime_ming.model.talker import VoicePrompt, build_talker_prompt
from realtime_ming.model.talker_text import talker_job_texts

pytestmark = pytest.mark.timeout(120)

# several talker jobs (the reference front-end cuts it), all in one voice
TEXT = "Hello there, how are you? Fine, thanks. And you?"


def _config(fixture_root, **talker) -> EngineConfig:
    thinker_tok, talker_tok = fixture_tokenizers(fixture_root)
    return EngineConfig(model_path=str(fixture_root), tokenizer_path=thinker_tok, talker_tokenizer_path=talker_tok,
                        talker=TalkerRunnerConfig(**(dict(max_streams=2, silence_holder=False) | talker)))


@pytest.fixture(scope="module")
def bundle(fixture_root) -> ModelBundle:
    return ModelBundle.load(_config(fixture_root))


def _speak(runner: TalkerRunner, voice) -> np.ndarray:
    runner.enqueue("t", 0, TEXT, voice, seed=5)
    pcm = []
    while runner.has_work():
        for out in runner.step():
            assert out.error is None
            if out.pcm is not None:
                pcm.append(out.pcm)
    runner.forget("t")
    return np.concatenate(pcm)


def _clone(bundle) -> CustomVoice:
    prompt, text = bundle.voices[bundle.default_voice]
    # a distinct voice object with the preset's tensors: a clone of the preset's own clip
    voice = VoicePrompt(prompt.spk_embed, prompt.prompt_lat.clone(), prompt.prompt_emb.clone())
    return CustomVoice("voice_test", "owner", "test", voice, text, 1.0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["preset", "clone"])
def test_reused_prompt_head_gives_the_same_audio_as_full_prefills(fixture_root, bundle, kind):
    assert len(talker_job_texts(TEXT)) >= 3
    voice = bundle.default_voice if kind == "preset" else _clone(bundle)
    assert bundle.voices[bundle.default_voice][0].num_patches > 0  # the head holds a voice transcript
    full = TalkerRunner(bundle, _config(fixture_root, voice_head_cache=0))
    cached = TalkerRunner(bundle, _config(fixture_root))
    want = _speak(full, voice)
    got = _speak(cached, voice)
    assert full.heads.hits == 0 and len(full.heads) == 0
    jobs = len(talker_job_texts(TEXT))
    assert (cached.heads.misses, cached.heads.hits) == (1, jobs - 1)  # one full prefill, then the head
    assert got.shape == want.shape and np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    again = _speak(cached, voice)  # a later turn in the same voice: the head is still there
    assert cached.heads.hits == 2 * jobs - 1
    np.testing.assert_allclose(again, want, rtol=0, atol=1e-5)


def test_prefill_from_a_head_equals_the_full_prefill(bundle):
    talker = bundle.talker
    prompt, text = bundle.voices[bundle.default_voice]
    tok = bundle.talker_tokenizer
    ids = build_talker_prompt(lambda s: tok.encode(s, add_special_tokens=False).ids, bundle.talker_special,
                              "How are you?", num_speakers=0 if prompt.spk_embed is None else 1,
                              prompt_text=text, prompt_patches=prompt.num_patches)
    embeds = talker.prompt_embeds(ids, [] if prompt.spk_embed is None else [prompt.spk_embed], prompt.prompt_emb)
    t = embeds.shape[1]
    cap = -(-(t + 1) // 32) * 32  # the prompt fits the cache (no window: a longer one would wrap the ring)
    prefiller = TalkerPrefiller(talker, cap, (32, 64), dtype=bundle.dtype, device="cpu")
    full = KVCache.allocate(talker.cfg.llm, 1, cap, "cpu", bundle.dtype)
    h_full = prefiller(embeds, full)
    heads = VoiceHeadCache(4)
    start = t // 2
    heads.put(prompt, text, ids.input_ids[:start], full)
    head = heads.get(prompt, text)
    assert head is not None and head.shared(ids.input_ids) == start
    part = KVCache.allocate(talker.cfg.llm, 1, cap, "cpu", bundle.dtype)
    part.slot_pos.fill_(7)  # stale contents are forgotten
    h_part = prefiller(embeds, part, head, start)
    torch.testing.assert_close(h_part, h_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(part.slot_pos, full.slot_pos, rtol=0, atol=0)
    torch.testing.assert_close(part.k[:, :, :, :t], full.k[:, :, :, :t], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        prefiller(embeds, part, None, 3)  # a start needs a head
    with pytest.raises(ValueError):
        prefiller(embeds, part, head, t)  # at least one token is prefilled (its h is the output)


def test_prefill_and_head_refuse_a_prompt_longer_than_the_cache(bundle):
    """Without a window a prompt past the cache's capacity wraps its ring: two positions land in one slot in a
    single write (which one stays is unspecified) and the K/V a head would keep are not positions 0..n-1 —
    refused with a clear error, never a silently wrong h."""
    talker, llm = bundle.talker, bundle.talker.cfg.llm
    cap = 32
    prefiller = TalkerPrefiller(talker, cap, (32,), dtype=bundle.dtype, device="cpu")
    row = KVCache.allocate(llm, 1, cap, "cpu", bundle.dtype)
    embeds = torch.zeros(1, cap + 1, talker.hidden_size, dtype=bundle.dtype)
    with pytest.raises(ValueError, match="does not fit"):
        prefiller(embeds, row)
    assert prefiller(embeds[:, :cap], row).shape == (1, 1, talker.hidden_size)  # exactly full is fine
    lat, hid = talker.latent_dim, talker.hidden_size
    voice = VoicePrompt(None, torch.zeros(1, 0, lat), torch.zeros(1, 0, hid))
    heads = VoiceHeadCache(2)
    with pytest.raises(ValueError, match="does not fit"):
        heads.put(voice, "", list(range(cap + 1)), row)
    assert len(heads) == 0


@pytest.mark.slow
def test_head_from_a_music_caption_job_names_its_own_tokens(fixture_root, bundle):
    """A voice's first job whose text is a music caption has no ` Text input:` line: the head kept from its
    prefill holds that prompt's tokens, so a later ordinary job in the voice still speaks what a full prefill
    speaks (a head named by another prompt's ids would load K/V shifted by that line)."""
    from realtime_ming.model.talker import is_music_caption

    caption = "Genre: pop Mood: calm Instrument: piano Theme: rain Duration: ten"
    assert is_music_caption(caption) and talker_job_texts(caption) == [caption]
    voice = _clone(bundle)

    def speak(runner: TalkerRunner) -> np.ndarray:
        runner.enqueue("m", 0, caption, voice, seed=3)
        while runner.has_work():
            assert all(out.error is None for out in runner.step())
        runner.forget("m")
        return _speak(runner, voice)

    want = speak(TalkerRunner(bundle, _config(fixture_root, voice_head_cache=0)))
    cached = TalkerRunner(bundle, _config(fixture_root))
    got = speak(cached)
    assert cached.heads.hits == len(talker_job_texts(TEXT))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_head_cache_is_bounded_and_keyed_by_the_voice_object(bundle):
    cap, llm = 64, bundle.talker.cfg.llm
    row = KVCache.allocate(llm, 1, cap, "cpu", bundle.dtype)
    lat, hid = bundle.talker.latent_dim, bundle.talker.hidden_size
    voices = [VoicePrompt(None, torch.zeros(1, 0, lat), torch.zeros(1, 0, hid)) for _ in range(3)]
    heads = VoiceHeadCache(2)
    for v in voices:
        heads.put(v, "", [1, 2, 3], row)
    assert len(heads) == 2 and heads.get(voices[0], "") is None  # least recently used went first
    assert heads.get(voices[1], "") is not None and heads.get(voices[2], "") is not None
    assert heads.get(voices[2], "another transcript") is None
    twin = VoicePrompt(None, torch.zeros(1, 0, lat), torch.zeros(1, 0, hid))  # equal tensors, another voice
    assert heads.get(twin, "") is None
    off = VoiceHeadCache(0)
    off.put(voices[0], "", [1], row)
    assert len(off) == 0


def test_prefill_graph_buckets_cover_the_longest_job_prompt(fixture_root, bundle):
    assert prefill_buckets((32, 64, 256), 512, 256) == (32, 64, 256)
    assert prefill_buckets((32, 64, 128), 512, 256) == (32, 64, 128, 256)
    assert prefill_buckets((32, 64), 1024, 300) == (32, 64, 320)  # a multiple of 32
    assert prefill_buckets((32, 2048), 1024, 300) == (32, 1024)  # capped at the cache
    cfg = _config(fixture_root, max_prompt_len=1024)  # PROMPT_BUCKETS end at 256: the longest prompt adds 512
    runner = TalkerRunner(bundle, cfg)
    assert max(runner.prefiller.graph.buckets) >= runner.prompt_limit == cfg.talker.max_prompt_len // 2


def test_voice_prompt_budget_leaves_room_for_text(fixture_root, bundle):
    talker = _config(fixture_root).talker
    assert talker.voice_prompt_budget == talker.max_prompt_len // 2 - talker.min_text_tokens
    assert bundle.voice_encoder.max_prompt_tokens == talker.voice_prompt_budget
    with pytest.raises(ValueError):
        TalkerRunnerConfig(max_prompt_len=64, min_text_tokens=32)
    with pytest.raises(ValueError):
        TalkerRunnerConfig(voice_head_cache=-1)
    assert dataclasses.replace(talker, min_text_tokens=0).voice_prompt_budget == talker.max_prompt_len // 2


def test_longest_clip_that_fits_the_voice_budget(bundle):
    """`max_clip_seconds` (from the VAE's samples per prompt patch) is exact: that clip fits, one patch more
    is refused with VoicePromptTooLong, whose message names the limit."""
    from realtime_ming.engine.voice_prompt import VoicePromptTooLong

    enc = bundle.voice_encoder
    transcript = "Nice to meet you."
    seconds = enc.max_clip_seconds(transcript)
    rate = enc.vae_rate_hz
    patch = enc.samples_per_patch
    assert seconds > 0 and round(seconds * rate) % patch == 0
    rng = np.random.default_rng(0)

    def wave(n: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 0.1)

    n = round(seconds * rate)
    voice = enc.encode(wave(n), rate, transcript, lambda w, a, b: w, check_length=True)
    assert enc.prompt_tokens(voice, transcript) == enc.max_prompt_tokens
    with pytest.raises(VoicePromptTooLong, match=f"clips up to {seconds:.1f} s"):
        enc.encode(wave(n + 1), rate, transcript, lambda w, a, b: w, check_length=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_prefill_from_the_head_equals_eager_full_prefills():
    """CUDA: the graphed runner loading a cloned voice's head into the staging cache speaks what the eager
    runner without the head cache speaks (fp32, 1e-3 of the peak)."""
    from realtime_ming.engine.config import PlacementConfig

    place = PlacementConfig(thinker_devices=("cpu",), talker_device="cuda", encoder_device="cpu", vae_device="cuda")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        gpu = ModelBundle.load(EngineConfig(dtype="float32", placement=place))
        enc = gpu.voice_encoder
        wave = torch.from_numpy(np.random.default_rng(1).standard_normal(2 * enc.vae_rate_hz).astype(np.float32) * 0.1)
        prompt = enc.encode(wave, enc.vae_rate_hz, "Hello.", lambda w, a, b: w)
        voice = CustomVoice("voice_gpu", "owner", "gpu", prompt, "Hello.", 2.0, 0)

        def runner(graphs: bool, heads: int) -> TalkerRunner:
            talker = TalkerRunnerConfig(max_streams=2, buckets=(1, 2), silence_holder=False, voice_head_cache=heads)
            r = TalkerRunner(gpu, EngineConfig(enforce_eager=not graphs, talker=talker))
            r.capture()
            return r

        want = _speak(runner(False, 0), voice)
        graphed = runner(True, 8)
        assert not graphed.prefiller.graph.eager
        got = _speak(graphed, voice)
        assert graphed.heads.hits == len(talker_job_texts(TEXT)) - 1
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * float(np.abs(want).max()))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
