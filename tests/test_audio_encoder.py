"""Audio encoder + projector (docs/model.md §2.2–2.3) against the `audio_frontend_and_encoder` fixture."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tower_support import EMBED_TOL, HIDDEN_TOL, load_tower

from realtime_ming.model.audio_encoder import (
    AudioProjector,
    WhisperEncoder,
    audio_token_lengths,
    encode_wrapped,
    encoder_output_lengths,
    unwrap_feats,
    whisper_sinusoids,
)
from realtime_ming.model.audio_encoder import _conv1d_as_linear
from realtime_ming.model.loader import init_dummy

CASE = "audio_frontend_and_encoder"


def _build(root, dtype=torch.float32):
    return load_tower(root, WhisperEncoder, AudioProjector, "audio_config", "audio.", "linear_proj_audio.", dtype)


@pytest.fixture(scope="module")
def model(fixture_root):
    return _build(fixture_root)


@pytest.fixture(scope="module")
def case(load_case):
    return load_case(CASE)[0]


@torch.no_grad()
def test_fixture_whisper_encoder_out(model, case):
    """The encoder maps the fixture mel to the reference whisper_encoder_out."""
    _, encoder, _ = model
    torch.testing.assert_close(encoder(case["mel"]), case["whisper_encoder_out"], **HIDDEN_TOL)


@torch.no_grad()
def test_fixture_projector_prenorm_and_audio_embeds(model, case):
    """The projector reproduces projector_out_prenorm, and after L2 normalisation audio_embeds."""
    _, _, projector = model
    encoded = case["whisper_encoder_out"]
    torch.testing.assert_close(projector.project(encoded), case["projector_out_prenorm"], **HIDDEN_TOL)
    torch.testing.assert_close(projector(encoded), case["audio_embeds"], **EMBED_TOL)


@torch.no_grad()
def test_fixture_wrapped_single_clip(model, case):
    """encode_wrapped on the one-clip wrapped input gives audio_embeds and its lengths."""
    _, encoder, projector = model
    out = encode_wrapped(encoder, projector, case["mel"], case["mel_lengths"])
    torch.testing.assert_close(out.embeds, case["audio_embeds"], **EMBED_TOL)
    assert torch.equal(out.lengths, case["audio_embeds_lengths"])


def test_fixture_output_lengths(model, case):
    """Length formulas give the fixture's encoder frames and audio token counts (mel 150 → 75 → 38)."""
    cfg, _, projector = model
    mel_lengths = case["mel_lengths"]
    assert encoder_output_lengths(mel_lengths).item() == case["whisper_encoder_out"].shape[1]
    assert torch.equal(audio_token_lengths(mel_lengths, cfg.audio_config), case["encoder_feats_lengths"])
    assert torch.equal(audio_token_lengths(case["twoclip_mel_lengths"], cfg.audio_config),
                       case["twoclip_audio_embeds_lengths"])
    assert projector.output_lengths(encoder_output_lengths(int(mel_lengths[0, 0]))) == case["audio_embeds"].shape[1]


@torch.no_grad()
def test_fixture_twoclip_padded_without_mask(model, case):
    """Two wrapped clips are batched zero-padded and unmasked exactly as the reference (twoclip_*)."""
    _, encoder, projector = model
    clips, clip_lengths = unwrap_feats(case["twoclip_mel"], case["twoclip_mel_lengths"])
    assert clip_lengths == case["twoclip_mel_lengths"][0].tolist()
    torch.testing.assert_close(encoder(clips), case["twoclip_whisper_encoder_out_padded"], **HIDDEN_TOL)
    out = encode_wrapped(encoder, projector, case["twoclip_mel"], case["twoclip_mel_lengths"])
    torch.testing.assert_close(out.embeds, case["twoclip_audio_embeds"], **EMBED_TOL)
    assert torch.equal(out.lengths, case["twoclip_audio_embeds_lengths"])


@torch.no_grad()
def test_per_clip_option_equals_each_clip_alone(model, case):
    """per_clip=True encodes each clip at its own length; the default differs for the padded clip."""
    _, encoder, projector = model
    mel, lengths = case["twoclip_mel"], case["twoclip_mel_lengths"]
    first, second = lengths[0].tolist()
    n_first = case["twoclip_audio_embeds_lengths"][0, 0].item()
    alone = projector(encoder(mel[:, first:first + second]))
    out = encode_wrapped(encoder, projector, mel, lengths, per_clip=True)
    torch.testing.assert_close(out.embeds[:, :n_first], case["audio_embeds"], **EMBED_TOL)
    torch.testing.assert_close(out.embeds[:, n_first:], alone, **EMBED_TOL)
    reference_second = case["twoclip_audio_embeds"][:, n_first:]
    assert (reference_second - alone).abs().max() > 1e-3


