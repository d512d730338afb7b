"""RNNoise input denoiser (the pyrnnoise wheel's native library, loaded with ctypes)."""

from __future__ import annotations

import numpy as np
import pytest
from server_support import espeak

from realtime_ming.audio.denoise import (
    DenoiserUnavailable,
    RnnoiseDenoiser,
    rnnoise_library_path,
)

try:
    rnnoise_library_path()
except DenoiserUnavailable:
    pytest.skip("RNNoise not installed (pip install --no-deps pyrnnoise)", allow_module_level=True)

MODEL_HZ = 16000


def _run(denoiser: RnnoiseDenoiser, x: np.ndarray, chunk: int) -> np.ndarray:
    return np.concatenate([denoiser.process(x[i: i + chunk]) for i in range(0, x.size, chunk)] + [denoiser.flush()])


def test_denoiser_keeps_the_sample_count_and_removes_stationary_noise(tmp_path):
    """Chunked streaming returns exactly as many samples as it got; white noise at −30 dBFS drops by
    more than 20 dB while the speech keeps most of its energy."""
    speech = espeak("Can you tell me a quick fact about the moon?", tmp_path, rate_hz=MODEL_HZ)
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 10 ** (-30 / 20), speech.size + 2 * MODEL_HZ).astype(np.float32)
    noisy = noise.copy()
    noisy[MODEL_HZ: MODEL_HZ + speech.size] += speech
    out = _run(RnnoiseDenoiser(), noisy, 320)
    assert out.shape == noisy.shape and out.dtype == np.float32
    quiet = slice(MODEL_HZ // 2, MODEL_HZ - 1600)  # noise only, after RNNoise has adapted
    assert 20 * np.log10(noisy[quiet].std() / out[quiet].std()) > 20
    talk = slice(MODEL_HZ, MODEL_HZ + speech.size)
    assert out[talk].std() > 0.5 * speech.std()


def test_denoiser_output_does_not_depend_on_chunking(tmp_path):
    """20 ms appends and odd-sized appends give the same audio."""
    speech = espeak("Hello there.", tmp_path, rate_hz=MODEL_HZ)
    a = _run(RnnoiseDenoiser(), speech, 320)
    b = _run(RnnoiseDenoiser(), speech, 777)
    np.testing.assert_allclose(a, b, atol=1e-5)
