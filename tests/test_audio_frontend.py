"""Model-input frontends: Whisper log-mel (thinker audio) and Kaldi fbank (CAMPPlus) against the reference."""

from __future__ import annotations

import pytest
import soundfile as sf
import torch

from realtime_ming.audio.fbank import FBANK_SAMPLE_RATE_HZ, kaldi_fbank, speaker_fbank
from realtime_ming.audio.mel import (
    MEL_NUM_BINS,
    log_mel_spectrogram,
    num_audio_tokens,
    num_mel_frames,
    slaney_mel_filterbank,
    wrap_clips,
)
from realtime_ming.audio.resample import resample_torchaudio_compatible


def test_fixture_mel_single_clip(load_case):
    """16 kHz waveform → log-mel equals the reference WhisperFrontend output (rtol 1e-4, atol 1e-4)."""
    tensors, _ = load_case("audio_frontend_and_encoder")
    wave = tensors["waveform"]
    mel = log_mel_spectrogram(wave)
    assert mel.shape == (num_mel_frames(wave.shape[0]), MEL_NUM_BINS)
    assert [[mel.shape[0]]] == tensors["mel_lengths"].tolist()
    torch.testing.assert_close(mel[None], tensors["mel"], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fixture_mel_on_the_gpu(load_case):
    """Computed where the encoder runs (serving): a host waveform goes up, the GPU's mel equals the reference."""
    tensors, _ = load_case("audio_frontend_and_encoder")
    mel = log_mel_spectrogram(tensors["waveform"].numpy(), device="cuda")
    assert mel.is_cuda
    torch.testing.assert_close(mel[None].cpu(), tensors["mel"], rtol=1e-4, atol=1e-4)


def test_fixture_mel_two_clips_wrapped(load_case):
    """Two clips, each normalised on its own, wrapped along time with their lengths, equal the reference."""
    tensors, _ = load_case("audio_frontend_and_encoder")
    filters = torch.from_numpy(slaney_mel_filterbank())
    clips = [log_mel_spectrogram(tensors["waveform"], filters), log_mel_spectrogram(tensors["twoclip_waveform_b"], filters)]
    feats, lengths = wrap_clips(clips)
    assert torch.equal(lengths, tensors["twoclip_mel_lengths"])
    torch.testing.assert_close(feats, tensors["twoclip_mel"], rtol=1e-4, atol=1e-4)


def test_fixture_audio_token_counts(load_case):
    """The mel → encoder-token formula gives the reference's per-clip audio token counts."""
    tensors, _ = load_case("audio_frontend_and_encoder")
    assert [[num_audio_tokens(t) for t in row] for row in tensors["mel_lengths"].tolist()] == tensors[
        "encoder_feats_lengths"
    ].tolist()
    assert [[num_audio_tokens(t) for t in row] for row in tensors["twoclip_mel_lengths"].tolist()] == tensors[
        "twoclip_audio_embeds_lengths"
    ].tolist()


def test_slaney_filterbank_shape_and_area():
    """128 Slaney filters over 201 bins: non-negative, none empty, zero weight at the 8 kHz bin."""
    filters = slaney_mel_filterbank()
    assert filters.shape == (128, 201)
    assert (filters >= 0).all() and (filters.max(axis=1) > 0).all()
    assert filters[:, -1].max() == 0.0  # the 8 kHz bin is the upper edge of the last triangle


def test_fixture_campplus_fbank(load_case, fixture_root):
    """Prompt wav → torchaudio-compatible 16 kHz → fbank − mean equals the reference CAMPPlus input.

    Tolerance: atol 1e-4 on bins within 4 nats of their frame's strongest bin, 5e-3 elsewhere — the
    weak bins carry the reference's float32 FFT noise (a float64 evaluation of the same definition
    differs from the fixture by 2.9e-3 there, and from this float32 code by 3e-4).
    """
    tensors, meta = load_case("talker_loop")
    wav, sr = sf.read(fixture_root / meta["voice"]["wav"], dtype="float32")
    wave_16k = resample_torchaudio_compatible(torch.from_numpy(wav), sr, FBANK_SAMPLE_RATE_HZ)
    expected = tensors["campplus_input_fbank"]
    feats = speaker_fbank(wave_16k)
    assert feats.shape == expected.shape
    log_energy = kaldi_fbank(wave_16k)
    strong = (log_energy - log_energy.max(dim=1, keepdim=True).values) >= -4.0
    diff = (feats[0] - expected[0]).abs()
    assert diff[strong].max() <= 1e-4
    assert diff.max() <= 5e-3


def test_kaldi_fbank_frame_count_snip_edges():
    """snip_edges framing: 1 + (n − 400) // 160 frames, none for inputs shorter than 25 ms."""
    assert kaldi_fbank(torch.zeros(399)).shape == (0, 80)
    assert kaldi_fbank(torch.ones(400)).shape == (1, 80)
    assert kaldi_fbank(torch.randn(16000)).shape == (1 + (16000 - 400) // 160, 80)
