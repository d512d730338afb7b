"""Resamplers: soxr streaming equals one-shot; the torchaudio-compatible resampler equals the reference."""

from __future__ import annotations

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


def test_fixture_resample_torchaudio_compatible(load_case):
    """24 kHz int16 / 32768 → 16 kHz equals the reference torchaudio Resample output (rtol 1e-4, atol 1e-5)."""
    tensors, _ = load_case("audio_frontend_and_encoder")
    wave = tensors["resample_input_int16"].to(torch.float32) / 32768.0
    expected = tensors["resample_output_16k"]
    out = resample_torchaudio_compatible(wave, 24000, 16000)
    assert out.shape == expected.shape == (-(-wave.shape[-1] * 2 // 3),)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


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
