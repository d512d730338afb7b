"""AudioVAE (docs/model.md §6) against the `vae_decode` / `talker_loop` golden fixtures."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.loader import init_dummy
from realtime_ming.model.vae import AudioVAE, upsample_linear
from realtime_ming.model.vae_stream import SilenceHolder, VAEStreamState, decode_chunk
from vae_support import _load_vae, _stream


@pytest.fixture(scope="module")
def vae(fixture_root) -> AudioVAE:
    return _load_vae(fixture_root)


@pytest.fixture(scope="module")
def talker_patch(fixture_root) -> int:
    return load_checkpoint_config(fixture_root).talker.patch_size


def test_fixture_vae_full_decode(vae, load_case):
    """Full decode of the fixture latents equals the reference waveform (rtol 1e-4, atol 1e-5)."""
    t, _ = load_case("vae_decode")
    with torch.no_grad():
        wave = vae.decode(t["latents"])
    ref = t["full_decode"][:, 0]
    assert wave.dtype == torch.float32
    assert wave.shape == (1, t["latents"].shape[1] * vae.samples_per_latent) == ref.shape
    torch.testing.assert_close(wave, ref, rtol=1e-4, atol=1e-5)


def test_vae_upsample_matches_interpolate():
    """upsample_linear with the sequence's own edge frames equals F.interpolate(linear, align_corners=False)."""
    x = torch.randn(2, 7, 5, generator=torch.Generator().manual_seed(0))
    ref = F.interpolate(x.transpose(1, 2), scale_factor=4, mode="linear", align_corners=False).transpose(1, 2)
    torch.testing.assert_close(upsample_linear(x, x[:, :1], x[:, -1:], 4), ref, rtol=1e-6, atol=1e-6)


def test_vae_init_buffers_window_matches_checkpoint(fixture_root, vae):
    """A dummy-initialised VAE computes the same ISTFT window (periodic Hann) as the stored buffer."""
    with torch.device("meta"):
        fresh = AudioVAE(load_checkpoint_config(fixture_root).vae)
    init_dummy(fresh)
    assert torch.equal(fresh.decoder.head.istft.window, vae.decoder.head.istft.window)


def test_fixture_vae_stream_chunks(vae, load_case, talker_patch):
    """Streaming in talker patches gives the reference chunk lengths exactly and concatenates to the reference."""
    t, _ = load_case("vae_decode")
    audio, lengths = _stream(vae, t["latents"], talker_patch)
    assert lengths == t["stream_chunk_lengths"].tolist()
    torch.testing.assert_close(audio, t["stream_decode_concat"][0, 0], rtol=1e-4, atol=1e-5)


def test_vae_stream_single_chunk_equals_full_decode(vae, load_case, talker_patch):
    """A stream whose first chunk is also its last emits the full decode of that chunk in one piece."""
    t, _ = load_case("vae_decode")
    latents = t["latents"][:, :talker_patch]
    audio, lengths = _stream(vae, latents, talker_patch)
    assert lengths == [talker_patch * vae.samples_per_latent]
    with torch.no_grad():
        torch.testing.assert_close(audio, vae.decode(latents)[0], rtol=1e-5, atol=1e-6)


