"""Resamplers: soxr streaming equals one-shot; the torchaudio-compatible resampler equals the reference."""

from __future__ import annotations

import re
import numpy as np
import pytest
import torch

from realtime_ming.audio.resample import (
    StreamResampler,
    resample,
    resample_torchaudio_compatible,
    resampled_length,
)

RATE_PAIRS = [(44100, 24000), (24000, 16000), (8000, 16000)]


def _stream_in_random_chunks(resampler: StreamResampler, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    outs, pos = [], 0
    while pos < x.size:
        n = int(rng.integers(1, 1500))
        outs.append(resampler.process(x[pos : pos + n]))
        pos += n
    outs.append(resampler.flush())
    return np.concatenate(outs)


@pytest.mark.parametrize(("src_hz", "dst_hz"), RATE_PAIRS)
def test_stream_resampler_random_chunks_equal_one_shot(src_hz, dst_hz):
    """Random-size chunks plus flush give the one-shot output (|diff| ≤ 1e-6) and round(n·dst/src) samples."""
    rng = np.random.default_rng(src_hz + dst_hz)
    num_samples = src_hz + 12345  # not a multiple of either rate
    t = np.arange(num_samples) / src_hz
    x = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(num_samples)).astype(np.float32)
    one_shot = resample(x, src_hz, dst_hz)
    streamed = _stream_in_random_chunks(StreamResampler(src_hz, dst_hz), x, rng)
    expected_len = resampled_length(num_samples, src_hz, dst_hz)
    assert expected_len == int(np.floor(num_samples * dst_hz / src_hz + 0.5))
    assert one_shot.shape == (expected_len,) and streamed.shape == (expected_len,)
    assert streamed.dtype == np.float32
    assert np.max(np.abs(streamed - one_shot)) <= 1e-6


def test_stream_resampler_reusable_after_flush():
    """After flush the resampler starts a fresh stream: a second pass gives the same output."""
    x = np.sin(np.arange(4000) * 0.05).astype(np.float32)
    resampler = StreamResampler(24000, 16000)
    first = np.concatenate([resampler.process(x), resampler.flush()])
    second = np.concatenate([resampler.process(x), resampler.flush()])
    assert first.shape == (resampled_length(4000, 24000, 16000),)
    assert np.array_equal(first, second)


def test_stream_resampler_same_rate_passthrough():
    """Equal rates pass samples through unchanged and flush nothing."""
    x = np.arange(10, dtype=np.float32)
    resampler = StreamResampler(16000, 16000)
    assert np.array_equal(resampler.process(x), x)
    assert resampler.flush().shape == (0,)


ENCODER_RATE_HZ = 16000  # the audio frontend's rate: the target of the case's Resample
STANDARD_RATES_HZ = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 88200, 96000)


def _fixture_source_rate(n_in: int, n_out: int, note: str) -> int:
    """The case's source rate: the standard rate whose Resample(src, 16 kHz) output length ceil(n·16000/src)
    is the recorded one (the case's tensors), cross-checked with the Resample(src, 16000) its note names."""
    fits = [r for r in STANDARD_RATES_HZ if -(-n_in * ENCODER_RATE_HZ // r) == n_out]
    named = [int(r) for r in re.findall(r"Resample\((\d+),\s*" + str(ENCODER_RATE_HZ) + r"\)", note)]
    if named:
        fits = [r for r in fits if r in named] or named
    assert len(fits) == 1, f"cannot tell the resample source rate from {n_in} -> {n_out} samples ({fits})"
    return fits[0]


def test_fixture_resample_torchaudio_compatible(load_case):
    """int16 / 32768 at the case's source rate → 16 kHz equals the reference torchaudio Resample output
    (rtol 1e-4, atol 1e-5), with ceil(n·16000/src) samples."""
    tensors, meta = load_case("audio_frontend_and_encoder")
    wave = tensors["resample_input_int16"].to(torch.float32) / 32768.0
    expected = tensors["resample_output_16k"]
    n_in = wave.shape[-1]
    src_hz = _fixture_source_rate(n_in, expected.shape[-1], meta.get("resample_note", ""))
    out = resample_torchaudio_compatible(wave, src_hz, ENCODER_RATE_HZ)
    assert out.shape == expected.shape == (-(-n_in * ENCODER_RATE_HZ // src_hz),)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_fixture_source_rate_is_derived_not_assumed():
    """The derivation picks each standard rate back from its own output length (not one fixed rate)."""
    for src in (8000, 22050, 24000, 44100, 48000):
        n_in = 3 * src // 2 + 7
        assert _fixture_source_rate(n_in, -(-n_in * ENCODER_RATE_HZ // src), "") == src


def test_resample_torchaudio_compatible_batched_and_length():
    """Leading dims are kept and the length is ceil(n·dst/src), 44.1 → 16 kHz."""
    wave = torch.randn(2, 3, 4411, generator=torch.Generator().manual_seed(0))
    out = resample_torchaudio_compatible(wave, 44100, 16000)
    assert out.shape == (2, 3, -(-4411 * 160 // 441))
    torch.testing.assert_close(out[1, 2], resample_torchaudio_compatible(wave[1, 2], 44100, 16000))


@pytest.mark.parametrize("quality", ["HQ", "LQ"])
def test_stream_resampler_quality_stream_equals_one_shot_and_lag(quality):
    """Each quality streams to its own one-shot result; the low-latency one (the microphone path) lags 24 kHz
    input by under 20 ms, HQ by over 30 (an impulse: how much 16 kHz output exists after 220 ms of input)."""
    rng = np.random.default_rng(7)
    x = (0.1 * rng.standard_normal(24000)).astype(np.float32)
    streamed = _stream_in_random_chunks(StreamResampler(24000, 16000, quality), x, rng)
    assert np.max(np.abs(streamed - resample(x, 24000, 16000, quality))) <= 1e-6
    resampler = StreamResampler(24000, 16000, quality)
    emitted = sum(resampler.process(np.zeros(480, dtype=np.float32)).size for _ in range(11))  # 220 ms
    lag_ms = 220 - emitted / 16
    assert (lag_ms < 20) if quality == "LQ" else (lag_ms > 30)