@torch.no_grad()
def test_convolutions_equal_torch_conv1d(model, case):
    """conv2 and the projector conv (run as unfolded matmuls) equal F.conv1d with the same weights."""
    _, encoder, projector = model
    x = case["whisper_encoder_out"]
    for conv in (encoder.conv2, projector._modules["0"]):
        ref = F.conv1d(x.transpose(1, 2), conv.weight, conv.bias, stride=conv.stride, padding=conv.padding)
        ours = _conv1d_as_linear(x, conv)
        torch.testing.assert_close(ours, ref.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_positional_embedding_is_whisper_sinusoids(fixture_root):
    """init_buffers computes the same sinusoids the checkpoint stores as audio.positional_embedding."""
    cfg, encoder, _ = _build(fixture_root)
    with torch.device("meta"):
        fresh = WhisperEncoder(cfg.audio_config)
    init_dummy(fresh, seed=0)
    torch.testing.assert_close(fresh.positional_embedding, encoder.positional_embedding, rtol=0, atol=1e-6)
    w = cfg.audio_config.whisper_encoder_config
    table = whisper_sinusoids(w.n_ctx, w.n_state)
    assert torch.equal(table[0, : w.n_state // 2], torch.zeros(w.n_state // 2))
    assert torch.equal(table[0, w.n_state // 2:], torch.ones(w.n_state // 2))


@torch.no_grad()
def test_encoder_rejects_audio_longer_than_n_ctx(model):
    """More encoder frames than n_ctx positions raise ValueError instead of silently truncating."""
    cfg, encoder, _ = model
    w = cfg.audio_config.whisper_encoder_config
    with pytest.raises(ValueError, match="n_ctx"):
        encoder(torch.zeros(1, 2 * w.n_ctx + 2, w.n_mels))


@torch.no_grad()
def test_bf16_close_to_fp32(fixture_root, model, case):
    """bf16 weights and inputs give audio embeddings within 2e-2 relative L2 error of fp32."""
    _, encoder, projector = model
    _, encoder16, projector16 = _build(fixture_root, torch.bfloat16)
    ref = encode_wrapped(encoder, projector, case["twoclip_mel"], case["twoclip_mel_lengths"]).embeds
    out = encode_wrapped(encoder16, projector16, case["twoclip_mel"].bfloat16(), case["twoclip_mel_lengths"]).embeds
    assert out.dtype == torch.bfloat16
    rel = (out.float() - ref).norm() / ref.norm()
    assert rel < 2e-2


@torch.no_grad()
@pytest.mark.parametrize("frames", [1, 2, 37, 100, 101, "case"])
def test_masked_padded_encoding_equals_exact_length(model, case, frames):
    """`encoder(mel, mel_lengths)` on a clip zero-padded to the longest mel (2·n_ctx frames) (the CUDA-graph path) gives the clip's
    exact-length encoder output and audio embeddings, even and odd lengths, garbage in the padding too."""
    cfg, encoder, projector = model
    width = 2 * cfg.audio_config.whisper_encoder_config.n_ctx  # the longest mel the encoder takes
    frames = min(int(case["mel_lengths"][0, 0]) if frames == "case" else frames, width)
    mel = case["mel"][:, :frames] if frames <= case["mel"].shape[1] else torch.randn(1, frames, case["mel"].shape[2])
    padded = torch.randn(1, width, mel.shape[2])  # the mask, not zeros in the padding, must make it exact
    padded[:, :frames] = mel
    enc_len, tokens = int(encoder_output_lengths(frames)), int(audio_token_lengths(frames, cfg.audio_config))
    out = encoder(padded, torch.tensor([frames]))
    exact = encoder(mel)
    torch.testing.assert_close(out[:, :enc_len], exact, **HIDDEN_TOL)
    assert torch.equal(out[:, enc_len:], torch.zeros_like(out[:, enc_len:]))
    torch.testing.assert_close(projector(out)[:, :tokens], projector(exact), **EMBED_TOL)


@torch.no_grad()
def test_audio_graphs_eager_path_equals_encoder(fixture_root, model, case):
    """AudioEncoderGraphs on CPU (eager) returns the exact-length embeddings for a mel [T, n_mels]."""
    from realtime_ming.engine.audio_graphs import AudioEncoderGraphs

    cfg, encoder, projector = model
    bucket = 2 * cfg.audio_config.whisper_encoder_config.n_ctx
    graphs = AudioEncoderGraphs(encoder, projector, cfg.audio_config, (bucket,), dtype=torch.float32, device="cpu",
                                out_device="cpu")
    assert not graphs.graphed
    got = graphs(case["mel"][0])
    torch.testing.assert_close(got, projector(encoder(case["mel"]))[0], **EMBED_TOL)