def test_vae_stream_batched_rows_match_single_streams(vae, load_case, talker_patch):
    """Rows started at different calls, ended at different calls and reused after reset decode as if alone."""
    t, _ = load_case("vae_decode")
    p = talker_patch
    lat_a = t["latents"]  # row 0: whole fixture stream, then a second stream in the same row
    lat_b = torch.flip(t["latents"][:, : 4 * p], dims=[1])  # row 1: 4 chunks, starts at call 2
    lat_c = t["latents"][:, 2 * p: 4 * p] * 0.5  # row 0 after its first stream ended
    plan = {0: [lat_a[:, i * p:(i + 1) * p] for i in range(lat_a.shape[1] // p)]
            + [lat_c[:, i * p:(i + 1) * p] for i in range(2)],
            1: [None, None] + [lat_b[:, i * p:(i + 1) * p] for i in range(4)]}
    ends = {0: {lat_a.shape[1] // p - 1, lat_a.shape[1] // p + 1}, 1: {5}}
    state = VAEStreamState.allocate(vae, 2, p)
    got = {0: [], 1: []}
    for call in range(len(plan[0])):
        chunks = [plan[r][call] if call < len(plan[r]) and plan[r][call] is not None else torch.zeros(1, p, 64)
                  for r in (0, 1)]
        active = torch.tensor([call < len(plan[r]) and plan[r][call] is not None for r in (0, 1)])
        last = torch.tensor([call in ends[r] for r in (0, 1)])
        rows = decode_chunk(vae, torch.cat(chunks), state, last, active).rows()
        for r in (0, 1):
            if active[r]:
                got[r].append(rows[r])
            else:
                assert rows[r].numel() == 0
    n_a = lat_a.shape[1] // p
    for pieces, latents in ((got[0][:n_a], lat_a), (got[0][n_a:], lat_c), (got[1], lat_b)):
        alone, lengths = _stream(vae, latents, p)
        assert [x.numel() for x in pieces] == lengths
        torch.testing.assert_close(torch.cat(pieces), alone, rtol=1e-5, atol=1e-6)


def test_vae_stream_is_causal(vae, load_case, talker_patch):
    """Two streams sharing a prefix emit identical chunks until the chunk that saw different latents."""
    t, _ = load_case("vae_decode")
    p = talker_patch
    lat = t["latents"][:, : 4 * p].repeat(2, 1, 1)
    lat[1, 2 * p:] = torch.randn(2 * p, lat.shape[-1], generator=torch.Generator().manual_seed(0))
    state = VAEStreamState.allocate(vae, 2, p)
    outs = [decode_chunk(vae, lat[:, i * p:(i + 1) * p], state, i == 3) for i in range(4)]
    for i in range(2):  # call i emits chunk i-1, which looks ahead only into chunk i (< 2: shared)
        assert torch.equal(outs[i].audio[0], outs[i].audio[1])
    assert not torch.equal(outs[2].audio[0], outs[2].audio[1])


def test_vae_stream_reset_range_equals_the_masked_reset(vae, talker_patch):
    """Resetting rows [a, b) by slices (the talker's compaction) writes what the masked reset of those rows writes,
    and leaves the other rows alone."""
    gen = torch.Generator().manual_seed(0)
    for start, stop in ((0, 1), (2, 5), (5, 6), (3, 3)):
        states = [VAEStreamState.allocate(vae, 6, talker_patch) for _ in range(2)]
        a, b = states
        for x, y in ((a.cache.slot_pos, b.cache.slot_pos), (a.frame_pos, b.frame_pos)):
            x.copy_(torch.randint(0, 99, x.shape, generator=gen))
            y.copy_(x)
        for x, y in ((a.audio_buf, b.audio_buf), (a.env_buf, b.env_buf)):
            x.copy_(torch.randn(x.shape, generator=gen))
            y.copy_(x)
        a.has_held.fill_(True)
        b.has_held.fill_(True)
        a.reset_range(start, stop)
        b.reset_rows((torch.arange(6) >= start) & (torch.arange(6) < stop))
        for x, y in ((a.cache.slot_pos, b.cache.slot_pos), (a.has_held, b.has_held), (a.frame_pos, b.frame_pos),
                     (a.audio_buf, b.audio_buf), (a.env_buf, b.env_buf)):
            assert torch.equal(x, y)
        assert bool((a.cache.slot_pos[start:stop] == -1).all()) and bool(a.has_held[:start].all())


def test_fixture_vae_encode_posterior(vae, load_case):
    """Encoding the fixture waveform gives the reference posterior mean/std/sample and frame count."""
    t, _ = load_case("vae_decode")
    wave = t["encode_waveform"]
    with torch.no_grad():
        post = vae.encode(wave)
    frames = math.ceil(math.ceil(wave.shape[-1] / vae.cfg.enc_kwargs.hop_size) / vae.cfg.patch_size)
    assert post.mean.shape == (1, frames, vae.cfg.enc_kwargs.latent_dim)
    assert frames == int(t["encode_frame_num"].item())
    torch.testing.assert_close(post.mean, t["encode_posterior_mean"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(post.std, t["encode_posterior_std"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(post.sample(t["encode_eps"]), t["encode_latent_sample"], rtol=1e-4, atol=1e-4)


def test_fixture_vae_prompt_latents(vae, load_case, talker_patch):
    """The voice-prompt path (left pad to 14112, bf16 rounding, encode, sample) matches talker_loop."""
    t, _ = load_case("talker_loop")
    padded = vae.prompt_wave(t["prompt_wave_44k"], talker_patch)
    assert torch.equal(padded, t["prompt_wave_padded_bf16_rounded"])
    with torch.no_grad():
        post, latents = vae.encode_prompt(t["prompt_wave_44k"], talker_patch, eps=t["prompt_vae_eps"])
    assert latents.shape[1] % talker_patch == 0
    torch.testing.assert_close(post.mean, t["prompt_vae_posterior_mean"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(post.std, t["prompt_vae_posterior_std"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(latents, t["prompt_wav_lat"], rtol=1e-4, atol=1e-4)


def test_vae_bf16_close_to_fp32(fixture_root, vae, load_case, talker_patch):
    """bf16 weights/activations (ISTFT in fp32): decode and encode within rel. L2 3e-2 of fp32; bf16 stream == bf16 full within 5e-3."""
    t, _ = load_case("vae_decode")
    vae16 = _load_vae(fixture_root, torch.bfloat16)

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    with torch.no_grad():
        full16 = vae16.decode(t["latents"].bfloat16())
        assert full16.dtype == torch.float32
        assert rel(full16, vae.decode(t["latents"])) < 3e-2
        post16, post32 = vae16.encode(t["encode_waveform"]), vae.encode(t["encode_waveform"])
        assert post16.mean.dtype == torch.bfloat16
        assert rel(post16.mean, post32.mean) < 3e-2 and rel(post16.std, post32.std) < 3e-2
    stream16, _ = _stream(vae16, t["latents"].bfloat16(), talker_patch)
    assert rel(stream16, full16[0]) < 5e-3


def test_fixture_silence_holder(load_case):
    """silence_in_0..4 (last on the final one) give silence_out_0..4 up to the documented deviation
    (vae_stream.SilenceHolder, docs/fidelity.md): when loud audio arrives while the reference holds samples,
    it keeps the last that-many samples of what it emits as its new holder, so they go out a second time in
    front of its next non-empty output -- and that output re-holds them again while loud audio continues.
    The test tracks that re-held tail (`tail`) exactly: each reference output must equal `tail` + ours (the
    last one cut to the reference's length: the 0.3 s cap), and equal ours wherever the reference holds no
    repeat or emits nothing."""
    t, _ = load_case("vae_decode")
    holder = SilenceHolder()
    count = sum(1 for k in t if k.startswith("silence_in_"))
    tail = torch.zeros(0)  # samples the reference holds that it has already emitted (we hold none of them)
    for i in range(count):
        ref, is_last = t[f"silence_out_{i}"][0], i == count - 1
        held = sum(x.numel() for x in holder._held)  # silence both hold (not emitted yet)
        out = holder.push(t[f"silence_in_{i}"][0], is_last=is_last)
        if tail.numel() == 0 or (ref.numel() == 0 and not is_last):
            assert torch.equal(out, ref), f"chunk {i} differs from the reference without the documented deviation"
            if ref.numel() == 0:
                continue
        else:
            want = torch.cat((tail, out))
            cut = want[: ref.numel()] if is_last else want
            assert torch.equal(cut, ref), f"chunk {i}: the reference is not its re-held tail followed by our output"
            assert not is_last or ref.numel() in (want.numel(), holder.max_tail)
        reheld = tail.numel() + held  # the reference's holder before this loud chunk
        tail = ref[ref.numel() - reheld:] if reheld else torch.zeros(0)


def test_silence_holder_never_reemits_held_audio():
    """The deviation itself: held silence released in front of loud audio is emitted once; a later loud
    chunk comes out alone (the reference would put the re-held tail of the previous output before it)."""
    holder = SilenceHolder(sample_rate_hz=100)
    silence, loud = torch.zeros(20), torch.arange(1, 11, dtype=torch.float32)
    assert holder.push(silence, is_last=False).numel() == 0
    assert torch.equal(holder.push(loud, is_last=False), torch.cat((silence, loud)))
    assert torch.equal(holder.push(2 * loud, is_last=True), 2 * loud)


def test_silence_holder_withholds_silent_chunk_until_audio():
    """A silent chunk is emitted in front of later loud audio, in-chunk trailing silence is dropped, the end keeps ≤ 0.3 s."""
    holder = SilenceHolder(sample_rate_hz=100)  # 10-sample frames, 30-sample final tail
    zeros, ones = torch.zeros, torch.ones
    assert holder.push(zeros(25), is_last=False).numel() == 0  # 2 silent frames held, 5 samples partial
    assert torch.equal(holder.push(ones(15), is_last=False), torch.cat((zeros(25), ones(15))))
    assert torch.equal(holder.push(torch.cat((ones(10), zeros(20))), is_last=False), ones(10))
    assert holder.push(zeros(20), is_last=False).numel() == 0
    assert torch.equal(holder.push(zeros(45), is_last=True), zeros(30))


def test_deeper_vae_encoder_runs_reference_layers_only(fixture_root, vae, load_case, tmp_path):
    """A VAE whose encoder backbone holds more layers than the reference runs (it runs
    layers[:REFERENCE_AGGREGATOR_LAYERS]) gives the reference posterior; running every layer would not."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from realtime_ming.model.vae import REFERENCE_AGGREGATOR_LAYERS

    t, _ = load_case("vae_decode")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(fixture_root, ckpt, ignore=shutil.ignore_patterns("cases"))
    vae_dir = ckpt / "talker" / "vae"
    config = json.loads((vae_dir / "config.json").read_text())
    backbone = config["enc_kwargs"]["backbone"]
    held = backbone["num_hidden_layers"]
    assert held >= REFERENCE_AGGREGATOR_LAYERS
    backbone["num_hidden_layers"] = held + 2
    (vae_dir / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(vae_dir / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    for key in [k for k in tensors if k.startswith(f"encoder.encoder.layers.{held - 1}.")]:
        for extra in (held, held + 1):
            src = tensors[key]
            tensors[key.replace(f".layers.{held - 1}.", f".layers.{extra}.")] = src + 0.5 * torch.randn(
                src.shape, generator=gen)
    save_file(tensors, str(vae_dir / "model.safetensors"))

    deep = _load_vae(ckpt)
    assert len(deep.encoder.encoder.layers) == held + 2
    assert deep.encoder.encoder.run_layers == min(held + 2, REFERENCE_AGGREGATOR_LAYERS)
    wave = t["encode_waveform"]
    with torch.no_grad():
        post = deep.encode(wave)
        torch.testing.assert_close(post.mean, t["encode_posterior_mean"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(post.std, t["encode_posterior_std"], rtol=1e-4, atol=1e-4)
        deep.encoder.encoder.run_layers = held + 2  # what running every held layer would give
        assert (deep.encode(wave).mean - t["encode_posterior_mean"]).abs().max() > 1e-2
